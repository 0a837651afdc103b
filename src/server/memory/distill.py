"""Distilling durable facts and preferences from a user's message.

Embedded default (no model): rules, English and Chinese. A sentence of a *user* message is kept
when it states something about the user or their systems ("my ... is", "our ... are", "the prod DB
host is db-prod-42", "I prefer", "call me", "我叫", "我的…是", "我们的…在", "记住") -- a fact -- or
asks for a lasting way of answering ("answer in Chinese", "always reply briefly", "以后用中文回答",
"请用英文回复") -- a preference. Questions are never kept, nor is anything naming or holding a secret
("password", "pwd", "PIN", "SSN", "密钥", "身份证", "银行卡", "sk-...", a long random token, a card or ID
number); neither
are conditionals, hedges ("I'm not sure ...", "Maybe ...", "可能…"), requests to check something
("Make sure the port is 5432", "帮我查一下…") or what someone else said ("Bob said ...", "他说…") as
facts. Words that only lead into a sentence ("Actually,", "Correction:", "FYI", "其实", "更正：",
"remember that") are left out of the item and of its subject, so "Correction: the prod DB host is
db-prod-43" is kept as "The prod DB host is db-prod-43" and replaces "... is db-prod-42", as do "The
prod DB host changed to db-prod-43" and "Our prod DB host is db-prod-43" (the user's possessives
are not part of a subject either; "生产数据库改成上海了" replaces "我们的生产数据库在杭州"). With a
summary model configured, ``server.memory.distill_model`` asks it for the same kind of list and
keeps only what these rules take as stated (``unstated``).

A sentence that takes something back is never kept either (``takes_back``): a request to forget
("Please forget that my home address is ...", "Don't remember that ...", "别记住…", "忘掉…") and a
statement that a value no longer holds ("The prod DB host is not db-prod-41 anymore", "… is no
longer …", "数据库不在杭州了", "日志服务器不是 log-1 了": a Latin value may stand between spaces);
``retracts`` says which stored items such a sentence names. A correction in one sentence ("... is not
db-prod-41 anymore, it is db-prod-43", "日志服务器不是 log-1 了，换成 log-2 了") is a fact about what the
old statement is about (``_correction``), so it replaces it. A Chinese change of any noun to an
identifier is kept ("跳板机换成 jump-2 了", ``_zh_noun_change``), and a fact of several statements about
different things is kept as those statements ("生产数据库是 db-prod-1，备份在杭州机房", ``_statements``).
"""
from __future__ import annotations

import logging
import re
from typing import Callable

from server.memory.analyze import SYNONYMS
from server.memory.extractive import is_fact, sentences
from server.memory.sensitive import mentions_secret

log = logging.getLogger("nplt.memory")

MAX_ITEM_CHARS = 240
MAX_ITEMS_PER_MESSAGE = 8
#: a longer sentence is no durable statement and is not classified (a pasted log line, 16,000
#: characters of "记住记住…": the rules' time must stay linear in the message)
MAX_STATEMENT_CHARS = 600
#: lead-ins ("Actually, remember that FYI ...") taken off one sentence at most
MAX_LEAD_INS = 4
_WORD = re.compile(r"\w")

PREFERENCE = [re.compile(p, re.IGNORECASE) for p in (
    r"\b(?:answer|reply|respond|write|talk|speak)\s+(?:to me\s+)?(?:only\s+)?in\s+[A-Za-z]+",
    r"\b(?:always|never|from now on|in future|going forward)\b.{0,60}\b(?:answer|reply|respond|use|show|"
    r"give|write|include|call)\b",
    r"\bI\s+(?:prefer|like|want)\b.{0,40}\b(?:answers?|replies|responses|output|format|language)\b",
    r"(?:以后|今后|总是|始终|永远|一律|请用|请使用|用中文|用英文|用英语).{0,20}(?:回答|回复|答复|交流|说|写)",
    r"(?:不要|别).{0,20}(?:回答|回复|使用|用)",
)]
_SYSTEM_FACT = re.compile(
    r"\b(?:host|hostname|server|database|db|cluster|ip|endpoint|url|port|path|region|account|bucket|"
    r"namespace|password|user ?name|version|timezone|time zone|email|team|project)\b[\w .'/-]{0,40}?"
    r"(?:\s+(?:is|are|lives at|runs on)\s+|\s*=\s*|\s*:\s+)\S+", re.IGNORECASE)
#: a question, or a request to be told something, is never kept (nor is any sentence with one of these)
_QUESTION = [re.compile(p, re.IGNORECASE) for p in (
    r"[?？]\s*$",
    r"^(?:what|which|who|whose|where|when|why|how|is|are|was|were|do|does|did|can|could|would|should)\b",
    r"^(?:please\s+|pls\s+)?(?:(?:can|could|would|will)\s+you\s+)?(?:tell|show|remind)\s+me\b",   # "tell me what ..."
    r"\b(?:let me know|do you (?:know|remember)|I\s+(?:am\s+|was\s+)?wonder(?:ing)?|I'm\s+wondering|"
    r"(?:I\s+(?:want|need|would like)|I'd like)\s+to\s+know|(?:not sure|don't know|do not know)\s+(?:whether|if))\b",
    r"哪(?!怕)|谁|啥|什么|多少|(?<![好十])几(?:个|台|号|点|天|次|年|月|位|种|条|岁|分钟|小时|周)|是否|"
    r"有没有|是不是|能不能|会不会|要不要|对不对|可不可以|好不好|行不行|"
    r"([\u4e00-\u9fff])[不没]\1",                      # 哪个, 在哪个机房; 在不在, 改没改
    r"(?:吗|呢|怎么|如何|怎样|怎么样|为什么|为何)[。？?！!]?\s*$",
)]
#: question words that mean "any" or "and so on" in a statement, left out before looking for a
#: question: "不管什么问题都用中文回答" (whatever the question), "谁都可以", "MySQL、Redis什么的"
_ZH_INDEFINITE = re.compile(r"(?:不管|无论|不论)[^，,。]{0,8}?(?:什么|谁|哪|多少)|(?:什么|谁|哪儿|哪里)(?:都|也)|没什么|什么的")
#: a hypothesis states nothing ("If my DB host is db-9, what port should I use"): never a fact; a
#: conditional preference is kept but corrects nothing ("If I write in English, answer in English")
_CONDITIONAL = re.compile(r"^\s*(?:if|unless|suppose|supposing|assuming|assume|in case|provided|imagine|pretend|"
                          r"hypothetically|let['’]?s\s+(?:say|assume|suppose|pretend)|let\s+us\s+(?:say|assume|suppose)|"
                          r"如果|假如|假设|假定|要是|若|万一|倘若|比如说|比方说|就当)(?![A-Za-z])", re.IGNORECASE)
#: a sentence that is not the user stating something as true is never a fact (a preference in it is
#: still kept: "I think we should answer in Chinese"): a hedge ("I'm not sure ...", "I don't think
#: ...", "Maybe ...", "I think ...", "可能", "大概", "好像", "我不确定"), a request to check or do
#: something ("Check whether ...", "Make sure the port is 5432", "帮我查一下…") or what someone else
#: said ("Bob said ...", "According to ...", "他说…", "听说…"; "As I said, ..." is the user's own)
_NOT_STATED = [re.compile(p, re.IGNORECASE) for p in (
    # hedges
    r"\b(?:not\s+(?:sure|certain|positive)|unsure|uncertain|no idea)\b",
    r"\b(?:I|we)\s+(?:don['’]?t|do not|didn['’]?t|did not)\s+(?:think|believe|know|remember|recall|guess|suppose)\b",
    r"\b(?:I|we)\s+(?:think|believe|guess|suppose|assume|reckon|suspect|doubt|presume|figure)\b",
    r"\b(?:I['’]m|I am|we['’]re|we are)\s+(?:guessing|assuming|thinking|not sure)\b",
    r"\b(?:maybe|perhaps|possibly|probably|presumably|apparently|supposedly|allegedly|likely|unlikely|might|"
    r"iirc|afaik|afaict)\b",
    r"\b(?:may|could|would|should)\s+(?:be|have)\b|\bif\s+I\s+(?:remember|recall)\b",
    r"可能|大概|好像|也许|或许|似乎|估计|貌似|说不定|没准|不一定|不确定|不太确定|不清楚|不知道|不记得|记不清|"
    r"我觉得|我猜|我认为|印象中|应该(?:是|在)",
    # requests to check or do something
    r"^(?:please\s+|pls\s+|kindly\s+)?(?:(?:can|could|would|will)\s+you\s+)?(?:check|verify|confirm|make sure|"
    r"ensure|find out|see|validate|double[- ]check|look up|figure out|determine|investigate|ask)\b",
    r"^let(?:['’]s|\s+us)\b",
    r"\b(?:check|verify|confirm|make sure|find out|see|test|ask)\s+(?:whether|if)\b",
    r"\b(?:can|could|would|will)\s+you\s+(?:please\s+)?(?:check|verify|confirm|double[- ]check|look into|find out)\b",
    r"^(?:查一下|查一查|查查|查下|检查一下|确认一下|核实一下|核对一下|看一下|看看|验证一下|测试一下|问一下|问问)|"
    r"^(?:请|麻烦你?|帮我|帮忙)+(?:查|检查|确认|核实|核对|看|验证|测试|问)|(?:帮我|帮忙|麻烦你?)(?:查|看|确认|检查|核实|核对|验证|问)",
    # what someone else said
    r"(?<!\bI )(?<!\bwe )\b(?:said|say|says|mentioned|mentions|claims|claimed|thinks|believes|reckons)\b",
    r"\b(?:told|tells)\s+(?:me|us)\b|\b(?:was|were)\s+told\b|\bI\s+heard\b|\baccording to\b|\brumou?r",
    r"听说|据说|据悉|传言|(?<![其跟和给对向])(?:他|她|它|人家|别人|有人|大家|同事|老板|领导|经理|客户|对方|你)们?"
    r"(?:刚才|刚刚|之前|以前|昨天|今天|也|还|都)?(?:说|讲|提到|告诉我|跟我说|和我说)",
    r"^(?!老实|坦白|简单|一般|总的|换句|也就|比如|比方|所以|就是|照理|按理|实话|听我|跟你|和你|我)"      # 老王说, 张经理说
    r"[\u4e00-\u9fff]{1,3}?(?<!小)(?:说|讲|告诉我)(?![明法书话])",
)]



#: the words that only ask to keep what follows: dropped from the kept item when what follows is a
#: statement (``_kept_statement``: "Remember that the staging server is stage-7" keeps "The staging
#: server is stage-7", "remember that bob's printer is on floor 3" keeps "Bob's printer is on floor
#: 3", "请记住：鲍勃的打印机在三楼" keeps "鲍勃的打印机在三楼"; "Remember to check the disk" and
#: "记住检查磁盘" are requests, kept whole)
_LEAD_IN = re.compile(r"^\s*(?:(?:please|pls)\s+)?(?:remember|don['’]t forget|do not forget|note|keep in mind|"
                      r"for future reference)\b(?P<that>\s+that\b)?[\s,:：-]*|"
                      r"^\s*(?:请|麻烦你?|你)?(?:帮我|给我)?(?:记住|记一下|记下来|记下|请记)[，,:：\s]*",
                      re.IGNORECASE)
#: what follows a request to keep something is a statement (not a request: "to check the disk",
#: "检查磁盘") when it opens with a subject of at most ``_KEPT_SUBJECT_WORDS`` words and a verb
#: ("bob's printer is ...", "the build machine has ...") or a pronoun ("I live in Berlin", "我女儿今年五岁"),
#: or in Chinese is "<subject>是/在<value>" ("鲍勃的打印机在三楼")
_KEPT_SUBJECT_WORDS = 5
_EN_STATES = re.compile(r"^(?!to\b|not\s+to\b)(?:(?:[\w'’./-]+\s+){1,%d}(?:is|are|was|were|isn['’]t|aren['’]t|"
                        r"wasn['’]t|weren['’]t|has|have|had|will|won['’]t)\b|(?:I|we|he|she|they)\s+\w)"
                        % _KEPT_SUBJECT_WORDS, re.IGNORECASE)
_ZH_STATES = re.compile(r"^(?:我们|咱们|他们|她们|我|他|她)\S")


#: the words a sentence may open with that only lead into what it says: dropped from the kept item
#: and from its subject ("Actually, the prod DB host is db-prod-42" keeps "The prod DB host is
#: db-prod-42", which corrects "The prod DB host is db-prod-41"). Words that never start a statement
#: themselves, with or without a comma after them ...
_MARKER_WORDS = ("actually", "fyi", "btw", "by the way", "oh and", "oh", "and", "but", "also", "anyway", "in fact",
                 "as i said", "like i said", "as i mentioned",
                 "just so you know", "to be clear", "i mean", "i meant", "my bad", "my mistake", "oops",
                 "其实", "对了", "哦对了", "顺便说一下", "顺便说一句", "纠正一下", "更正一下", "补充一下")
#: ... and labels, only before a colon, comma or dash ("Update: the ...", not "Update the config";
#: "Sorry, the ...", not "Sorry for the delay"; "另外，…", not "另外一台…")
_MARKER_LABELS = ("correction", "update", "edit", "fix", "ps", "no", "ok", "okay", "well", "wait", "sorry",
                  "sorry for the confusion", "sorry about that", "更正", "更新", "纠正", "补充", "不对", "另外")


def _alternatives(words) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))   # the longest first


_MARKER = re.compile(rf"^\s*(?:(?:{_alternatives(_MARKER_WORDS)})(?![A-Za-z])[\s,，:：;；!！-]*|"
                     rf"(?:{_alternatives(_MARKER_LABELS)})\s*[,，:：;；!！—–-]+\s*)", re.IGNORECASE)

#: "<subject> is <one value>": a statement that a later one about the same subject corrects
#: ("The prod DB host is db-prod-41" -> "... is db-prod-42 now", "... is now db-prod-42"). One word of
#: value only: "My son is 5" and "My son is a doctor" are two facts, not a correction.
_SUBJECT = r"(?P<subject>\w(?:(?!\s(?:is|are)\s)[\w .'/-]){0,60}?)"       # (never across an "is": "A is 1 and B is 2")
_SUBJECT_VALUE = re.compile(rf"^\s*{_SUBJECT}(?:\s*[=:]|\s+(?:is|are|lives at|runs on))\s+"
                            r"(?:(?:now|currently|nowadays)\s+)?"
                            r"(?P<value>[^\s,;]+?)(?:,?\s+(?:now|currently|nowadays|these days|from now on|today|again))?"
                            r"(?:,?\s+(?:and\s+)?(?:not|no longer|instead of|rather than)\s+[^\s,;]+?(?:\s+any\s?more)?)?"
                            r"(?:,?\s+(?:since|as of|starting|effective|following|because|due to)\b.*?)?"   # "... since Monday"
                            r"\s*[.!。！]?\s*$", re.IGNORECASE)
#: a parenthetical is no part of what a statement is about ("is now db-prod-42 (moved last week)")
_PARENTHETICAL = re.compile(r"\s*[(（][^()（）]{0,120}[)）]")
#: a change: "<subject> changed/moved/was switched to <value> ...", "(We|I) moved <subject> to <value>
#: ...": about what "<subject> is <value>" is about, whatever follows the value ("yesterday").
#: Past tense only: "Move the prod DB to db-2" asks for something
_CHANGE_VERB = r"(?:changed|moved|switched|migrated|updated|renamed|relocated|upgraded|repointed|pointed)"
_CHANGE_TO = r"\s+(?:from\s+\S+\s+)?(?:over\s+|back\s+)?(?:to|into)\s+(?P<value>[^\s,;]+)"
_CHANGED = re.compile(rf"^\s*(?P<subject>[\w][\w .'/-]{{0,60}}?)\s+(?:(?:has|have|was|were|got)\s+)?(?:been\s+)?"
                      rf"{_CHANGE_VERB}{_CHANGE_TO}", re.IGNORECASE)
_CHANGED_BY = re.compile(rf"^\s*(?:(?:we|I|they)(?:['’]ve|\s+have)?\s+)?(?:(?:just|already|finally|recently|also)\s+)*"
                         rf"{_CHANGE_VERB}\s+(?P<subject>[\w][\w .'/-]{{0,60}}?){_CHANGE_TO}", re.IGNORECASE)
_EN_PRONOUNS = frozenset(("i", "we", "you", "they", "he", "she", "it", "this", "that", "everything", "everyone"))
#: the same in Chinese, "<subject>是/在<value>". A 是 or 在 inside another word is not the verb
#: (但是, 总是, 不是, 也是; 现在, 正在, 存在, 不在), so "我的常用编辑器是vim" is about "我的常用编辑器";
#: ", not ..." after the value ("，不是杭州") is left out
_ZH_SUBJECT_VALUE = re.compile(r"^\s*(?P<subject>[^，,。；;\s]{1,24}?)"
                               r"(?P<verb>(?<![但还总就可于要若只凡或不也都])是|(?<![现正存所实好不])在)\s*"
                               r"(?P<value>[^，,。！!\s]+)(?:\s*[，,]\s*(?:而)?(?:不是|不在|而非)[^，,。！!\s]+)?\s*[。.!！]?\s*$")
#: a change in Chinese, "<subject>改成/换成/迁到/搬到<value>了", "<subject>已经迁到<value>",
#: "我们把<subject>迁到<value>了"; without 了 or 已经/现在 it asks for the change ("把数据库迁到上海"). A
#: move (迁, 搬, 移, 挪) is about where the subject is (在); "改成/换成/切换到 <value>" too when the
#: value is Chinese words (a place: "改成上海"), unless the subject is a name or a title; else what
#: it is (是: "换成PostgreSQL")
_ZH_MOVE_VERBS = ("迁移到", "迁移至", "迁到", "迁至", "迁往", "搬迁到", "搬到", "搬至", "搬去", "移到", "挪到", "转移到")
_ZH_CHANGE_VERBS = ("改成", "改为", "改到", "换成", "换为", "换到", "变成", "变为", "更新为", "更新成", "调整为", "调整成",
                    "切换到", "切换成", "切到", "升级到", "升级为")
_ZH_CHANGED = re.compile(r"^\s*(?:(?:我们|咱们|我|他们)?把)?(?P<subject>[^，,。；;\s]{1,24}?)(?:从[^，,。；;\s]{1,16}?)?"
                         rf"(?P<verb>{_alternatives(_ZH_MOVE_VERBS + _ZH_CHANGE_VERBS)})(?P<done>了)?\s*(?P<value>[^，,。！!\s]+?)"
                         r"(?:\s*(?P<end>了))?\s*[。.!！]?\s*$")     # (a Latin value between spaces: "换成 log-2 了")
_ZH_NAMED = re.compile(r"(?:名|名字|名称|姓名|称呼|昵称|职位|职务|岗位|职称|头衔|角色)$")
#: what a Chinese change is about when it is a system setting ("生产数据库改成上海了")
_ZH_SYSTEM = re.compile(r"数据库|服务器|主机|集群|机房|端口|地址|域名|节点|实例|环境|区域|地域|账号|用户名|版本|路径|目录|"
                        r"存储|网关|缓存|队列|时区|邮箱|团队|项目|仓库|分支|编辑器")
_CJK_ONLY = re.compile(r"^[\u4e00-\u9fff]+$")
#: "now" before the verb: "我们的数据库现在在上海" is about what "我们的数据库在杭州" is about
_ZH_NOW = re.compile(r"(?:现在|目前|如今|已经|现已|已)+$")
#: a pronoun alone is not a subject: "我是张三" and "我是后端工程师" are two facts ("I am ..." has no key)
_ZH_PRONOUNS = frozenset(("我", "我们", "咱们", "你", "你们", "他", "她", "它", "他们", "她们", "这", "那", "这个", "那个"))
_CALL_ME = re.compile(r"^\s*(?:please\s+)?call me\s+\S+\s*[.!]?\s*$|^\s*(?:请)?(?:叫我|我叫)\S+?[。！!]?\s*$",
                      re.IGNORECASE)
#: left out of a subject: articles and the user's own possessives ("Our CI runner host" is what "the
#: CI runner host" is; "我们的生产数据库" is "生产数据库"); "your" stays ("your name" is not "my name")
_LEADING_ARTICLE = re.compile(r"^(?:(?:the|a|an|my|our)\s+)+", re.IGNORECASE)
_ZH_POSSESSIVE = re.compile(r"^(?:我们的|咱们的|我的|我们|咱们)")

#: the languages answers can be asked in, by the names users give them ("answer in short sentences"
#: asks for no language)
LANGUAGES = {
    "chinese": ("chinese", "mandarin", "中文", "汉语", "普通话"), "cantonese": ("cantonese", "粤语"),
    "english": ("english", "英文", "英语"), "japanese": ("japanese", "日语", "日文"), "korean": ("korean", "韩语", "韩文"),
    "french": ("french", "法语", "法文"), "german": ("german", "德语", "德文"), "spanish": ("spanish", "西班牙语"),
    "russian": ("russian", "俄语", "俄文"), "portuguese": ("portuguese", "葡萄牙语"), "italian": ("italian", "意大利语"),
    "arabic": ("arabic", "阿拉伯语"), "vietnamese": ("vietnamese", "越南语"), "dutch": ("dutch",), "hindi": ("hindi",),
}
LANGUAGE_OF = {name: language for language, names in LANGUAGES.items() for name in names}
#: the words that switch the answers to a language: "用/使用英文", and "(把回答)改成/换成/改用/改为/切换到英文"
_ZH_SWITCH_TO = ("用", "使用", "改成", "换成", "改用", "换用", "改为", "换为", "切换成", "切换到", "切换为", "切成", "切到")
_EN_ANSWERS = r"(?:(?:the|your|all|my)\s+)*(?:answers?|replies|reply|responses?|output|(?:answer\s+|reply\s+)?language)"
_ANSWER_LANGUAGE = re.compile(
    r"\b(?:answer|reply|respond|write|talk|speak)\s+(?:(?:to\s+)?me\s+)?(?:only\s+)?in\s+(?P<name>[A-Za-z]+)|"
    rf"\b(?:switch|change|set|turn)\s+{_EN_ANSWERS}(?:\s+(?:back|over))?\s+(?:to|into)\s+(?P<switched>[A-Za-z]+)|"
    rf"(?:{_alternatives(_ZH_SWITCH_TO)})(?P<zh>{_alternatives(n for n in LANGUAGE_OF if not n.isascii())})", re.IGNORECASE)


#: switching the answers to a language is a preference too: "把回答改成英文", "回复换成中文",
#: "switch the answers to English", "change your replies to Chinese" (not "把这段话改成英文": a translation)
_ZH_LANGUAGE_NAMES = _alternatives(n for n in LANGUAGE_OF if not n.isascii())
PREFERENCE.append(re.compile(
    rf"(?:回答|回复|答复|输出|语言)[^，,。！？!?\s]{{0,6}}?(?:{_alternatives(_ZH_SWITCH_TO[2:])})(?:用)?(?:{_ZH_LANGUAGE_NAMES})|"
    rf"\b(?:switch|change|set|turn)\s+{_EN_ANSWERS}(?:\s+(?:back|over))?\s+(?:to|into)\s+"
    rf"(?:{_alternatives(n for n in LANGUAGE_OF if n.isascii())})\b", re.IGNORECASE))


def _language_named(m: re.Match[str]) -> str:
    """The language name an ``_ANSWER_LANGUAGE`` match gives."""
    return (m.group("name") or m.group("switched") or m.group("zh")).casefold()


#: a negation before the request, in its clause: "Never answer in French", "I don't want you to
#: reply in English"; in Chinese just before it ("不要用英文回答", "以后别再用英文回复"; not
#: "特别是…都用中文回答")
_NEGATION = re.compile(r"\b(?:never|not|no longer|stop|no need)\b|n't\b|\bdont\b|"
                       r"(?:不要|不再|不许|不能|不必|别|勿|禁止)\S{0,4}$|不$", re.IGNORECASE)
_CLAUSE_END = re.compile(r"[,;，；。]")


def _language_key(text: str) -> str | None:
    """A preference for the language of the answers: one key for every positive one (a later "answer
    in English" corrects "answer in Chinese"); a negative one ("never answer in French") is only
    about that language, so it leaves the positive one alone. "不要用英文，用中文回答" is positive."""
    negative = None
    for m in _ANSWER_LANGUAGE.finditer(text):
        language = LANGUAGE_OF.get(_language_named(m))
        if language is None:
            continue
        if not _NEGATION.search(_CLAUSE_END.split(text[:m.start()])[-1]):
            return "preference:answer language"
        negative = negative or f"preference:not answer language:{language}"
    return negative


def subject_key(kind: str, text: str) -> str | None:
    """What a statement is about, when a later statement about the same thing replaces it: the
    subject of "<subject> is <value>" (one-word value; "is now <value>"; "<value>, not <old>"; a
    parenthetical or a trailing "since ..." clause aside; "我的名字是张三", "数据库在杭州",
    "数据库现在在上海") or of a change ("<subject> changed to <value>", "We moved <subject> to
    <value>", "<subject>改成/迁到<value>了"), "call me", or, for a preference, the language answers
    are to be in (or, when negated, not to be in). Leading discourse markers ("Actually,",
    "Correction:", "其实"), articles and the user's possessives ("our", "我们的") are not part of the
    subject, and words the recall analyzer takes for one another are one ("prod DB host" is "production
    database host"). None: the statement stands beside others ("I prefer short answers", "My son is
    a doctor", "我们用PostgreSQL", "我是张三", a conditional)."""
    about = _about(kind, text)
    return None if about is None else about[0]


def _about(kind: str, text: str) -> tuple[str, str | None] | None:
    """(``subject_key``, the value stated for it: None for a preference) of a statement, or None."""
    text = _PARENTHETICAL.sub("", _plain(" ".join(text.split())))
    if _CONDITIONAL.match(text):
        return None
    if kind == "preference":
        key = _language_key(text)
        return None if key is None else (key, None)
    if _CALL_ME.match(text):
        return "fact:call me", None
    corrected = _correction(text)              # "... is not db-prod-41 anymore, it is db-prod-43"
    if corrected is not None:
        return None if corrected[0] is None else (corrected[0], corrected[2])
    m = _SUBJECT_VALUE.match(text)
    if m is not None:
        key = _en_key(m.group("subject"))
        return None if key is None else (key, m.group("value"))
    m = _ZH_SUBJECT_VALUE.match(text)
    if m is not None:
        key = _zh_key(m.group("subject"), m.group("verb"))
        return None if key is None else (key, m.group("value"))
    changed = _change(text)
    return None if changed is None or changed[0] is None else (changed[0], changed[2])


#: the recall analyzer's synonym groups ("db" and "database", "prod" and "production"), each named
#: by its first informal word: one subject however it is worded
FOLDED: dict[str, str] = {}
for _informal, _formal in SYNONYMS.items():
    FOLDED[_informal] = FOLDED.setdefault(_formal, _informal)

#: the ops nouns a subject is folded through, English and Chinese (``same_subject``): one concept
#: (the key) per group of words, so "生产数据库的主机是db-prod-42" and "The prod DB host is db-prod-43
#: now" are about one thing ("fact:prod db host") and the newer replaces the older, in either order.
#: A Chinese subject is folded only when every part of it is one of these words or a Latin word
#: ("Redis地址" is "redis address"; "我的常用编辑器" keeps its own key); a Chinese 在 ("is at") keeps
#: its subject apart from 是 ("is"), as before. Also used to look for an item in the other language
#: (``other_language``).
BILINGUAL_SUBJECT_WORDS: dict[str, tuple[str, ...]] = {
    "prod": ("prod", "production", "生产", "线上"),
    "staging": ("staging", "预发", "预发布", "预生产"),
    "test": ("test", "testing", "测试"),
    "dev": ("dev", "development", "开发"),
    "environment": ("environment", "env", "环境"),
    "db": ("db", "database", "数据库"),
    "host": ("host", "hostname", "主机", "主机名"),
    "server": ("server", "服务器"),
    "port": ("port", "端口", "端口号"),
    "password": ("password", "passwd", "密码"),
    "address": ("address", "addr", "地址"),
    "user": ("user", "username", "用户名", "用户"),
    "account": ("account", "账号", "帐号", "账户"),
    "version": ("version", "版本", "版本号"),
    "directory": ("directory", "dir", "folder", "目录", "文件夹"),
    "path": ("path", "路径"),
    "domain": ("domain", "域名"),
    "cluster": ("cluster", "集群"),
    "node": ("node", "节点"),
    "instance": ("instance", "实例"),
    "gateway": ("gateway", "网关"),
    "cache": ("cache", "缓存"),
    "queue": ("queue", "队列"),
    "branch": ("branch", "分支"),
    "repo": ("repo", "repository", "仓库"),
    "region": ("region", "区域", "地域"),
    "timezone": ("timezone", "时区"),
    "email": ("email", "邮箱"),
    "backup": ("backup", "备份"),
    "bucket": ("bucket", "存储桶"),
    "namespace": ("namespace", "命名空间"),
    "name": ("name", "名字", "姓名", "名称"),
}
CONCEPT_OF = {word: concept for concept, words in BILINGUAL_SUBJECT_WORDS.items() for word in words}
_ZH_SUBJECT_WORDS = sorted((w for w in CONCEPT_OF if not w.isascii()), key=len, reverse=True)
_LATIN_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _fold_word(word: str) -> str:
    word = FOLDED.get(word, word)
    return CONCEPT_OF.get(word, word)


def _en_key(subject: str) -> str | None:
    subject = _LEADING_ARTICLE.sub("", subject.casefold())
    if not subject or subject in _EN_PRONOUNS:
        return None
    return "fact:" + " ".join(FOLDED.get(word, word) for word in subject.split())


def _zh_concepts(subject: str) -> str | None:
    """A Chinese subject as its concepts ("生产数据库主机" -> "prod db host"), when every part of it is
    a word of ``BILINGUAL_SUBJECT_WORDS`` or a Latin word; else None."""
    out: list[str] = []
    i = 0
    while i < len(subject):
        latin = _LATIN_WORD.match(subject, i)
        if latin is not None:
            out.append(_fold_word(latin.group().casefold()))
            i = latin.end()
            continue
        word = next((w for w in _ZH_SUBJECT_WORDS if subject.startswith(w, i)), None)
        if word is None:
            return None
        out.append(CONCEPT_OF[word])
        i += len(word)
    return " ".join(out) if out else None


def _zh_key(subject: str, verb: str) -> str | None:
    subject = _ZH_NOW.sub("", subject)
    if not subject or subject in _ZH_PRONOUNS:
        return None
    subject = _ZH_POSSESSIVE.sub("", subject).replace("的", "")      # ("生产数据库的地址" is "生产数据库地址")
    return f"fact:{subject}{verb}" if subject else None


def _bilingual(key: str | None) -> str | None:
    """A ``subject_key`` folded through ``BILINGUAL_SUBJECT_WORDS``: "fact:生产数据库主机是" and
    "fact:prod db host" are both "fact:prod db host"; "fact:生产数据库在" is "fact:prod db 在" (是 is
    "is"; 在, "is at", stays apart); "fact:MySQL是" is "fact:mysql", as "MySQL is 8.0" is; a Chinese
    subject with a word outside the table keeps its key."""
    if key is None or not key.startswith("fact:"):
        return key
    subject = key[len("fact:"):]
    if subject[-1:] in ("是", "在") and subject[:-1]:              # (a Chinese key: ``_zh_key``)
        concepts = _zh_concepts(subject[:-1])
        if concepts is None:
            return key
        return f"fact:{concepts}" if subject[-1] == "是" else f"fact:{concepts} {subject[-1]}"
    return "fact:" + " ".join(CONCEPT_OF.get(word, word) for word in subject.split())


def same_subject(kind: str, text: str) -> str | None:
    """What a statement is about across English and Chinese: its ``subject_key`` with the ops nouns
    of ``BILINGUAL_SUBJECT_WORDS`` folded to one concept each, so "The prod DB host is db-prod-43
    now." replaces "生产数据库的主机是db-prod-42。" (and the other way round). The key corrections,
    the offline agent's newest statement and requests to forget a subject compare by."""
    return _bilingual(subject_key(kind, text))


#: a question for the value of a subject: "What is the prod DB host?", "What's our staging server?",
#: "Where is the prod DB?" (about where it is: 在), "生产数据库的主机是什么？", "端口是多少？",
#: "生产数据库在哪里？" (``asked_subject``)
_EN_ASKED = re.compile(r"^\s*(?P<wh>what|which|where)(?:['’]s|\s+is|\s+are)\s+(?P<subject>\w[\w .'/-]{0,60}?)"
                       r"(?:\s+(?:now|currently|these days))?\s*[?？]?\s*$", re.IGNORECASE)
_ZH_ASKED = re.compile(r"^\s*(?:请问)?(?P<subject>[^，,。；;？?\s]{1,24}?)(?:现在|目前)?"
                       r"(?:(?P<is>是)(?:什么|多少|哪个|哪台|哪一个|啥)|(?P<at>在)(?:哪里|哪儿|哪|什么地方))(?:呢|啊)?\s*[？?。]?\s*$")


def asked_subject(text: str) -> str | None:
    """What a question asks the value of, as ``same_subject`` keys it (so an item in either language
    answers it): "生产数据库的主机是什么？" and "What is the prod DB host?" both ask "fact:prod db host";
    None for any other message."""
    m = _EN_ASKED.match(text)
    if m is not None:
        key = _bilingual(_en_key(m.group("subject")))
        return key + " 在" if key is not None and m.group("wh").casefold() == "where" else key
    m = _ZH_ASKED.match(text)
    if m is not None:
        return _bilingual(_zh_key(m.group("subject"), "是" if m.group("is") else "在"))
    return None


def other_language(text: str) -> str:
    """The ops nouns of ``text`` (``BILINGUAL_SUBJECT_WORDS``) in the other language, as words to
    search with: "生产数据库的主机是什么？" -> "prod db host", "What is the prod DB host?" -> "生产 数据库 主机"
    (an item stated in one language found by a question in the other); "" when there are none."""
    folded = text.casefold()
    found = sorted((folded.find(w), w) for w in _ZH_SUBJECT_WORDS if w in folded)
    english = list(dict.fromkeys(CONCEPT_OF[w] for _, w in found))
    named = dict.fromkeys(c for w in _LATIN_WORD.findall(folded) if (c := CONCEPT_OF.get(FOLDED.get(w, w))))
    chinese = [next(w for w in BILINGUAL_SUBJECT_WORDS[c] if not w.isascii()) for c in named]
    return " ".join(english + chinese)


def _change(text: str) -> tuple[str | None, str, str] | None:
    """A statement that something changed: (its subject key, the same statement as "<subject> is
    <value>", the value), or None. A Chinese one says it is done (了, 已经, 现在): "把数据库迁到上海"
    asks for it."""
    m = _CHANGED.match(text) or _CHANGED_BY.match(text)
    if m is not None:
        return _en_key(m.group("subject")), f"{m.group('subject')} is {m.group('value')}", m.group("value")
    m = _ZH_CHANGED.match(text)
    if m is None:
        return None
    subject = m.group("subject")
    if not (m.group("done") or m.group("end") or _ZH_NOW.search(subject)):
        return None
    value = m.group("value")
    verb = _zh_change_verb(m.group("verb"), subject, value)
    return _zh_key(subject, verb), f"{subject}{verb}{value}", value


def _zh_change_verb(verb: str, subject: str, value: str) -> str:
    """What a Chinese change is about: where the subject is (在) for a move, or for 改成/换成 a value of
    Chinese words unless the subject is a name or a title; else what it is (是)."""
    located = verb in _ZH_MOVE_VERBS or (
        _CJK_ONLY.match(value) is not None and not _ZH_NAMED.search(_ZH_NOW.sub("", subject)))
    return "在" if located else "是"


#: a Chinese change or correction is kept whatever noun its subject is ("跳板机换成 jump-2 了",
#: "堡垒机换成bastion-2了") when its value is an identifier (it holds a Latin letter or a digit); with a
#: value of Chinese words the subject must be a system thing (``_ZH_SYSTEM``: "生产数据库改成上海了";
#: "天气变成晴天了" is kept by nothing). Never a person doing something ("他把车换成宝马了") or a pronoun.
_ZH_ACTOR = re.compile(r"[把被将让给]|^(?:我|你|您|他|她|它|咱|这|那)")
_IDENTIFIER = re.compile(r"[A-Za-z0-9]")


def _zh_noun_change(subject: str, value: str) -> bool:
    """``subject`` changed to (or no longer is) ``value`` is a fact to keep (``_ZH_ACTOR``, ``_IDENTIFIER``)."""
    subject = _ZH_POSSESSIVE.sub("", _ZH_NOW.sub("", subject))
    if not subject or _ZH_ACTOR.search(subject) or _zh_key(subject, "是") is None:
        return False
    return _IDENTIFIER.search(value) is not None or _ZH_SYSTEM.search(subject) is not None


#: a correction in one sentence: a value that no longer holds, then the one that does: "The prod DB
#: host is not db-prod-41 anymore, it is db-prod-43", "... is no longer db-prod-41, it's db-prod-43
#: now", "日志服务器不是 log-1 了，换成 log-2 了", "日志服务器不是 log-1 了，现在是 log-2", "数据库不在杭州了，
#: 迁到上海了". It is about what "<subject> is <new value>" is about, so it replaces the older statement
#: (``_correction``); the old value needs no taking back.
_EN_CORRECTION = re.compile(
    rf"^\s*{_SUBJECT}\s+(?:(?:is|are)\s+no\s+longer|(?:is|are)\s+not|isn['’]t|aren['’]t)\s+(?P<old>[^\s,;]+?)"
    r"(?:\s+any\s?(?:more|longer))?\s*[,;]\s*(?:(?:but|and|so)\s+)?(?:now\s+)?"
    r"(?:(?:it|they|he|she)\s+(?:is|are)|(?:it|he|she)['’]s|they['’]re)\s+(?:now\s+)?(?P<value>[^\s,;]+?)(?:,?\s+now)?\s*[.!]?\s*$",
    re.IGNORECASE)
_ZH_CORRECTION = re.compile(
    r"^\s*(?P<subject>[^，,。；;\s]{1,24}?)(?:已经|现在|目前)?(?:不再|不)(?:是|在)\s*(?P<old>[^，,。！!\s]+?)(?:\s*了)?"
    r"\s*[，,；;]\s*(?:而|现在|目前|如今|已经|现已|已)*\s*"
    rf"(?:(?P<verb>是|在)|(?P<change>{_alternatives(_ZH_MOVE_VERBS + _ZH_CHANGE_VERBS)})了?)"
    r"\s*(?P<value>[^，,。！!\s]+?)(?:\s*了)?\s*[。.!！]?\s*$")


def _correction(text: str) -> tuple[str | None, str, str] | None:
    """A one-sentence correction (``_EN_CORRECTION``, ``_ZH_CORRECTION``): (its subject key, "<subject>
    is <new value>", the new value), or None; the key is None when it is nothing to keep (a pronoun,
    "我不是张三了，是李四"; a Chinese one as ``_zh_noun_change`` says)."""
    m = _EN_CORRECTION.match(text)
    if m is not None:
        said = f"{m.group('subject')} is {m.group('value')}"
        kept = is_fact(said) or _SYSTEM_FACT.search(said) is not None
        return (_en_key(m.group("subject")) if kept else None), said, m.group("value")
    m = _ZH_CORRECTION.match(text)
    if m is None:
        return None
    subject, value = m.group("subject"), m.group("value")
    verb = m.group("verb") or _zh_change_verb(m.group("change"), subject, value)
    key = _zh_key(subject, verb) if _zh_noun_change(subject, value) else None
    return key, f"{subject}{verb}{value}", value


#: what "记住" may lead into and be dropped from although it is no fact by itself: "<system thing>是/在
#: <value>" ("记住预发服务器是 stage-7.internal" keeps "预发服务器是 stage-7.internal")
_ZH_KEPT = re.compile(r"[^，。！？,!?]{0,40}?(?:" + _ZH_SYSTEM.pattern + r")\s*(?:是|在|为|用)\s*\S")
#: 在 before these is "is doing", not "is at": "服务器在重启" states nothing lasting
_ZH_DOING = re.compile(r"(?:重启|运行|跑|处理|迁移|升级|更新|维护|部署|备份|同步|执行|加载|启动|关闭|下载|上传|编译|构建|扩容|"
                       r"排查|修复|恢复|测试|工作|忙)")


def _kept_statement(sentence: str) -> str | None:
    """What a request to keep something ("remember that", "note:", "keep in mind that", "记住",
    "请记住：", "帮我记一下") opening ``sentence`` leads into, when that is a statement (after "that",
    always; else ``_EN_STATES``, ``_ZH_STATES``, "<subject>是/在<value>"); None for no such request
    or a request to do something ("Remember to check the disk", "记住检查磁盘")."""
    m = _LEAD_IN.match(sentence)
    if m is None:
        return None
    rest = sentence[m.end():]
    if not _WORD.search(rest):
        return None
    if (m.group("that") and not re.match(r"(?:not\s+)?to\b", rest, re.IGNORECASE)) or _EN_STATES.match(rest) \
            or _ZH_STATES.match(rest) or _ZH_SUBJECT_VALUE.match(rest) or _ZH_KEPT.match(rest):
        return rest
    return None


def _zh_system_statement(sentence: str) -> bool:
    """A plain "<system thing>是/在<value>" ("生产数据库在杭州", "预发服务器是 stage-7.internal",
    "生产数据库的端口是5432"; not "服务器在重启")."""
    m = _ZH_SUBJECT_VALUE.match(sentence)
    return m is not None and _ZH_SYSTEM.search(m.group("subject")) is not None and \
        not (m.group("verb") == "在" and _ZH_DOING.match(m.group("value")))


#: a request not to keep something: "Please forget that ...", "Don't remember ...", "Stop remembering
#: ...", "Delete the fact that ...", "Forget what (everything) I said about ...", "请忘记…", "忘掉…", "别记住…"
#: ("Don't forget that ..." asks to keep it; "忘了告诉你，…" is "I forgot to tell you")
_FORGET = re.compile(
    r"^\s*(?:(?:please|pls|kindly)\s+)?(?:(?:can|could|would|will)\s+you\s+(?:please\s+)?)?"
    r"(?:forget|unlearn|(?:don['’]?t|do\s+not|no\s+need\s+to)\s+(?:remember|keep\s+in\s+mind)|stop\s+remembering|"
    r"(?:delete|remove|erase|drop|clear)\s+(?:the\s+(?:fact|note|memory|item)|(?:it\s+)?from\s+(?:your\s+)?memory|"
    r"what\s+you\s+(?:know|remember)))"
    r"(?:\s+(?:the\s+fact\s+that|that|(?:what|everything|all)\s+I\s+(?:said|told\s+you|mentioned)\s+about|everything\s+about|about))?"
    r"[\s,:：-]+(?P<what>\w.*)$", re.IGNORECASE)
_ZH_FORGET = re.compile(
    r"^\s*(?:请|麻烦你?|你)?(?:帮我)?(?:忘记|忘掉|(?:别|不要|不用|不必)再?记(?:住|着|下来|下)|"
    r"(?:从记忆(?:中|里)?|把记忆(?:中|里)的?)(?:删除|删掉|去掉)|(?:删除|删掉|去掉)(?:你?记住的|记忆(?:中|里)的?))"
    r"(?!告诉|说|提|跟)[，,:：\s]*(?:关于)?(?P<what>\w.*)$")
_FORGET_END = re.compile(r"(?:\s*(?:吧|了|吧了))?\s*[.!?。！？]*\s*$")
#: a statement that a value no longer holds: "The prod DB host is not db-prod-41 anymore", "... is no
#: longer db-prod-41", "生产数据库不在杭州了", "数据库已经不是MySQL了", "数据库不再是MySQL"
_NO_LONGER = re.compile(
    rf"^\s*{_SUBJECT}\s+(?:(?:is|are)\s+no\s+longer|(?:(?:is|are)\s+not|isn['’]t|aren['’]t)(?=.*\bany\s?(?:more|longer)\b))"
    r"\s+(?P<value>[^\s,;]+?(?:\s+[^\s,;]+?){0,5}?)(?:\s+any\s?(?:more|longer))?\s*[.!]?\s*$", re.IGNORECASE)
_ZH_NO_LONGER = re.compile(r"^\s*(?P<subject>[^，,。；;\s]{1,24}?)(?P<now>已经|现在|目前)?(?P<neg>不再|不)(?P<verb>是|在)\s*"
                           r"(?P<value>[^，,。！!\s]+?)(?:\s*(?P<end>了))?\s*[。.!！]?\s*$")   # ("不是 log-1 了")


def _taken_back(sentence: str) -> tuple[str, str] | None:
    """("forget", what it names) for a request to forget, ("no longer", "<subject> is <value>") for a
    statement that a value no longer holds, else None (see ``takes_back``)."""
    m = _FORGET.match(sentence) or _ZH_FORGET.match(sentence)
    if m is not None:
        what = _FORGET_END.sub("", m.group("what"))
        return ("forget", what) if _WORD.search(what) else None
    m = _NO_LONGER.match(sentence)
    if m is not None and _en_key(m.group("subject")) is not None:
        said = f"{m.group('subject')} is {m.group('value')}"
    else:
        m = _ZH_NO_LONGER.match(sentence)
        if m is None or not (m.group("now") or m.group("end") or m.group("neg") == "不再") or \
                _zh_key(m.group("subject"), m.group("verb")) is None:
            return None
        gap = " " if m.start("value") > m.end("verb") else ""          # ("不是 log-1 了": "是 log-1")
        said = f"{m.group('subject')}{m.group('verb')}{gap}{m.group('value')}"
    if any(p.search(sentence) for p in _QUESTION) or _CONDITIONAL.match(sentence) or \
            any(p.search(sentence) for p in _NOT_STATED):
        return None                               # (asked, supposed, hedged or someone else's)
    return "no longer", said


def takes_back(text: str) -> list[tuple[str, str]]:
    """What the sentences of a user message take back, in order, at most ``MAX_ITEMS_PER_MESSAGE``:
    ("forget", what) for a request to forget ("Please forget that my home address is 12 Elm Street"
    -> "my home address is 12 Elm Street"; "Forget my home address", "忘掉我的数据库地址": a subject
    alone), ("no longer", "<subject> is <value>") for a value that no longer holds ("The prod DB host
    is not db-prod-41 anymore" -> "The prod DB host is db-prod-41"). Such a sentence is never kept
    itself (``distill_rules``)."""
    out: list[tuple[str, str]] = []
    for s in sentences(text):
        if len(s) > MAX_STATEMENT_CHARS:
            continue
        got = _taken_back(_plain(s))
        if got is not None:
            out.append(got)
            if len(out) >= MAX_ITEMS_PER_MESSAGE:
                break
    return out


def _same_text(text: str) -> str:
    """A statement as ``retracts`` compares it: lead-ins, articles, possessives, case and spacing aside."""
    text = _PARENTHETICAL.sub("", _plain(" ".join(text.split()))).casefold()
    text = _ZH_POSSESSIVE.sub("", _LEADING_ARTICLE.sub("", text))
    return text.rstrip(".。!！ ")


#: a request to forget everything the user memory keeps of the user: "Forget everything", "Please
#: forget everything you know about me", "Don't remember anything about me", "Forget all about me",
#: "忘掉关于我的一切", "忘掉所有", "忘掉你记住的所有内容" (what ``takes_back`` names: the words after the verb)
_EVERYTHING = re.compile(
    r"(?:(?:everything|all|anything)(?:\s+of\s+it)?(?:\s+(?:that\s+)?(?:you\s+(?:know|remember|have)|I\s+(?:said|told\s+you)))?"
    r"(?:\s+(?:about|of|on)\s+(?:me|us))?|me|us)|"
    r"(?:关于)?(?:我|我们|(?:我|我们)?(?:的)?(?:一切|所有|全部)(?:的)?(?:信息|内容|事情|事|东西|记忆)?|"
    r"你?(?:记住|知道|记得)的(?:关于我的)?(?:一切|所有|全部)(?:的)?(?:信息|内容|事情|东西)?)", re.IGNORECASE)
#: what "call me <name>" is about, by the names a request to forget gives it ("Forget my nickname")
_CALLED = frozenset(("nickname", "nick name", "name", "what to call me", "what you call me", "昵称", "称呼", "外号", "名字"))
#: the user's own thing: "Forget my address" also takes "My home address is ..." (both the user's)
_OWN = re.compile(r"^\s*(?:(?:my|our)\s|我的|我们的|咱们的)", re.IGNORECASE)
_HAN = re.compile(r"[\u4e00-\u9fff]")


def _answer_languages(text: str) -> set[str]:
    """The languages answers are asked in by ``text`` ("answer in Chinese", "用中文回答")."""
    return {LANGUAGE_OF.get(_language_named(m), "") for m in _ANSWER_LANGUAGE.finditer(text)} - {""}


def retracts(taken: tuple[str, str]) -> Callable[[str, str], bool]:
    """Whether an item (kind, text) is what ``taken`` (a ``takes_back`` entry) takes back: the same
    statement (lead-ins, articles, possessives, case and spacing aside), the same subject with the
    same value (``subject_key``: "Forget that our DB host is db-1" takes "The DB host is db-1"), or,
    for a request to forget a subject alone ("Forget my home address", "忘掉数据库地址", "忘掉Redis地址"),
    an item about that subject ("My home address is 12 Elm Street", "数据库地址是10.0.0.1"), and for
    one of the user's own things ("my address") an item about one of theirs named the same way ("My
    home address is ..."); "my nickname" / "我的昵称" also takes "Call me Bobby". A request to forget
    a preference for the answers' language ("Forget that I asked you to answer in Chinese", "忘掉我说的
    用中文回答") takes that preference; a request to forget everything (``_EVERYTHING``) takes every item."""
    how, what = taken
    if how == "forget" and _EVERYTHING.fullmatch(what.strip()):
        return lambda kind, text: True
    mine, said = _same_text(what), _about("fact", what)
    language = _language_key(what) if how == "forget" else None
    languages = _answer_languages(what) if language is not None else set()
    subject: re.Pattern[str] | None = None          # a subject alone: the start of a statement about it
    owned: re.Pattern[str] | None = None            # ... or the end of the subject of one of the user's own
    keys: set[str] = set()
    if how == "forget" and said is None and language is None and mine and classify(what) is None:
        if _HAN.search(mine) is None:
            keys = {_en_key(mine)} - {None}                                        # type: ignore[assignment]
            verb, before = r"(?:\s+(?:is|are)\s|\s*[:=])", r"(?:[\w'-]+\s+){1,3}"
        else:                                       # (a subject with a Chinese word in it: "Redis地址")
            keys = {_zh_key(mine, verb) for verb in ("是", "在")} - {None}         # type: ignore[assignment]
            verb, before = r"\s*(?:是|在|为)", r"[^\s，,。；;：:]{1,12}?"
        keys = {_bilingual(k).casefold() for k in keys} | ({"fact:call me"} if keys and mine in _CALLED else set())
        subject = re.compile(re.escape(mine) + verb) if keys else None
        owned = re.compile(before + re.escape(mine) + verb) if keys and _OWN.match(what) else None

    said_about = None if said is None else _bilingual(said[0])      # (either language: same_subject)

    def named(kind: str, text: str) -> bool:
        if _same_text(text) == mine:
            return True
        about = _about(kind, text)
        if said is not None:
            return about is not None and said_about == _bilingual(about[0]) and said[1] is not None and about[1] is not None \
                and said[1].casefold().rstrip(".。!！") == about[1].casefold().rstrip(".。!！")
        if language is not None:
            return about is not None and about[0] == language and bool(_answer_languages(text) & languages)
        if subject is None:
            return False
        same = _same_text(text)
        return subject.match(same) is not None or (about is not None and _bilingual(about[0]).casefold() in keys) or \
            (owned is not None and owned.match(same) is not None and _OWN.match(_plain(text)) is not None)
    return named


def _plain(sentence: str) -> str:
    """The sentence without the words that only lead into it: discourse markers ("Actually,",
    "FYI", "更正：") and the words that ask to keep it ("remember that", "记住"), these only when what
    follows is a fact or preference by itself or a statement (``_kept_statement``: "remember that
    bob's printer is on floor 3" is "Bob's printer is on floor 3"; "Remember to check the disk" is
    kept whole)."""
    text = sentence
    for _ in range(MAX_LEAD_INS):
        rest = _MARKER.sub("", text, count=1)
        if rest == text:
            rest = _LEAD_IN.sub("", text, count=1)
            if rest != text and _kept_statement(text) is None and classify(rest) is None:
                rest = text
        if rest == text or not rest.strip():
            break
        text = rest.lstrip()
    return text if text == sentence else text[0].upper() + text[1:]


def clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ITEM_CHARS else text[: MAX_ITEM_CHARS - 1] + "…"


def classify(sentence: str) -> str | None:
    """``"preference"``, ``"fact"`` or None for one sentence of a user message."""
    s = sentence.strip()
    if not s or mentions_secret(s) or not _WORD.search(_LEAD_IN.sub("", s, count=1)):
        return None                               # (nothing but "记住", "remember that": states nothing)
    if _taken_back(s) is not None:               # "Forget that ...", "... is not db-1 anymore"
        return None
    unasked = _ZH_INDEFINITE.sub("", s)
    if any(p.search(unasked) for p in _QUESTION):
        return None
    if any(p.search(s) for p in PREFERENCE):
        return "preference"
    if _CONDITIONAL.match(s) or any(p.search(s) for p in _NOT_STATED):
        return None
    corrected = _correction(s)      # "... is not db-prod-41 anymore, it is db-prod-43": what the new value is
    if corrected is not None:
        return "fact" if corrected[0] is not None else None
    if is_fact(s) or _SYSTEM_FACT.search(s) or _zh_system_statement(s) or _kept_statement(s) is not None:
        return "fact"                           # (what the user asked to keep is a fact: "keep in mind that ...")
    changed = _change(s)            # "The prod DB host changed to db-prod-43": a fact when "... is ..." is one
    if changed is not None and changed[0] is not None and \
            (is_fact(changed[1]) or _SYSTEM_FACT.search(changed[1]) or _ZH_SYSTEM.search(changed[1])):
        return "fact"
    m = _ZH_CHANGED.match(s)        # "跳板机换成 jump-2 了": any noun subject with an identifier (_zh_noun_change)
    if changed is not None and changed[0] is not None and m is not None and _zh_noun_change(m.group("subject"), changed[2]):
        return "fact"
    return None


#: where a kept fact is cut into its statements (``_statements``): a comma or semicolon between clauses
_CLAUSE_SPLIT = re.compile(r"\s*[，；;]\s*|,\s+")


def _statements(kind: str, text: str) -> list[str]:
    """A kept fact that is several statements joined by commas, each "<subject> is/是/在 <value>" about a
    thing of its own ("生产数据库是 db-prod-1，备份在杭州机房", "My son is 5, my daughter is 3"), as
    those statements, so a later statement about one of them replaces that one alone ("生产数据库现在是
    db-prod-2" leaves "备份在杭州机房"); anything else (a clause without its own subject: "…，不是杭州",
    "…，它的端口是 5432", "…, port 5432"; a one-sentence correction) as it is."""
    if kind != "fact" or _correction(text) is not None:
        return [text]
    parts = [p for p in _CLAUSE_SPLIT.split(text.rstrip("。.!！ ")) if p]
    if len(parts) < 2 or len(parts) > MAX_ITEMS_PER_MESSAGE:
        return [text]
    keys = [_about("fact", p) for p in parts]
    if any(k is None for k in keys) or len({k[0] for k in keys if k is not None}) < len(parts):
        return [text]
    return parts


#: a request to keep something joined to another request in one sentence: "show memory and remember that
#: the staging server is stage-7.internal", "查看内存，然后记住预发服务器是 stage-7" (``_requests``)
_JOINED_LEAD_IN = re.compile(r"(?:\s+and\s+(?:then\s+|also\s+)?|\s*[,，;；]\s*(?:and\s+|然后|并且?|再)?|\s*(?:然后|并且|并|再)\s*)"
                             r"(?=(?:(?:please|pls)\s+)?(?:remember|don['’]t forget|do not forget|note|keep in mind)\b|"
                             r"(?:请|麻烦你?)?(?:帮我)?(?:记住|记一下|记下))", re.IGNORECASE)


#: the part before a joined request to keep something is itself a request the assistant answers (show,
#: tail, check, ..., 查看, 看下, ...): only then is the sentence cut there (``_requests``)
_ASKS_FIRST = re.compile(r"^\s*(?:(?:please|pls|can\s+you|could\s+you)\s+)?(?:show|tail|check|list|grep|cat|display|"
                         r"view|get|print|find|search|read|open|count|ping|monitor)\b|"
                         r"^\s*(?:请|帮我|麻烦你?)?(?:查看|看下|看看|看一下|显示|列出|搜索|查找|检查|统计|打开|读取)",
                         re.IGNORECASE)


def _requests(sentence: str) -> list[str]:
    """A sentence as its requests when it opens with a request the assistant answers (``_ASKS_FIRST``) and
    then asks to keep something (``_JOINED_LEAD_IN``): the part before and the request to keep, so the
    kept item is what that request says ("show memory and remember that the staging server is
    stage-7.internal" keeps "The staging server is stage-7.internal"; before, the whole sentence). A
    statement followed by "note that ..." ("The backup runs at 02:00, note that this is UTC.") stays one
    sentence, as does any other."""
    m = _JOINED_LEAD_IN.search(sentence)
    if m is None or not _ASKS_FIRST.match(sentence[:m.start()]):
        return [sentence]
    return [sentence[:m.start()], sentence[m.end():]]


def distill_rules(text: str) -> list[tuple[str, str]]:
    """(kind, text) of the durable statements of one user message, in order, at most
    ``MAX_ITEMS_PER_MESSAGE`` (a sentence that takes something back is none: ``takes_back``; a fact
    of several statements about different things is those statements: ``_statements``)."""
    out: list[tuple[str, str]] = []
    for s in (part for sentence in sentences(text) for part in _requests(sentence)):
        if len(s) > MAX_STATEMENT_CHARS:
            continue
        plain = _plain(s)
        if _taken_back(plain) is not None:
            continue
        kind = classify(plain) or (classify(s) if plain != s else None)   # (what "记住" asked to keep)
        if kind is not None:
            out += [(kind, clip(part)) for part in _statements(kind, plain)]
        if len(out) >= MAX_ITEMS_PER_MESSAGE:
            break
    return out[:MAX_ITEMS_PER_MESSAGE]


def unstated(sentence: str) -> bool:
    """A sentence (or clause) the user does not state as true, by the rules' tests (``classify``): a
    question or a request to be told, or -- unless it asks for a lasting way of answering -- a
    conditional or hypothesis, a hedge, a request to check something or what someone else said."""
    return unstated_as(sentence) is not None


def unstated_as(sentence: str) -> str | None:
    """Why ``unstated``: "question" (asked, or a request to be told: it says nothing of what follows
    it), "scope" (a conditional, a hedge, a request to check, hearsay: what follows in the sentence is
    supposed, hedged or someone else's too, ``_SCOPED``), or None (stated)."""
    plain = _plain(sentence)
    if _taken_back(plain) is not None:           # (kept: the learning drops what it takes back)
        return None
    if any(p.search(_ZH_INDEFINITE.sub("", plain)) for p in _QUESTION):
        return "question"
    if any(p.search(plain) for p in PREFERENCE):
        return None
    return "scope" if _CONDITIONAL.match(plain) or any(p.search(plain) for p in _NOT_STATED) else None
