"""The general-vs-knowledge routing decision and the offline agent's knowledge answers.

Rule (offline agent), first match wins:
0. ``reading_and_documents`` (or ``keyword`` when it also mentions the documents): a yes/no question
   whether a live reading is past a value that asks about a setting or the documents
   (``mixed_readings``: "is the disk above the threshold in the runbook?", "磁盘使用率超过告警阈值了吗？")
   -> knowledge with ``Route.readings``: the offline agent takes the reading with the search, quotes
   only passages about what is read (``Focus.subjects``) and says whether the reading is above the
   values quoted (``knowledge_answer.compare_readings``).
1. ``keyword``: the message mentions the documents (知识库, 文档, 资料, "knowledge base", "the docs",
   "my/the/our documents", "documentation", "the (on-call) runbook", "the playbook", "the wiki") -> knowledge. The words that route it ("according to my
   documents", "does the documentation say", "文档里有没有写"; ``ROUTING``) are left out of the search:
   they say where to look, not what to look for.
2. ``intent``: a system request the offline agent has a tool for (CPU, disk, logs, ...) -> general,
   unless it is a question about a metric, the time or a port (``OUTRANKED``; no command such as
   "show ...", "check ...", "查看...": ``intents.COMMAND``) whose best passage holds what it asks beyond
   the machine (``match_terms(parsed_part(text), request=True)``: without the words that made it a
   system request nor the machine the reading is taken on, "web-01", "the web server", 生产环境, "right
   now", ``intents.without_request``; of a long message only ``intents.parsed_part``, as ``parse``) as
   ``strong_match`` (4) requires -> knowledge (``strong_match``): "what time does the nightly backup
   run?", "磁盘使用率超过多少会触发告警", "CPU 告警阈值是多少", "缓存的过期时间是多少秒？"; "现在几点", "how
   much memory is free", "is port 22 open on web-01?", "生产环境的CPU使用率是多少？" leave nothing and keep
   their tool. A metric or port question about the machine now (``live_reading``: 现在, 目前, 当前,
   "right now", "currently"; no setting word, ``SETTING``: 阈值, 告警, "threshold" ...) keeps its tool
   whatever the documents say: "现在 CPU 超过 90% 了吗" reads the CPU ("目前磁盘使用率超过多少会触发告警"
   still asks the documents). Such a question that is a follow-up (3) of a documents answer and leaves
   a word beyond the request ("那过期时间呢？", not "那现在几点？") is one before the tool; a port check
   ("网关的 8443 端口通吗") never is.
   ``statement``: the message only states facts or preferences to keep, or takes them back
   (``distill.takes_back``), as the user memory's rules read them ("remember that the staging host
   is stage-7", "以后用中文回答", "forget my home address"; no question) -> general.
3. ``follow_up``: the previous answer quoted documents (the offline agent's documents answer, with a
   ``[name §location]`` citation; not, say, a history answer quoting one), this message is short (at
   most 8 words, or 16 CJK characters), is no thanks or greeting, is not answered by what the user
   told the assistant (their long-term memory), and refers back ("and its port?", "那它的端口呢";
   ``REFERS_BACK``) or shares a search term with the passages the previous answer quoted -> knowledge;
   the retrieval query is the previous question (the last one with a term of its own), the section the
   previous answer quoted first (``topic``: the last heading of its first citation, so "and the
   maintenance window?" after "and on staging?" -> "what about its port?" still searches staging's)
   plus this one ("and its default?" finds the passage about the timeout), and only the passages holding one of this
   message's own key terms are quoted ("and its port?" quotes the port, not again the passage the
   previous answer quoted; a message with no key term of its own, "tell me more", "and how do I fix
   it?", goes by the previous question's).
4. ``strong_match``: the best passage for the message holds at least 60% of the message's distinct
   terms (``match_terms``: English words, Chinese characters and character pairs, without the words
   that only ask, ``ASKED``: "how many", 多少, 什么, 意思, "fix", "value"), among them at least 2 words
   (``_is_word``; of Chinese, character pairs without a function character: 缓存, 过期, not 的过), and
   what the message is about: every name it names (``names``: SLA, API, Kafka, db-prod-01, any ASCII
   word of a Chinese message; ``held_names``: a piece of an identifier is no name, db-prod-01 holds no
   "DB", payment-api no "API") or, naming none, one of its rarest terms (``_rarest``: the fewest
   passages of the user's documents hold it; not the kind of answer asked for, "which hosts") ->
   knowledge. A name the best passage lacks refuses only when no passage of the documents holds it
   (``Focus.unknown``) and the best passage does not hold everything else the question asks
   (``holds_the_rest``): "How often are the SSL certificates renewed?" quotes "TLS certificates are
   renewed by certbot every 60 days", "What is the SLA of the payments API?" does not; a name some
   other passage holds ("Sunday" of "Where do the PagerDuty alerts go on Sunday?") leaves the passage
   with the share quoted. The answer notes the names the quoted text lacks. A question whose best passage holds every name it names is one too, without the share
   ("What is the port of Redis?" over Chinese documents). With names, what it is about is also one of
   the rarest of its other key terms that the documents hold (``Focus.beside``, an ops noun in either
   language: "port" is held by 端口): "redis 连接超时怎么办" is not about "Redis 的端口是 6380" (超时).
   A word that only says what is done or how something is ("kept", "high"; ``incidental_terms``) or the
   kind of value asked ("threshold", "limit") and that no passage holds is left out (``Focus.idle``):
   "how long are backups kept?" over "keeps 14 days of backups" is a match; plain verbs ("use", "need")
   are asking words. A question with one search word of at least ``ONE_TERM_MIN_CHARS`` characters
   ("Who do I escalate to?") matches a best passage holding it.
   ``missing_term``: a question (not answered by the user memory) the documents could answer (not one
   about what happens on the machine, ``about_the_machine``: "最近有没有 OOM", "nginx 有没有报错", which
   get the general route's "cannot handle" and what the agent can do) whose best passage holds the share
   but not what it is about, or that names something no best passage holds -> knowledge, and the
   answer says what the documents have nothing about ("What is the SLA of the payments API?" -> I
   found nothing about “SLA” in your documents.), never naming a word a passage found holds: those
   held apart are "nothing that mentions both “redis” and “超时”". The route's decision is kept in
   its ``Focus`` (``decided``, ``best``, ``absent``, ``lacking``) and the answer follows it.
5. otherwise general (``default``; ``no_documents`` when the user can see no document).

Every turn records ``{"route", "method", "reason", "query"?}`` in its context metadata (``route``).
What a knowledge route answers, and the citations of the LLM agent's answers: ``knowledge_answer``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from server.agent.intents import COMMAND, parsed_part, without_request
from server.knowledge.rerank import identifiers
from server.memory.analyze import CJK_STOP_CHARS, analyze
from server.memory.distill import MAX_ITEMS_PER_MESSAGE, distill_rules, other_language, takes_back
from server.memory.extractive import sentences

KEYWORDS = re.compile(r"知识库|文档|资料库|资料|\bknowledge[- ]?base\b|\bthe docs\b|\bmy docs\b|"
                      r"\b(?:my|the|our|uploaded)\s+(?:documents?|files)\b|\bdocumentation\b|"
                      r"\b(?:my|the|our|your)\s+(?:[a-z][\w-]*\s+)?(?:runbooks?|playbooks?|wiki)\b",
                      re.IGNORECASE | re.ASCII)   # (ASCII \b: "documentation里" has none in Unicode)
_OWNER = r"(?:(?:my|the|our|your|uploaded|all)\s+)"
#: the routing phrase with the words around it that only say "look in the documents" (left out of the search)
ROUTING = re.compile(
    r"(?:\b(?:according\s+to|based\s+on|as\s+per|from|in|inside|within|search(?:ing)?|check(?:ing)?|"
    r"look(?:ing)?\s+(?:in|into|through|at)|(?:what\s+)?(?:does|do|did|will|would|can|could)|"
    r"is\s+(?:there\s+)?(?:anything\s+)?in)\s+)?"
    rf"(?:{_OWNER}*(?:\bknowledge[- ]?base|\bdocs|\bdocumentation)|{_OWNER}+(?:documents?|files|runbooks?|playbooks?|wiki))\b"
    r"(?:\s+(?:say|says|said|mention|mentions|tell\s+(?:me|us)|cover|covers|contain|contains|include|includes|"
    r"have|has|list|lists|describe|describes|explain|explains|state|states|show|shows)\b)?"
    r"(?:\s+(?:about|for|on|regarding|whether|if)\b)?|"
    r"(?:请)?(?:帮我)?(?:根据|按照|依据|参考|查一下|查查|查询|查看|搜索|搜一下|查找|看看|在|从)?(?:我的|我们的|上传的)?"
    r"(?:知识库|文档|资料库|资料)(?:里面|里|中|内|上)?(?:的)?(?:有没有|是否|有)?(?:写|提到|说|讲|记载|介绍|提|说明)?"
    r"(?:过|了|到)?(?:关于)?", re.IGNORECASE | re.ASCII)
#: terms of the words that name the documents: never what a question is about
ROUTING_TERMS = frozenset(analyze("documents documentation docs knowledge base knowledgebase runbook runbooks "
                                  "playbook playbooks wiki")) | {
    "文档", "知识", "识库", "资料", "料库"}
#: words that only ask ("tell me more", "explain"): never what a question is about either
ASKING_TERMS = frozenset(analyze("tell say said explain describe know mention please thanks thank detail details "
                                 "use used uses using need needs needed happen happens happened mean means meant want"))
#: words that only say what kind of answer is wanted: how much / how long, 多少, 什么, 意思, and what to
#: do about it (fix, 解决): a passage about the subject answers them without holding them (``key_terms``)
ASKED = re.compile(
    r"\bhow\s+(?:much|many|long|often|far|big|large|soon|old)\b|\bwhat\s+kind\s+of\b|"
    r"\b(?:values?|amount|exact(?:ly)?|(?:the\s+)?number\s+of)\b|"
    r"\b(?:fix(?:es|ed|ing)?|solve[sd]?|solving|resolve[sd]?|resolving|repair(?:s|ed|ing)?|handl(?:e|es|ed|ing)|"
    r"troubleshoot(?:s|ed|ing)?|remed(?:y|ies)|mitigat(?:e|es|ed|ing)|work\s*around|deal)\b|"
    r"多长时间|多少时间|多久|多少|多长|多大|多高|多远|多快|几点钟?|几个|几次|几天|什么时候|什么|啥|怎么样|怎么办|"
    r"怎么|怎样|如何|为什么|为何|哪个|哪些|哪里|哪儿|几|哪|意思|是否|能否|能不能|可不可以|是不是|有没有|请问|"
    r"解决|处理|修复|排查|应对|吗|呢", re.IGNORECASE | re.ASCII)
#: the intents a document can outrank: a question about the machine's metrics or the time, or whether a
#: port answers, names the subject the document is about ("what time does the nightly backup run?");
#: history, files, logs, downloads and memory requests name what to read
OUTRANKED = frozenset({"cpu", "memory", "disk", "network", "load", "uptime", "overview", "processes", "clock",
                       "network_check"})
#: a short message that refers back to the previous answer ("and its port?", "那它的端口呢", "tell me more")
REFERS_BACK = re.compile(
    r"^\W*(?:and|also|plus|but|so|then|or)\b|\b(?:what|how)\s+about\b|"
    r"\b(?:it|its|it's|itself|that|this|these|those|they|them|their|there|same|one|ones|else|more|other|another)\b|"
    r"^\W*(?:那|那么|还有|另外|以及|而且|并且|然后|再)|它|其|这个|那个|这些|那些|同样|更多|其他|其它|别的|"
    r"呢\s*[？?。!！]*\s*$", re.IGNORECASE | re.ASCII)
#: thanks, greetings and acknowledgements: never a follow-up
COURTESY = re.compile(
    r"(?:(?:thanks?|thank\s+you|thx|ty|many\s+thanks|so\s+much|very\s+much|a\s+lot|again|ok(?:ay)?|cool|great|nice|"
    r"perfect|awesome|got\s+it|understood|i\s+see|that\s+helps|that's\s+helpful|helpful|hi|hello|hey|bye|goodbye|"
    r"good\s+(?:morning|afternoon|evening|night)|cheers|no\s+problem|谢谢|多谢|感谢|谢了|好的|好吧|好|嗯|行|收到|"
    r"明白|了解|知道了|懂了|你好|您好|再见|拜拜|辛苦了|没事了|没问题|不错|很好|太好了)"
    r"(?:你|您|啦|了|哈|呀|啊|哦|喔)*[\s,.!~，。！、]*)+", re.IGNORECASE | re.ASCII)
CITATION = re.compile(r"\[[^\[\]\n]+ §[^\[\]\n]+\]")
#: the characters of ``CJK_STOP_CHARS`` (which serves recall) that begin or end content words too: 过期,
#: 有效, 到期, 对象, 因为, 存在, 从库, 还原, 就绪, 个人 (``_is_word``)
CONTENT_STOP_CHARS = frozenset("过有到对为在从还就个")
FUNCTION_CHARS = CJK_STOP_CHARS - CONTENT_STOP_CHARS
#: CJK character pairs without a ``FUNCTION_CHARS`` character that are still function words (``_is_word``)
FUNCTION_PAIRS = frozenset({"因为", "所以", "如果", "但是", "还是", "或者", "以及", "就是", "可以", "已经", "一下", "一个",
                            "这样", "那样", "怎样", "然后", "而且", "并且", "为了", "对于", "关于", "还有", "没有", "不是",
                            "有点", "一些", "这里", "那里", "哪里", "目前", "现在"})
#: a question (the ``missing_term`` route answers only questions): a question mark, a question word
QUESTION = re.compile(
    r"[?？]|^\W*(?:what|what's|which|who|whom|whose|when|where|why|how|is|are|was|were|do|does|did|can|could|"
    r"should|will|would|has|have)\b|吗|呢|什么|多少|哪|几|如何|怎么|是否|是不是|有没有", re.IGNORECASE)
_ASCII_WORD = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:/-]*[A-Za-z0-9])?")
_SENTENCE_END = frozenset(".!?。！？;；")
#: words that stand for what was said before ("and the weekly one?"): never what a follow-up is about
REFERRING_TERMS = frozenset(analyze("one ones thing things stuff part parts kind kinds"))
#: the word a question asks for ("which hosts ...", "what port ...", "how many days ..."): the kind of answer
#: wanted, which the passage answering may not name ("The proxy pool is proxy-a, proxy-b ..."): never
#: what the question is about (``focus_of``)
ANSWER_KIND = re.compile(r"\b(?:which|what|whose|how\s+many)\s+([a-z][a-z-]*)", re.IGNORECASE | re.ASCII)
_LEADING_PUNCT = re.compile(r"^[\s,.;:!?，。；：！？、]+")
_LOCATION_TAIL = re.compile(r"(?:, (?:p\. \d+|lines? [\d-]+))+$")
FOLLOW_UP_MAX_WORDS = 8
FOLLOW_UP_MAX_CJK = 16
STRONG_SHARE = 0.6
STRONG_MIN_TERMS = 2
#: a question with a single search word ("Who do I escalate to?") is matched against the documents when
#: that word's term is at least this long and the best passage holds it (``_strong_match``); a shorter
#: one ("go", "run") says too little on its own
ONE_TERM_MIN_CHARS = 4
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_CJK_RUN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]+")
ANSWER_HEAD_EN, ANSWER_HEAD_ZH = "From your documents:", "知识库中的相关内容："


#: a question about the machine as it is now ("现在 CPU 超过 90% 了吗", "CPU usage right now?",
#: "当前磁盘使用率超过 85% 了吗"): a metric or port question with one of these keeps its tool (a
#: document's passage about the metric is about its settings), unless it asks about a setting (``SETTING``)
LIVE_NOW = re.compile(r"现在|目前|当前|此刻|此时|这会儿|眼下|实时|"
                      r"\b(?:right\s+now|currently|at\s+the\s+moment|at\s+present|as\s+of\s+now)\b", re.IGNORECASE)
#: what a document says about a metric rather than its reading: "目前 CPU 告警阈值是多少" is a documents question
SETTING = re.compile(r"阈值|告警|报警|警报|门限|上限|下限|间隔|周期|策略|配置|设置|规则|保留|默认|"
                     r"\b(?:thresholds?|alerts?|alarms?|limits?|polic(?:y|ies)|intervals?|settings?|"
                     r"config(?:ured|uration)?|rules?|retention|defaults?)\b", re.IGNORECASE)
#: a question whether something happens or happened on the machine (an error, a crash, a restart, an
#: OOM: "最近有没有 OOM", "nginx 有没有报错", "redis 今天重启了吗", "did the backup fail last night?", "is
#: nginx down?", "any errors recently?"): the documents say how things are set up, not what happened, so
#: it is never ``missing_term`` (no tool reads it: the general route says what the agent can do), unless
#: it asks what to do or what something means (``HOW_TO``: "nginx 报错 502 怎么办")
MACHINE_STATE = re.compile(
    r"(?:有没有|是否有?|有无|是不是)[^，,。？?]{0,8}?(?:报错|出错|错误|异常|告警|报警|宕机|挂|崩溃|重启|OOM|oom|失败|超时|丢包|断开|掉线)|"
    r"(?:报错|出错|宕机|挂|崩溃|重启|OOM|oom|失败|超时|丢包|掉线)了?(?:吗|没有?)|"
    r"\b(?:any|(?:is|are|was|were)\s+there(?:\s+any)?)\s+(?:\w+\s+){0,2}?(?:errors?|exceptions?|crash(?:es)?|restarts?|"
    r"ooms?|failures?|timeouts?|alerts?)\b|"
    r"^\W*(?:did|has|have|is|was|are|were)\b[^?？]*\b(?:crash(?:ed)?|fail(?:ed)?|restart(?:ed)?|down|oom(?:-?killed)?)\b",
    re.IGNORECASE)
HOW_TO = re.compile(r"怎么办|怎么解决|怎么处理|如何|怎么|为什么|什么意思|是什么|"
                    r"\b(?:how\s+(?:do|to|can|should)|what\s+(?:should|to\s+do|does|is)|why)\b", re.IGNORECASE)


def about_the_machine(text: str) -> bool:
    """``text`` asks what happens or happened on the machine (``MACHINE_STATE``), not what to do (``HOW_TO``);
    of a long message only ``intents.parsed_part``, as the intents."""
    text = parsed_part(text)
    return MACHINE_STATE.search(text) is not None and HOW_TO.search(text) is None


def live_reading(text: str, tool_intents: list[str]) -> bool:
    """A metric or port question about the machine now (``LIVE_NOW``, no ``SETTING``): it keeps its tool
    (the clock alone is left to the usual test: "目前夜间备份几点运行" asks the documents)."""
    text = parsed_part(text)
    return bool(set(tool_intents) - {"clock"}) and LIVE_NOW.search(text) is not None and SETTING.search(text) is None


#: the system readings a question can hold against the documents (``mixed_readings``; ``intents`` names)
READINGS = frozenset({"cpu", "memory", "disk", "load"})
#: the words of what each reading measures ("is swap usage above ...": the swap of the memory reading;
#: ``reading_subjects``), in either language
SUBJECTS: dict[str, dict[str, str]] = {
    "disk": {"disk": "disk disks filesystem filesystems storage 磁盘 硬盘 存储"},
    "memory": {"memory": "memory ram 内存", "swap": "swap swapping 交换"},
    "cpu": {"cpu": "cpu cpus processor 处理器"},
    "load": {"load": "load 负载"},
}
#: the question asks whether a reading is past a value ("is the disk above ...", "磁盘超过告警阈值了吗")
COMPARES = re.compile(r"\b(?:above|over|below|under|exceed(?:s|ed|ing)?|beyond|past|higher|lower|greater|more|less|"
                      r"within|reach(?:ed|es)?|hit|breach(?:ed|es)?|cross(?:ed|es)?)\b|超过|超出|高于|低于|达到|突破|超了|超标",
                      re.IGNORECASE)
#: a yes/no question ("is ...", "does ...", "check whether ...", "...了吗")
YES_NO = re.compile(r"^\W*(?:is|are|was|were|has|have|had|does|do|did|will|would|could|can|should)\b|"
                    r"\b(?:if|whether)\b|吗\s*[？?。!！]*\s*$|了没有?|是否|有没有|是不是", re.IGNORECASE)
#: it asks what the documents say (beside ``KEYWORDS`` and ``SETTING``): "should", "says", 规定
AGAINST_DOCS = re.compile(r"\b(?:says?|said|should|supposed|allowed|recommended)\b|规定|要求|应该|建议", re.IGNORECASE)


def mixed_readings(text: str, tool_intents: list[str]) -> tuple[str, ...]:
    """The readings (``READINGS``) of a question that both names a live reading and asks it against the
    documents: only system requests the documents can outrank (``OUTRANKED``), a yes/no question
    (``YES_NO``) whether the reading is past a value (``COMPARES``) that asks about a setting or the
    documents (``SETTING``, ``KEYWORDS``, ``AGAINST_DOCS``): "is the disk above the threshold in the
    runbook?", "is swap usage above the limit in the runbook?", "磁盘使用率超过告警阈值了吗？". Such a
    question gets the reading and the quoted passage together (``offline``). Not "is disk usage above
    85%?" (no setting: the reading), nor "目前磁盘使用率超过多少会触发告警" (no yes/no: the documents)."""
    text = parsed_part(text)
    if not tool_intents or not OUTRANKED.issuperset(tool_intents):
        return ()
    readings = tuple(dict.fromkeys(n for n in tool_intents if n in READINGS))
    if not readings or not COMPARES.search(text) or not YES_NO.search(text):
        return ()
    if not (KEYWORDS.search(text) or SETTING.search(text) or AGAINST_DOCS.search(text)):
        return ()
    return readings


def reading_subjects(text: str, readings: Iterable[str]) -> dict[str, set[str]]:
    """{subject: its terms} of the ``readings`` (``SUBJECTS``) that ``text`` names ("swap" of "is swap
    usage above the limit?"), or, naming none of a reading's, all of that reading's; the terms of a
    Chinese word are its character pairs."""
    said = set(analyze(text))
    out: dict[str, set[str]] = {}
    for reading in readings:
        subjects = {name: {t for t in analyze(words) if not _CJK.match(t) or len(t) == 2}
                    for name, words in SUBJECTS.get(reading, {}).items()}
        named = {name: terms for name, terms in subjects.items() if terms & said}
        out.update(named or subjects)
    return out


class Focus(str):
    """The text whose key terms a quoted passage must hold (the question, or a follow-up's own words),
    with ``rarest``: those of its terms the user's documents hold the fewest times (``_rarest``),
    one of which a quoted passage must hold when the text names nothing (``names``), and ``beside``:
    when it names something, the rarest of its other key terms that the documents hold, one of which a
    quoted passage must hold beside the names ("redis 连接超时怎么办": 超时, so "Redis 的端口是 6380" is not
    quoted). A plain str works as a focus too (no rarest term known).

    ``unknown``: the names (as written) that no passage of the user's documents holds (``doc_freqs``
    0: "SLA", "Kafka"; not "PagerDuty" nor "Sunday" when some passage has them), the only names an
    answer may say the documents have nothing about. What the route decided (``_strong_match``):
    ``decided`` "quote" (the best passage answers: ``best``, its citation, is quoted, and ``lacking``,
    the names it does not hold, are noted) or "nothing" (the answer says the documents have nothing
    about ``absent``; when a passage found holds them, that none holds them together); "" when the
    route looked at no passage (``keyword``, ``follow_up``: the answer judges the passages found).
    ``idle``: the ``incidental_terms`` no passage holds ("kept" of "how long are backups kept?" over
    "keeps 14 days of backups"): left out of its rarest terms and of the terms a match counts.
    ``subjects``: of a question holding a reading against the documents (``mixed_readings``), the terms
    of what is read ("swap", "disk"; ``reading_subjects``): a quoted passage holds one of them."""
    rarest: frozenset[str] = frozenset()
    beside: frozenset[str] = frozenset()
    unknown: frozenset[str] = frozenset()
    decided: str = ""
    best: str = ""
    lacking: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    idle: frozenset[str] = frozenset()
    subjects: frozenset[str] = frozenset()


@dataclass(slots=True)
class Route:
    route: str             # "knowledge" | "general"
    method: str            # keyword | intent | follow_up | strong_match | missing_term | default | no_documents | model...
    reason: str
    query: str = ""
    focus: str = ""        # the text whose search terms a quoted passage must hold (follow_up: the new message): a Focus
    readings: tuple[str, ...] = ()   # the live readings to take with the search (``mixed_readings``)

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"route": self.route, "method": self.method, "reason": self.reason}
        if self.query:
            out["query"] = self.query
        if self.readings:
            out["readings"] = list(self.readings)
        return out


def _previous(messages: list[dict[str, Any]], role: str) -> str | None:
    """The content of the last ``role`` message before the new (last) one."""
    for m in reversed(messages[:-1]):
        if m.get("role") == role and isinstance(m.get("content"), str):
            return m["content"]
    return None


def _asked_about(messages: list[dict[str, Any]]) -> str | None:
    """The last question before the new (last) message that says what it asks about (``key_terms``),
    going back over follow-ups with no term of their own ("tell me more", "and how do I fix it?");
    else the last question."""
    last = None
    for m in reversed(messages[:-1]):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            last = last or m["content"]
            if key_terms(m["content"]):
                return m["content"]
    return last


def is_follow_up(text: str) -> bool:
    """Short enough to be a follow-up (at most ``FOLLOW_UP_MAX_WORDS`` words or ``FOLLOW_UP_MAX_CJK``
    CJK characters)."""
    cjk = len(_CJK.findall(text))
    if cjk:
        return cjk <= FOLLOW_UP_MAX_CJK
    return len(text.split()) <= FOLLOW_UP_MAX_WORDS


def search_query(text: str) -> str:
    """``text`` without the words that send it to the documents (``ROUTING``)."""
    return " ".join(ROUTING.sub(" ", text).split())


def _query(text: str) -> str:
    """``search_query(text)`` without the punctuation left in front ("根据知识库，Kafka ..." -> "Kafka ...")."""
    return _LEADING_PUNCT.sub("", search_query(text))


def search_terms(text: str) -> set[str]:
    """The search terms a passage must share with ``text`` to be about it: the analyzed terms of
    ``search_query(text)`` without those naming the documents or only asking ("tell", "explain");
    of CJK text only the character pairs with no function character (a single character, or "它的",
    says nothing on its own)."""
    return {term for term in _terms(search_query(text)) if _is_word(term)}


def key_terms(text: str) -> set[str]:
    """The ``search_terms`` of ``text`` that say what it is about: without the words that only ask
    (``ASKED``: "how many", 多少, 什么, 意思, "fix"). "错误码 E1024 是什么意思" -> 错误, 误码, e1024."""
    return search_terms(ASKED.sub(" ", search_query(text)))


def match_terms(text: str, request: bool = False) -> set[str]:
    """What the best passage must hold for ``strong_match``: the analyzed terms (of CJK text, characters
    and character pairs) of ``search_query(text)`` without the words that only ask (``ASKED``) and,
    for a system ``request``, without what makes it one (``intents.without_request``): "what time does
    the nightly backup run?" -> nightli, backup, run; "how much memory is free" -> none."""
    text = ASKED.sub(" ", search_query(text))
    return _terms(without_request(text) if request else text)


def _terms(text: str) -> set[str]:
    return {term for term in analyze(text) if term not in ROUTING_TERMS and term not in ASKING_TERMS}


def _is_word(term: str) -> bool:
    """A term that says something on its own: a word, or a CJK character pair that is no function pair:
    none of its characters only a function character (``FUNCTION_CHARS``: 的, 是, 吗, 它 ...), not both
    of them stop characters (``CJK_STOP_CHARS``: 那过, 在从), not one of ``FUNCTION_PAIRS`` (因为, 可以).
    ``CJK_STOP_CHARS`` serves recall and holds characters of content words too (``CONTENT_STOP_CHARS``:
    过期, 有效, 到期, 存在): a pair with one of them is a word ("缓存的过期时间" has 缓存 and 过期)."""
    if not _CJK.match(term):
        return True
    return (len(term) == 2 and not FUNCTION_CHARS.intersection(term) and not CJK_STOP_CHARS.issuperset(term)
            and term not in FUNCTION_PAIRS)


def _is_rare_candidate(term: str) -> bool:
    """A term whose rarity in the documents says what a question is about (``_rarest``): an
    English word or a number of more than one character, or a CJK pair without any function character
    (a pair across two words, 存的, is rare without meaning anything)."""
    if _CJK.match(term):
        return len(term) == 2 and not CJK_STOP_CHARS.intersection(term)
    return len(term) > 1


#: irregular past participles: with the -ed ones, the word ending a question with a be-form that says what
#: is done ("how long are backups kept?"; ``incidental_terms``)
IRREGULAR_PARTICIPLES = frozenset("""
kept held run left sent spent built written broken begun chosen done found given known lost made meant paid put
read said seen set shown shut sold told understood frozen hung fallen grown drawn fed led dealt caught brought
bought taught stuck hidden driven forgotten thrown blown flown worn torn got gotten taken rebuilt rewritten
overwritten undone split cut quit""".split())
_WH = r"(?:what|what's|which|who|whom|whose|where|when|why|how)"
_BE = r"(?:is|are|was|were|be|been|being|isn't|aren't|wasn't|weren't)"
_PARTICLE = r"(?:to|on|in|at|for|with|from|by|up|out|about|into|of|over|after|off|down|back)"
_ADVERBS = (r"(?:(?:not|still|always|usually|normally|typically|also|only|too|very|so|ever|never|already|"
            r"currently|really)\s+)*")
#: a word after a be-form that follows a content word: how something is or what is done to it ("backups
#: are kept", "when swap is high")
_AFTER_BE = re.compile(rf"\b([a-z][\w'-]*)\s+{_BE}\s+{_ADVERBS}([a-z][a-z-]*)\b", re.IGNORECASE | re.ASCII)
#: the be- or do-form of a question and what follows it ("what port does| the production database use?")
_AUXILIARY = re.compile(rf"^\W*(?:{_WH}\b[^?]*?)?\b({_BE}|do|does|did)\s+(.*)$", re.IGNORECASE | re.ASCII | re.DOTALL)
_PARTICLE_WORD = re.compile(rf"{_PARTICLE}", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z][\w'-]*", re.ASCII)


def _question_verb(text: str) -> str | None:
    """The verb of a question with a be- or do-form: the last word before the first particle after the
    form, behind a subject of at least one word; after a be-form only a participle ("-ed", or
    ``IRREGULAR_PARTICIPLES``): "use" of "what port does the production database use?", "escalate" of
    "who do I escalate to?", "kept" of "how long are backups kept on disk?"; not "threshold" of "is the
    disk above the threshold?" nor "password" of "what is the password of the Kafka cluster?"."""
    m = _AUXILIARY.search(text)
    if not m:
        return None
    words = _WORD.findall(m.group(2))
    end = next((i for i, w in enumerate(words) if _PARTICLE_WORD.fullmatch(w)), len(words))
    if end < 2:
        return None
    verb = words[end - 1]
    if m.group(1).lower() in ("do", "does", "did"):
        return verb
    low = verb.lower()
    return verb if low.endswith("ed") or low in IRREGULAR_PARTICIPLES else None


#: the English words of ``SETTING``: the kind of value asked
_SETTING_EN = re.compile(r"\b(?:thresholds?|alerts?|alarms?|limits?|polic(?:y|ies)|intervals?|settings?|"
                         r"config(?:ured|uration)?|rules?|retention|defaults?)\b", re.IGNORECASE)


def incidental_terms(text: str) -> set[str]:
    """The terms of the English words of a question that say how something is or what is done with it
    (a predicate: "kept" of "how many days of backups are kept?", "use" of "what port does the production
    database use?", "high" of "when swap is high") or the kind of value asked (``SETTING``: "threshold",
    "limit"). A passage answering may say it in other words ("keeps 14 days", "above 50%"), so such a term
    that no passage of the documents holds is neither what the question is about (``focus_of``) nor
    counted against its match (``_strong_match``): never the “nothing about …” of an answer. A noun the
    question asks about ("deployments" of "Who approves production deployments?") is none of these."""
    text = ASKED.sub(" ", search_query(text))
    words = [m.group(0) for m in _SETTING_EN.finditer(text)]
    words += [m.group(2) for m in _AFTER_BE.finditer(text)
              if _terms(m.group(1)) and not re.fullmatch(_WH, m.group(1), re.IGNORECASE)]
    verb = _question_verb(text)
    if verb:
        words.append(verb)
    return {t for w in words for t in _terms(w) if not _CJK.match(t)}


def names(text: str) -> dict[str, str]:
    """{term: word as written} of the names and identifiers ``text`` asks about (words that say
    "ask" or "look in the documents" left out): identifiers (``rerank.identifiers``: db-prod-01,
    ERR-4031), acronyms (SLA, API), words holding a digit (E1024) or an inner capital (pgBackRest),
    capitalized words not starting a sentence (Redis, Kafka), and every ASCII word of a Chinese text
    (根据知识库，Kafka 集群的密码是什么？ -> Kafka). A passage quoted for such a question holds them all."""
    text = ASKED.sub(" ", search_query(text))
    chinese = _CJK.search(text) is not None
    out: dict[str, str] = {}
    for ident in identifiers(text):
        for term in _terms(ident):
            out.setdefault(term, ident)
    for m in _ASCII_WORD.finditer(text):
        word = m.group()
        letters = sum(c.isalpha() for c in word)
        if not letters or len(word) < 2:
            continue
        if not (chinese or (word.isupper() and letters > 1) or any(c.isdigit() for c in word)
                or any(c.isupper() for c in word[1:])
                or (word[0].isupper() and not _starts_sentence(text, m.start()))):
            continue
        for term in _terms(word):
            out.setdefault(term, word)
    return out


def _starts_sentence(text: str, at: int) -> bool:
    """The word at ``at`` begins ``text`` or a sentence of it (only punctuation and spaces since a
    sentence end): its capital says nothing."""
    i = at - 1
    while i >= 0 and not text[i].isalnum():
        if text[i] in _SENTENCE_END:
            return True
        i -= 1
    return i < 0


#: a joined token (db-prod-01, payment-api, bk-3.internal, 02:30): its pieces are no words of their own
#: (``held_names``): "db" of db-prod-01 is no "DB", "api" of payment-api no "API"
_JOINED = re.compile(r"[A-Za-z0-9]+(?:[-_.:/][A-Za-z0-9]+)+", re.ASCII)
_JOINERS = re.compile(r"[-_.:/]")


def held_names(named: dict[str, str], text: str) -> set[str]:
    """The names of ``named`` ({term: word as written}, ``names``) that ``text`` (a passage) holds: an
    identifier (db-prod-01) every one of its terms; any other name one of its terms ("DB": db or
    database) in a word of its own, or written exactly as the question writes it inside a joined token
    ("Kafka" of "Kafka-based"), or an ops noun in the other language (``distill.other_language``: "DB"
    by 数据库). A piece of an identifier is no standalone name: db-prod-01 holds no "DB", payment-api
    no "API"."""
    words = set(named.values())
    if not words:
        return set()
    every, alone = set(analyze(text)), set(analyze(_JOINED.sub(" ", text)))
    pieces = {piece for m in _JOINED.finditer(text) for piece in _JOINERS.split(m.group())}
    out = set()
    for word in words:
        terms = _terms(word)
        if _JOINED.fullmatch(word) is not None:
            held = bool(terms) and terms <= every
        else:
            translated = {t for t in _terms(other_language(word)) if _is_word(t)}   # ("DB": 数据库)
            held = bool(terms & alone) or word in pieces or (bool(translated) and translated <= alone)
        if held:
            out.add(word)
    return out


def _asked_words(text: str, named: dict[str, str]) -> tuple[set[str], list[str]]:
    """What ``text`` asks about beyond its names: (its English key terms, its CJK runs), without the
    words that only ask (``ASKED``), name the documents (``ROUTING``) or say the kind of answer wanted
    (``ANSWER_KIND``)."""
    asked = ASKED.sub(" ", search_query(text))
    kind = {t for m in ANSWER_KIND.finditer(asked) for t in _terms(m.group(1))} | REFERRING_TERMS
    skip = kind.union(*(_terms(w) for w in named.values()))
    english = {t for t in _terms(_CJK_RUN.sub(" ", asked)) if t not in skip}
    return english, _CJK_RUN.findall(asked)


def _cjk_held(run: str, holds: set[str]) -> bool:
    """Every content character of the CJK ``run`` is in a character pair ``holds`` has that is a word
    (``_is_word``: 发布回滚 by 发布 and 回滚; 集群的密码 not by 密码 alone), or, a character with no word
    pair around it, held by itself."""
    for i, ch in enumerate(run):
        if ch in CJK_STOP_CHARS:
            continue
        pairs = [p for p in (run[i - 1:i + 1] if i else "", run[i:i + 2]) if len(p) == 2 and _is_word(p)]
        if not (any(p in holds for p in pairs) if pairs else ch in holds):
            return False
    return True


def holds_the_rest(text: str, named: dict[str, str], without: Iterable[str], passage: str) -> bool:
    """``passage`` holds everything ``text`` asks about but the names ``without``: its other names
    (``held_names``), each of its other English key terms and every content character of its Chinese
    (``_cjk_held``). "How often are the SSL certificates renewed?" and "TLS certificates are renewed
    by certbot every 60 days": yes, but for SSL; "What is the SLA of the payments API?" and a log of
    "payment-api": no (no standalone API); "Kafka 集群的密码是什么？" and "密码由 Vault 管理": no (集群)."""
    without = set(without)
    others = {t: w for t, w in named.items() if w not in without}
    if set(others.values()) - held_names(others, passage):
        return False
    holds = set(analyze(passage))
    english, runs = _asked_words(text, named)
    return english <= holds and all(_cjk_held(run, holds) for run in runs)


def beside_names(text: str, named: dict[str, str]) -> set[str]:
    """The key terms of ``text`` beyond its names, in either language (``distill.other_language``:
    "nginx 监听哪个端口？" -> 监听, 端口 and port)."""
    other = {t for t in _terms(other_language(text)) if _is_word(t)}
    return (key_terms(text) | other) - set(named)


def coverage(text: str, named: dict[str, str], passage: str) -> int:
    """How much of what ``text`` asks about ``passage`` holds: its names (``held_names``), English key
    terms and CJK word pairs."""
    holds = set(analyze(passage))
    english, runs = _asked_words(text, named)
    pairs = {run[i:i + 2] for run in runs for i in range(len(run) - 1) if _is_word(run[i:i + 2])}
    return len(held_names(named, passage)) + len(english & holds) + len(pairs & holds)


async def doc_freqs(source: Any, user_id: str, terms: Iterable[str]) -> dict[str, int] | None:
    """{term: how many passages of the documents ``user_id`` can read hold it}
    (``KnowledgeSource.doc_freqs``), or None when ``source`` cannot tell."""
    count = getattr(source, "doc_freqs", None)
    terms = set(terms)
    return await count(user_id, terms) if count is not None and terms else None


def _rarest(df: dict[str, int], held: bool = False) -> frozenset[str]:
    """Of the terms of ``df`` ({term: passages holding it}), those in the fewest passages; a CJK pair in
    no passage is left out, and with ``held`` every term in none."""
    known = {t: n for t, n in df.items() if n or not (held or _CJK.match(t))}
    if not known:
        return frozenset()
    low = min(known.values())
    return frozenset(t for t, n in known.items() if n == low)


async def focus_of(source: Any, user_id: str, text: str, terms: Iterable[str] | None = None) -> Focus:
    """``text`` as a ``Focus``: its rarest term(s) among ``terms`` (default: its ``key_terms``), not
    counting the kind of answer it asks for (``ANSWER_KIND``: "which hosts", "what port") nor an
    ``incidental_terms`` one that no passage holds (``Focus.idle``: "kept", "high"), and when it
    names something (``names``), the rarest of the other terms that the documents hold (``beside``; a
    term no passage holds is not asked for, and an ops noun counts in either language,
    ``distill.other_language``: "port" of "What is the port of Redis?" is held by "Redis 的端口是 6380");
    ``unknown``: the names no passage holds any term of."""
    focus = Focus(text)
    kind = {t for m in ANSWER_KIND.finditer(text) for t in _terms(m.group(1))} | REFERRING_TERMS
    wanted = {t for t in set(key_terms(text) if terms is None else terms) - kind if _is_rare_candidate(t)}
    named_words = names(text) if wanted else {}
    named = set(named_words)
    incidental = incidental_terms(text) - named if wanted else set()
    counted = await doc_freqs(source, user_id, wanted | named | incidental)
    if counted is not None:       # (in no passage: the documents may say it in other words, "keeps")
        focus.idle = frozenset(t for t in incidental if not counted.get(t))
    df = {t: n for t, n in (counted or {}).items() if t in wanted and t not in focus.idle}
    focus.rarest = _rarest(df)
    if counted is not None:      # (names in no passage: no term of theirs is held anywhere)
        focus.unknown = frozenset(w for w in set(named_words.values())
                                  if not any(counted.get(t) for t, v in named_words.items() if v == w))
    if named:
        beside = _rarest({t: n for t, n in df.items() if t not in named}, held=True)
        # (in either language: "port" of "What is the port of Redis?" is held by "Redis 的端口是 6380")
        other = other_language(" ".join(words_for(text, beside))) if beside else ""
        focus.beside = beside | {t for t in _terms(other) if _is_word(t) and _is_rare_candidate(t)}
    return focus


def words_for(text: str, terms: Iterable[str]) -> list[str]:
    """How ``text`` writes ``terms``: the word (or CJK pair) each comes from, in the text's order."""
    wanted, out = set(terms), []
    for m in re.finditer(rf"{_ASCII_WORD.pattern}|[\u3400-\u9fff\uf900-\ufaff]+", text):
        word = m.group()
        found = [t for t in (_terms(word) if not _CJK.match(word) else
                             [word[i:i + 2] for i in range(len(word) - 1)]) if t in wanted]
        for t in found:
            wanted.discard(t)
            shown = word if not _CJK.match(word) else t
            if shown not in out:
                out.append(shown)
    return out + sorted(wanted)


def statement_items(text: str) -> list[tuple[str, str]]:
    """What the user memory does with the message when every sentence of it is a fact or preference
    it keeps (``distill_rules``: (kind, text)) or takes something back (``takes_back``: ("forget",
    what) or ("no longer", "<subject> is <value>")), nothing else asked: those, the kept ones first;
    else []. Each sentence is tested on its own: one may give two items ("生产数据库是 db-prod-1，备份在
    杭州机房", ``distill._statements``), and one that takes something back ("日志服务器不是 log-1 了") makes
    the message no question, so it is never answered from the user memory (``offline``: only a message
    with no item is)."""
    parts = sentences(text)
    if not parts or len(parts) > MAX_ITEMS_PER_MESSAGE:      # (more sentences than items are ever kept)
        return []
    if not all(distill_rules(part) or takes_back(part) for part in parts):
        return []
    return distill_rules(text) + takes_back(text)


def covered(terms: set[str], passage: str) -> int:
    """How many of the (analyzed) search ``terms`` the passage holds."""
    return len(terms & set(analyze(passage)))


def _refers_to(text: str, prev_answer: str) -> bool:
    """``text`` is a follow-up of the documents answer ``prev_answer``: it refers back to it, or shares a
    search term with the passages it quoted (a thanks or a greeting never is)."""
    if COURTESY.fullmatch(text.strip()):
        return False
    return REFERS_BACK.search(text) is not None or covered(search_terms(text), prev_answer) > 0


async def decide(text: str, messages: list[dict[str, Any]], source: Any, user_id: str,
                 tool_intents: list[str], *, stated: bool = False, remembered: bool = False) -> Route:
    """The offline agent's route for one message (see the module doc for the rule); ``stated``: the
    message only states facts or preferences (``statement_items``); ``remembered``: what the user told
    the assistant answers it (``memory_answers``), so it is no follow-up to the documents."""
    if source is None:
        return Route("general", "no_knowledge_base", "this server has no knowledge base")
    if not await source.has_documents(user_id):
        return Route("general", "no_documents", "the user can see no document")
    readings = mixed_readings(text, tool_intents)
    m = KEYWORDS.search(text)
    if m or readings:
        focus = await focus_of(source, user_id, text)
        if readings:            # (the passages quoted are about what is read: "swap", not the disk)
            focus.subjects = focus.rarest = frozenset().union(*reading_subjects(text, readings).values())
        why = f"the message mentions {m.group(0)!r}" if m else "the message asks about a setting"
        if readings:
            why += f" and whether a reading ({', '.join(readings)}) is past it"
        return Route("knowledge", "keyword" if m else "reading_and_documents", why, _query(text) or text, focus,
                     readings)
    if tool_intents:
        if OUTRANKED.issuperset(tool_intents) and not COMMAND.match(text) and not live_reading(text, tool_intents):
            asked = match_terms(parsed_part(text), request=True)
            # "那过期时间呢？" after a documents answer: no clock reading; a port check is never a follow-up
            if "network_check" not in tool_intents and any(map(_is_word, asked)):
                route = await _follow_up(source, user_id, text, messages, remembered, asked)
                if route is not None:
                    return route
            route = await _strong_match(source, user_id, text, asked,
                                        f" the system request ({', '.join(tool_intents)}) leaves")
            if route is not None:
                return route
        return Route("general", "intent", f"a system request: {', '.join(tool_intents)}")
    if stated:
        return Route("general", "statement", "the message states facts or preferences to keep, asks nothing")
    route = await _follow_up(source, user_id, text, messages, remembered)
    if route is not None:
        return route
    question = not remembered and QUESTION.search(text) is not None
    route = await _strong_match(source, user_id, text, match_terms(text), " of the message", named=names(text),
                                question=question, missing=question and not about_the_machine(text))
    return route or Route("general", "default", "no document mention and no strong match")


def topic(answer: str) -> str:
    """The section the documents answer ``answer`` quoted first: the last heading of its first citation
    ("[runbook.md §Runbook > Environments > Staging, lines 26-27]" -> "Staging"); "" without one."""
    m = CITATION.search(answer)
    if not m:
        return ""
    location = _LOCATION_TAIL.sub("", m.group(0)[1:-1].split(" §", 1)[1])
    return "" if location == "start" or re.fullmatch(r"(?:p\. \d+|lines? [\d-]+)", location) else \
        location.split(" > ")[-1]


async def _follow_up(source: Any, user_id: str, text: str, messages: list[dict[str, Any]], remembered: bool,
                     asked: set[str] | None = None) -> Route | None:
    """The ``follow_up`` route when ``text`` follows up the previous documents answer, else None. The
    query: the previous question, the section the previous answer quoted first (``topic``: "and the
    maintenance window?" after an answer about staging searches staging's) and ``text``. ``asked``:
    of a system request, its terms beyond the request (the focus's rarest term is one of them)."""
    prev_answer = _previous(messages, "assistant")
    prev_question = _asked_about(messages)
    if not (prev_answer and prev_answer.startswith((ANSWER_HEAD_EN, ANSWER_HEAD_ZH)) and CITATION.search(prev_answer)
            and prev_question and is_follow_up(text) and not remembered and _refers_to(text, prev_answer)):
        return None
    section = topic(prev_answer)
    query = _query(f"{prev_question} {section} {text}")
    own = key_terms(text)
    focus = await focus_of(source, user_id, text if own else query,
                           (own & asked if asked is not None else own) or None)
    return Route("knowledge", "follow_up", "a short follow-up to an answer from the documents"
                 + (f" (about {section!r})" if section else ""), query, focus)


async def _strong_match(source: Any, user_id: str, text: str, terms: set[str], of: str, *,
                        named: dict[str, str] | None = None, question: bool = False,
                        missing: bool = False) -> Route | None:
    """The ``strong_match`` route when the best passage for ``text`` holds at least ``STRONG_SHARE`` of
    the ``match_terms`` ``terms``, among them at least ``STRONG_MIN_TERMS`` words (``_is_word``: of
    Chinese, character pairs), and what the message is about: without ``named`` names (``names``), one
    of the rarest of ``terms`` (``_rarest``); with names, every one of them (``held_names``: a piece
    of an identifier is no standalone name) and one of ``Focus.beside`` (the rarest of the other key
    terms the documents hold: 超时 of "redis 连接超时怎么办"). A best passage holding every name routes
    there without the share ("What is the port of Redis?" over Chinese documents), when it is a
    ``question`` (not answered by the user memory). A name the best passage lacks does not refuse by
    itself: one some passage of the documents holds ("Sunday" of "Where do the PagerDuty alerts go on
    Sunday?") leaves the passage with the share quoted (``Focus.lacking`` noted); one no passage holds
    (``Focus.unknown``: "SSL", "SLA") too when the passage with the share holds everything else the
    question asks (``holds_the_rest``: "How often are the SSL certificates renewed?"), else the
    question gets the ``missing_term`` route and the answer says the documents have nothing about it
    ("What is the SLA of the payments API?" -> I found nothing about “SLA” in your documents.). So does
    a question the documents could answer (``missing``: not one about what happens on the machine,
    ``about_the_machine``) whose best passage holds its share but not what it is about, or that names
    something its best passage lacks without the share. What was decided is kept in the focus
    (``Focus.decided``) for the answer to follow. Else None."""
    named = named or {}
    if not any(map(_is_word, terms)) and not named:
        return None
    focus = await focus_of(source, user_id, text, terms)
    terms = set(terms) - focus.idle      # ("kept" of "how long are backups kept?" over "keeps 14 days")
    words = [t for t in terms if _is_word(t)]
    one = question and not named and len(words) == 1 and not _CJK.match(words[0]) and len(words[0]) >= ONE_TERM_MIN_CHARS
    if len(words) < STRONG_MIN_TERMS and not named and not one:
        return None
    hits = await source.search(user_id, text, 1)
    if not hits:
        if not (named and missing):
            return None
        focus.decided, focus.absent = "nothing", tuple(w for w in dict.fromkeys(named.values()) if w in focus.unknown)
        return Route("knowledge", "missing_term", f"no passage holds {', '.join(named.values())}", _query(text), focus)
    best = hits[0]
    passage = best.text + " " + " ".join(best.location.get("heading", []))
    holds = set(analyze(passage))
    held = terms & holds
    shared = sum(map(_is_word, held)) >= (1 if one else STRONG_MIN_TERMS) and len(held) >= STRONG_SHARE * len(terms)
    focus.best = best.citation
    lacking: list[str] = []
    refused = False          # (what the question is about is in no passage: say so, quote nothing)
    if named:
        have = held_names(named, passage)
        lacking = [w for w in dict.fromkeys(named.values()) if w not in have]
        unknown = [w for w in lacking if w in focus.unknown]
        if unknown and not (shared and holds_the_rest(text, named, unknown, passage)):
            absent, refused = unknown, True
        elif not lacking and focus.beside and not focus.beside & holds:
            absent, refused = words_for(text, focus.beside), True   # (the names, not what about them: 超时)
        else:
            absent = lacking
    else:
        absent = words_for(text, focus.rarest - holds) if focus.rarest and not focus.rarest & holds else []
        refused = bool(absent)
    if not refused and (shared or (named and question and not absent)):
        why = f"holds {len(held)} of the {len(terms)} search terms{of}" if shared else \
            f"holds {', '.join(dict.fromkeys(named.values()))}, named in the message"
        if absent:
            why += f"; not {', '.join(repr(w) for w in absent)}, " + \
                ("which no passage holds" if set(absent) <= focus.unknown else "held elsewhere")
        focus.decided, focus.lacking = "quote", tuple(absent)
        return Route("knowledge", "strong_match", f"{best.citation} {why}", text, focus)
    if missing and (shared or named):
        focus.decided, focus.absent = "nothing", tuple(absent)
        return Route("knowledge", "missing_term",
                     f"{best.citation} holds {len(held)} of the {len(terms)} search terms{of}, not "
                     f"{', '.join(repr(w) for w in absent)}", _query(text), focus)
    return None
