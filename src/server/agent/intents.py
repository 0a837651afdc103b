"""Intent recognition for the offline agent: Chinese and English requests -> tool calls.

Each intent has weighted patterns; an intent is kept when its score reaches ``THRESHOLD``. A few
rules resolve overlaps: a history question wins over everything (its topic may mention CPU or
nginx), a process listing absorbs the CPU/memory words that only choose its sort order, a
host:port check replaces the generic network report. Deterministic: no model, no network.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from server.agent.downloads import parse_download_request
from server.agent.file_intents import arabic_numbers, parse_file_request, paths_in
from server.memory.when import DAY_WORDS_EN as _DATE_EN, DAY_WORDS_ZH as _DATE_ZH   # days the recall index resolves

THRESHOLD = 1.0
MAX_PARSE_CHARS = 2_000      # a longer message (a pasted log) is parsed by its first and last 1,000 characters
CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
#: Chinese punctuation (、。「」【】…, the full-width forms ？！，：；（）): a message of it alone ("？") is Chinese
CJK_PUNCT = re.compile(r"[\u3000-\u303f\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65]")
_LETTERS = re.compile(r"[A-Za-z]")


def is_chinese(text: str) -> bool:
    """A Chinese character, or Chinese punctuation in a message without Latin letters ("？", "。。。";
    "CPU？" stays English)."""
    return CJK.search(text) is not None or (CJK_PUNCT.search(text) is not None and _LETTERS.search(text) is None)


@dataclass(slots=True)
class Intent:
    name: str                      # cpu, memory, disk, network, load, uptime, overview, processes,
    score: float                   # network_check, read_log, list_dir, read_file, search_files, history, clock, help,
    tool: str | None = None        # refuse (a request to act), log_path (a log named by no path)
    arguments: dict[str, Any] = field(default_factory=dict)
    note: str | None = None        # what the answer adds to the tool's result (``answers.NOTES``: "io_not_measured")


def _p(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, _FLAGS)


# ASCII matching: Python's \w (and so \b) counts CJK characters as word characters, so "RAM占用" has no
# \b after "RAM" and [\w.-]+ swallows the Chinese words around a name. (CJK literals still match.)
_FLAGS = re.IGNORECASE | re.ASCII

# (intent, [(pattern, weight)]): English words use \b boundaries (ASCII ones); Chinese has none.
RULES: list[tuple[str, list[tuple[re.Pattern[str], float]]]] = [
    ("cpu", [(_p(r"\bcpus?\b|cpu"), 1.0), (_p(r"\bprocessor\b|处理器"), 1.0)]),
    ("memory", [(_p(r"\b(memory|ram|swap|mem)\b"), 1.0), (_p(r"内存|交换分区|交换空间"), 1.0)]),
    ("disk", [(_p(r"\b(disks?|storage|filesystems?|partitions?|df)\b|disk\s+space"), 1.0),
              (_p(r"磁盘|硬盘|存储|分区|文件系统"), 1.0), (_p(r"空间"), 0.5)]),
    ("network", [(_p(r"\b(network|interfaces?|nics?|bandwidth|traffic|ip\s+address(es)?)\b"), 1.0),
                 (_p(r"网络|网卡|接口|流量|带宽|ip\s*地址"), 1.0)]),
    ("load", [(_p(r"\bload(\s+average)?\b|\bloadavg\b"), 1.0), (_p(r"负载"), 1.0)]),
    ("uptime", [(_p(r"\buptime\b|\bboot(ed)?\b|how long .*\b(up|running)\b"), 1.0),
                (_p(r"运行时间|开机|启动时间|运行了多久|运行多久|上次重启|重启时间|什么时候重启"), 1.0)]),
    ("overview", [(_p(r"\b(system|server|machine|host)\b.*\b(status|health|overview|doing)\b|"
                      r"\bhow is (the )?(system|server|machine)\b|\bstatus\b"), 1.0),
                  (_p(r"系统状态|服务器状态|系统概况|系统情况|服务器怎么样|系统怎么样|机器怎么样|健康(?!检查|检测|探测|探针)"), 1.0)]),
    ("processes", [(_p(r"\bprocess(es)?\b|\bps\b|\btasks?\b"), 1.0),
                   (_p(r"\b(top|most|heaviest|hungriest)\b.*\b(using|consuming|by)\b"), 0.5),
                   (_p(r"进程|程序.*(最多|最高)|占用.*最(多|高)|最.*占用"), 1.0)]),
    ("history", [(_p(r"\b(did|have|had)\s+(i|we)\b.*\b(ask|say|mention|talk|discuss)"), 1.0),
                 (_p(r"\bi\s+(asked|said|mentioned)\b|\bwe\s+(talked|discussed)\b"), 1.0),
                 (_p(r"\b(earlier|before|previously|last time|history|past conversations?)\b"), 0.5),
                 (_p(r"\bsearch\b.*\b(history|conversations?|chats?)\b"), 1.0),
                 (_p(r"(之前|以前|上次|刚才|曾经).*(问|聊|说|提|讨论)|(问过|聊过|说过|提到过|讨论过)"), 1.0),
                 (_p(r"搜索.*(历史|记录|对话)|历史记录|聊天记录"), 1.0)]),
    # "today" / 今天 asks the date only about the day itself ("what's today?", "今天几号", "今天是什么日子",
    # "today?"): "did the backup fail today?", "今天备份失败了吗" ask what happened, which no clock answers
    ("clock", [(_p(r"\bwhat time\b|\b(current )?time is it\b|\bdate\b|\bwhat day\b|\bclock\b|"
                   r"\bwhat(?:['’]s|\s+is)\s+today\b|^\W*today\W*$|"
                   r"(?<!much )(?<!long )\btime\b(?!\s*out)"), 1.0),      # ("how much time": a duration)
               (_p(r"几点|(?<!运行)(?<!启动)(?<!长)(?<!多少)时间|日期|几号|星期几|周几|礼拜几|"
                   r"今天(?:是)?(?:什么日子|哪一?天|几月几|多少号)|^[\s?？!！。.,，]*今天[\s?？!！。.,，]*$"), 1.0)]),   # (多长时间: a duration)
    ("help", [(_p(r"^\s*(hi|hello|hey|help|\?|good\s+(?:morning|afternoon|evening)|are\s+you\s+there|who\s+are\s+you)"
                  r"\s*[!.?]*\s*$|\bwhat can you do\b|\bhelp\b|\bcapabilit|\bwho are you\b"), 1.0),
              (_p(r"^\s*(你好|您好|嗨|帮助|在吗|在不在|在么|早上好|早安|上午好|中午好|下午好|晚上好|嗯+|[?？]+)\s*"
                  r"[!！。?？~～，,]*\s*$|你能做什么|能做什么|有什么功能|怎么用|帮助|你是谁|你是什么"), 1.0)]),
]

#: "what do you remember about me": the user's long-term memory (user_memory)
_REMEMBERED = re.compile(r"\bwhat (?:do|did|have) you (?:remember(?:ed)?|know|recall|keep)\b.*\b(?:me|my)\b|"
                         r"\bwhat do you remember\s*[?.!]*\s*$|"
                         r"你(?:还)?(?:记得|知道|记住了|记住)(?:关于)?我(?:的)?(?:什么|哪些|些什么)|"
                         r"你(?:都)?记住了(?:什么|哪些)|关于我你(?:记得|知道)(?:什么|哪些)", _FLAGS)

_HOST_PORT = re.compile(r"(\[[0-9a-fA-F:]+\]|\d{1,3}(?:\.\d{1,3}){3}|[A-Za-z][\w.-]*)\s*:\s*(\d{1,5})\b", re.ASCII)
_PORT_WORD = re.compile(r"(?:\bport\b|端口)\s*(?:号|number)?\s*[:：]?\s*(\d{1,5})\b|(\d{1,5})\s*(?:号)?\s*端口", _FLAGS)
_HOST_WORD = re.compile(r"(?:\bon\b|\bat\b|\bof\b|\bto\b|主机|在)\s*(\[[0-9a-fA-F:]+\]|\d{1,3}(?:\.\d{1,3}){3}|"
                        r"[A-Za-z][\w.-]*)", _FLAGS)
#: a message that is only host:port ("127.0.0.1:6379", "localhost:8080?"): check it
_ONLY_TARGET = re.compile(r"\s*(?:\[[0-9a-fA-F:]+\]|\d{1,3}(?:\.\d{1,3}){3}|localhost)\s*:\s*\d{1,5}\s*[?？]?\s*", _FLAGS)
_BARE_HOST = re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}|\blocalhost\b|::1)", _FLAGS)
_LINES = re.compile(r"(\d{1,5})\s*(?:lines?|行)", _FLAGS)
_TOPN = re.compile(r"\btop\s+(\d{1,3})\b|前\s*(\d{1,3})|(\d{1,3})\s*个\s*(?:\S{0,8}?)\s*(?:进程|程序)", _FLAGS)
_NAMED = re.compile(r"\b(?:named|called|matching)\s+[\"']?([\w.\-]+)|\b([A-Za-z][\w.\-]*)\s*(?:的)?\s*进程|"
                    r"\b([A-Za-z][\w.\-]*)\s+process(?:es)?\b", _FLAGS)
_NOT_NAMES = {"top", "the", "all", "running", "which", "what", "heaviest", "biggest", "memory", "cpu", "list",
              "show", "any", "my", "some", "of", "by", "most", "hungry", "ram", "mem", "rss"}
_BY_MEMORY = re.compile(r"\b(memory|ram|mem|rss)\b|内存", _FLAGS)
_LOG_WORDS = re.compile(r"\b(tail|log|logs|syslog)\b|日志", _FLAGS)
#: a log asked to be shown without saying which ("看下错误日志", "show me the error log"): ask for its path
_LOG_ASKED = re.compile(r"^\s*(?:(?:please|can\s+you|could\s+you)\s+)?(?:show|tail|view|open|read|check)\b.*\blogs?\b|"
                        r"(?:查看|看下|看一下|看看|显示|打开|读取|帮我看).*日志", _FLAGS)
#: disk input/output asked: sys_monitor measures space only, and the answer says so
_DISK_IO = re.compile(r"\bi/?o\b|\biops\b|\bthroughput\b|读写|吞吐", _FLAGS)
_CHECK_WORDS = re.compile(r"\b(check|port|reachable|connect|open|listening|ping)\b|端口|连通|连接|检查|检测|能否", _FLAGS)
#: what makes "port N" a request to check it rather than a statement of a setting ("Redis port: 6380"):
#: a check word other than "port", or a question
_CHECK_ASKED = re.compile(r"\b(check|reachable|connect|open|listening|ping|test|up|alive)\b|连通|连接|检查|检测|能否|"
                          r"开放|是否|有没有|通不通|[?？吗呢]\s*$", _FLAGS)

#: the words of a system request that name no subject of their own: asking to look ("show", "查看"),
#: what is measured ("usage", "剩余"), the machine itself ("server", "系统") (``without_request``)
REQUEST_WORDS = _p(r"\b(?:show|check|list|display|view|see|give|current(?:ly)?|now|usage|used|use|using|"
                   r"utili[sz]ation|free|available|left|remaining|total|status|stats?|statistics|info(?:rmation)?|"
                   r"percent(?:age)?|server|system|machine|host|box|this|top)\b|"
                   r"查看|检查|检测|显示|列出|看看|看一下|查一下|查询|当前|现在|目前|实时|使用率|使用情况|使用量|"
                   r"占用率|占用|使用|用量|剩余|还剩|剩下|可用|空闲|情况|状态|信息|总共|总量|大小|服务器|系统|机器|"
                   r"本机|主机|一下|最多|最高")
#: the machine a reading is taken on, named rather than implied: a host name (a name with a digit or a
#: dot: "web-01", "gw-east-2.internal"), "the web server", "the database machine", 生产环境, 数据库服务器,
#: and when: "right now", "at the moment" (``without_request``: like host:port, it says where to look)
PLACE = _p(r"\b(?=[A-Za-z][\w-]*[\d.])[A-Za-z][A-Za-z0-9]*(?:[-.][A-Za-z0-9]+)+\b|"
           r"\b[A-Za-z][\w-]*\s+(?:servers?|hosts?|machines?|box(?:es)?|nodes?|clusters?|instances?|vms?)\b|"
           r"\bright\s+now\b|\bat\s+(?:the\s+)?(?:moment|present)\b|"
           r"[\u3400-\u9fff]{0,3}(?:环境|服务器|机器|主机|节点|集群)")
#: a command to look at the machine ("check port 22", "show disk usage", "查看CPU使用率"): its tool, always
COMMAND = _p(r"^\s*(?:(?:please|pls|can\s+you|could\s+you)\s+)?(?:check|show|list|display|tail|ping|test|monitor)\b|"
             r"^\s*(?:请|麻烦|帮我|给我)*(?:查看|检查|检测|显示|列出|看看|看一下|查一下|测试)")

_TOPIC_EN = [
    re.compile(r"\b(?:about|regarding|on|for)\s+[\"']?(.+?)[\"']?\s*(?:\b(?:earlier|before|previously|last time|"
               r"in the past|ago)\b.*)?[?.!]*\s*$", _FLAGS),
    re.compile(r"\bsearch\s+(?:my\s+)?(?:history|conversations?|chats?)\s+(?:for\s+)?(.+?)[?.!]*\s*$", _FLAGS),
]
#: a history question that names no topic ("what did we talk about?", "what did I ask earlier?"): the recent turns
_NO_TOPIC_EN = re.compile(r"^\s*what\s+(?:did|have|had)\s+(?:i|we)\s+(?:\w+\s+)?(?:ask(?:ed)?|say|said|mention(?:ed)?|"
                          r"talk(?:ed)?|discuss(?:ed)?|chat(?:ted)?)(?:\s+about)?(?:\s+(?:earlier|before|previously|"
                          r"last\s+time|just\s+now|so\s+far|recently))?\s*[?.!]*\s*$", _FLAGS)
# (.*?) may be empty: "我们之前聊过什么" asks no topic (the lazy (.+?) took 什 of 什么); 了 after the verb
# ("我刚才问了什么") is no topic either
_TOPIC_ZH = [
    re.compile(r"(?:问过|聊过|说过|提到过?|讨论过|问|聊|说|提|讨论)(?:过|了)?(?:关于)?\s*(.*?)\s*"
               r"(?:的|什么|啥|哪些|吗|么|嘛|呢|事情?|问题|相关|内容|东西|了)*\s*[？?。！!]*\s*$"),
    re.compile(r"搜索(?:一下)?(?:历史|记录|对话|聊天记录)*\s*(?:中|里)?(?:的|关于)?\s*(.+?)\s*[？?。！!]*\s*$"),
]
_TOPIC_STOP = re.compile(r"^(?:i|me|you|it|that|this|什么|啥|了)$", _FLAGS)
#: the query of a history question that names neither a topic nor a day: the turns of the last 7 days
#: (each a relative day the recall index resolves, ``server.memory.when``; the answer lists them newest first)
RECENT_QUERY = "today yesterday 2 days ago 3 days ago 4 days ago 5 days ago 6 days ago"
#: hits asked of history_search for a question about a day or the recent turns (its schema allows 1..20)
HISTORY_DAY_LIMIT = 10
_JUST_NOW = re.compile(r"刚才|刚刚|\bjust now\b|\ba moment ago\b", _FLAGS)


def _score(text: str) -> dict[str, float]:
    scores: dict[str, float] = {}
    for name, patterns in RULES:
        s = sum(w for pat, w in patterns if pat.search(text))
        if s:
            scores[name] = s
    return scores


def history_topic(text: str) -> str | None:
    """The subject of a history question ("what did I ask about nginx earlier" -> "nginx"); None when
    it names none (also for "我们之前聊过什么": see ``history_arguments``)."""
    return _topic(split_days(text)[0]) or None


def split_days(text: str) -> tuple[str, str]:
    """(``text`` without its relative days, the days as said): "昨天我问过 redis 的什么问题" ->
    ("我问过 redis 的什么问题", "昨天"); "what did I ask about redis 3 days ago" -> ("what did I ask about
    redis", "3 days ago"). The days are those ``server.memory.when`` resolves (yesterday, last Tuesday,
    3 days ago, 昨天, 前天, 上周二, 三天前, 上周)."""
    said = [m.group(0) for pat in (_DATE_EN, _DATE_ZH) for m in pat.finditer(text)]
    for pat in (_DATE_EN, _DATE_ZH):
        text = pat.sub(" ", text)
    return re.sub(r"\s+", " ", text).strip(), " ".join(said)


def _topic(text: str) -> str | None:
    """The topic of a history question without its days: a topic, "" for a question that names none
    ("我们之前聊过什么", "what did we talk about?"), None when the question is not understood."""
    if _NO_TOPIC_EN.search(text):
        return ""
    asked = False
    for pat in (_TOPIC_ZH if is_chinese(text) else _TOPIC_EN) + (_TOPIC_EN if is_chinese(text) else []):
        m = pat.search(text)
        if m:
            asked = True
            topic = m.group(1).strip(" \"'“”‘’,，。?？")
            topic = re.sub(r"^(?:过|了|关于|about)\s*", "", topic, flags=re.IGNORECASE).strip()
            topic = re.sub(r"^(?:the|a|an|my|our)\s+", "", topic, flags=re.IGNORECASE)   # "the CPU" -> "CPU"
            if topic and not _TOPIC_STOP.match(topic):
                return topic[:200]
            if topic:
                return None         # "what did I ask about it": which "it" is not known
    return "" if asked and is_chinese(text) else None


def history_arguments(text: str) -> dict[str, Any] | None:
    """history_search's arguments for a history question, or None. The days it names ("昨天",
    "last Tuesday") stay out of the topic and are added to the query as said: the recall index turns
    them into those days' date terms (``recall.query_terms``) and the answer keeps to the turns of those
    days (``answers._history``). No topic: the turns of the days named, else of the last 7 days
    (``RECENT_QUERY``); "刚才" / "just now": this conversation's only."""
    rest, days = split_days(text)
    topic = _topic(rest)
    if topic is None:
        return None
    if topic:
        return {"query": f"{topic} {days}"[:200], "limit": HISTORY_DAY_LIMIT} if days else {"query": topic}
    args: dict[str, Any] = {"query": days or RECENT_QUERY, "limit": HISTORY_DAY_LIMIT}
    if _JUST_NOW.search(text) and not days:
        args["current_session_only"] = True
    return args


def _network_target(text: str) -> tuple[str, int] | None:
    m = _HOST_PORT.search(text)
    if m and not m.group(1).lower().startswith(("http", "https")):
        return m.group(1).strip("[]"), int(m.group(2))
    pm = _PORT_WORD.search(text)
    if not pm:
        return None
    port = int(pm.group(1) or pm.group(2))
    hm = _HOST_WORD.search(text) or _BARE_HOST.search(text)
    host = hm.group(1).strip("[]") if hm else "localhost"
    if host.lower() in ("port", "the", "a"):
        host = "localhost"
    return host, port


def _process_args(text: str) -> dict[str, Any]:
    args: dict[str, Any] = {"sort_by": "memory" if _BY_MEMORY.search(text) else "cpu"}
    m = _TOPN.search(arabic_numbers(text))     # "前三", "两个": the count in digits (the name as said)
    if m:
        args["limit"] = max(1, min(50, int(next(g for g in m.groups() if g))))
    for nm in _NAMED.finditer(text):
        name = next(g for g in nm.groups() if g)
        if name.lower() not in _NOT_NAMES:
            args["name"] = name
            break
    return args


#: a service's log named without a path ("nginx 的 error log", "看下 nginx 的错误日志"): its usual place
#: under a log root, <name>/error.log or <name>/access.log
_NAMED_LOG = re.compile(r"\b([A-Za-z][\w.-]*)\s*(?:的)?\s*(?:(error|access)[\s_-]*logs?\b|(错误|访问)日志)", _FLAGS)
_LOG_KIND = {"错误": "error", "访问": "access"}


def _log_args(text: str) -> dict[str, Any] | None:
    paths = [p for p in paths_in(text) if p != "/"]   # absolute, relative to a log root, or a file name
    named = _NAMED_LOG.search(text)
    if not paths and named and named.group(1).lower() not in _NOT_NAMES | {"the", "an", "a", "my"}:
        paths = [f"{named.group(1)}/{(named.group(2) or _LOG_KIND[named.group(3)]).lower()}.log"]
    if not paths:
        return None
    args: dict[str, Any] = {"path": paths[0]}
    m = _LINES.search(arabic_numbers(text))    # "最后二十行": the count in digits (never the path's numerals)
    if m:
        args["lines"] = max(1, int(m.group(1)))
    return args


def without_request(text: str) -> str:
    """``text`` without what makes it a system request: the words of every intent rule (``RULES``), a
    port check's words and target (host:port, "port N"), the machine the reading is taken on and when
    (``PLACE``: "web-01", "the web server", 生产环境, "right now") and ``REQUEST_WORDS``, each replaced by
    a space. What is left is what the message asks beyond the machine: "what time does the nightly
    backup run?" -> "does the nightly backup run?", "磁盘使用率超过多少会触发告警" -> "超过多少会触发告警",
    "how much memory is free" -> "how much is", "what's the CPU usage on web-01 right now?" -> "what's
    the on" (the knowledge route compares it with the documents). Callers pass a bounded text
    (``parsed_part``): several of these patterns cost the square of the text's length."""
    for pattern in [p for _, patterns in RULES for p, _ in patterns] + [
            _HOST_PORT, _PORT_WORD, _BARE_HOST, _CHECK_WORDS, _CHECK_ASKED, PLACE, REQUEST_WORDS]:
        text = pattern.sub(" ", text)
    return text


def parsed_part(text: str) -> str:
    """What ``parse`` looks at: ``text``, or for one longer than ``MAX_PARSE_CHARS`` (a pasted log,
    never a short command) its first and last ``MAX_PARSE_CHARS // 2`` characters, where the request
    is ("check this log: ...", "... what is wrong here?"). The rules' regexes then cost the same
    for a 32,000-character paste as for a short question."""
    if len(text) <= MAX_PARSE_CHARS:
        return text
    half = MAX_PARSE_CHARS // 2
    return f"{text[:half]}\n{text[-half:]}"


#: a request to act on the machine (kill, delete, restart, run, stop, ...): the tools are read-only, so it is
#: refused (``answers.refusal``) before any tool intent. Only an imperative aimed at something counts
#: (``is_request_to_act``): the verb first (after "please" / "帮我" / "请"; in Chinese also first in a clause)
#: followed by what it acts on (a name, a pid, a path, a shell flag, or a system thing: a process, a service,
#: a file, the firewall, ...), or 把 <something> <verb> ("帮我把 pid 5708 的进程杀掉"), and never a question.
#: So "why did nginx stop?", "停止的进程有哪些", "show stopped containers", "run time of the backup", "nginx 重启过吗",
#: "运行中的进程有哪些", "你运行在哪台机器上", "启动项有哪些", "run queue length?" are questions, "Format the answer
#: as a table: ..." asks about the answer, and "Stop, show me the CPU usage instead" asks for the CPU usage.
_ACT_PREFIX_EN = (r"^\s*(?:(?:please|pls|kindly|can\s+you|could\s+you|would\s+you|will\s+you|go\s+ahead\s+and|just|"
                  r"i\s+want\s+you\s+to|i\s+need\s+you\s+to)\s+)*")
#: words that are no object of the verb before them: pronouns, articles, prepositions, adverbs and gerunds
#: ("start over", "stop it", "move on to ...", "run through the list", "stop talking"), and what a run, a
#: start or a stop is measured by ("run time", "restart count", "run queue")
_NOT_OBJECT_EN = (r"(?:a|an|the|me|us|you|it|them|him|her|this|that|these|those|my|your|our|their|its|all|any|and|or|"
                  r"but|so|if|then|now|here|there|again|please|instead|first|next|too|also|about|above|across|after|"
                  r"against|along|around|as|at|before|behind|below|between|beyond|by|down|during|for|from|in|inside|"
                  r"into|like|near|of|off|on|onto|out|over|past|since|through|to|toward|towards|under|until|up|upon|"
                  r"with|within|without|count|counts|time|times|reason|reasons|history|log|logs|status|queue|state|"
                  r"date|duration|length|(?!(?:every|any|some|no)thing\b)[a-z]{2,}ing)\b")
#: the system things a verb acts on when it names them after "the" / "all" and at most 3 words ("restart
#: the web server", "delete all old log files", "format the disk", "edit the nginx config file")
_SYSTEM_NOUN_EN = (r"(?:process(?:es)?|services?|daemons?|files?|folders?|director(?:y|ies)|dirs?|containers?|servers?|"
                   r"machines?|box(?:es)?|hosts?|system|computer|databases?|dbs?|tables?|firewall|ports?|pids?|jobs?|"
                   r"cron(?:tab)?s?|tasks?|scripts?|commands?|packages?|disks?|partitions?|volumes?|drives?|users?|"
                   r"accounts?|logs?|vms?|instances?|nodes?|clusters?|cache|config(?:uration)?s?)\b")
_DETERMINER_EN = r"(?:the|this|that|these|those|all|every|each|my|our|its|any|a|an)"
_MODIFIERS_EN = rf"(?:(?!{_NOT_OBJECT_EN})[\w.@+-]+\s+){{0,3}}?"
#: a path, a file name with an extension, a pid, a shell flag
_PATHLIKE_EN = r"(?:-{1,2}[A-Za-z]|\d|[/~]|[\w.-]*\w\.[A-Za-z])"
#: verbs that act on the machine whatever they name ("kill nginx", "restart nginx", "rm -rf /tmp/x")
_ACT_VERBS_EN = (r"(?:kill|pkill|killall|terminate|delete|remove|rm|erase|wipe|purge|restart|reboot|shut\s*down|"
                 r"power\s+off|stop|start|execute|exec|run|install|uninstall|upgrade|chmod|chown|mv|move|rename|"
                 r"truncate|overwrite|systemctl|service|sudo)")
#: verbs that act on the machine only when they name a path or a system thing ("edit /etc/hosts", "format
#: the disk"; not "Format the answer as a table", "edit your reply", "change the language")
_EDIT_VERBS_EN = r"(?:format|edit|modify|write\s+to|change)"
_ACT_EN = _p(
    _ACT_PREFIX_EN + r"(?:"
    rf"{_ACT_VERBS_EN}\s+(?:{_PATHLIKE_EN}|(?!{_NOT_OBJECT_EN})[A-Za-z]|{_DETERMINER_EN}\s+{_MODIFIERS_EN}{_SYSTEM_NOUN_EN})|"
    rf"{_EDIT_VERBS_EN}\s+(?:{_PATHLIKE_EN}|(?:{_DETERMINER_EN}\s+)?{_MODIFIERS_EN}{_SYSTEM_NOUN_EN})|"
    r"(?:reboot|shut\s*down|power\s+off)(?:\s+now)?\s*[.!]*\s*$)")
_QUESTION_WORD_EN = _p(r"\b(?:what|which|why|how|where|who|whose)\b")
_POLITE_EN = _p(r"^\s*(?:please\s+)?(?:can|could|would|will)\s+you\b")

#: a Chinese request starts the message or a clause ("nginx 挂了，帮我重启 nginx")
_ACT_PREFIX_ZH = r"(?:^|[，,。；;！!])\s*(?:请|麻烦你?|帮我|帮忙|给我|你|能不能|能否|可以|可不可以|可否|马上|立刻|立即|现在|赶紧)*\s*"
_ACT_VERBS_ZH = (r"(?:杀掉|杀死|杀|干掉|删除|删掉|删|移除|清空|清理|重新启动|重启|执行|停止运行|运行|停止|停掉|关闭|关掉|"
                 r"结束|终止|卸载|安装|修改|改写|覆盖|格式化|启动)")
#: what after a verb makes it no request: a noun or a state it forms ("运行时间", "启动项", "执行记录", "重启次数",
#: "运行中", "运行在", "运行最久", "停止运行的", "启动失败的服务"), a past ("重启过", "停止了")
_NOT_ACT_AFTER_ZH = (r"(?!\s*(?:的|过|了|着|中|在|最|项|完|时|期间|次数|原因|记录|日志|状态|情况|多久|运行|起来|方式|方法|"
                     r"失败|成功|异常|报错|出错|超时|响应))")
#: the nouns an install / run / start verb forms with what follows ("安装目录", "运行环境", "启动参数"): no request
_NOT_ACT_NOUN_ZH = r"(?!(?:安装|运行|启动)(?:目录|路径|位置|顺序|参数|环境|用户))"
#: the system things a Chinese verb acts on, at most 16 characters after it ("关闭防火墙", "删除所有临时文件"),
#: or a name, a pid, a path or a flag in Latin letters or digits ("停止 nginx 服务", "重启一下 nginx")
_SYSTEM_NOUN_ZH = (r"(?:进程|服务|文件|目录|文件夹|防火墙|机器|服务器|系统|电脑|主机|容器|数据库|数据表|端口|缓存|任务|程序|脚本|"
                   r"软件|应用|网卡|磁盘|硬盘|分区|用户|账号|账户|回收站|连接)")
_ACT_ZH = _p(
    _ACT_PREFIX_ZH + rf"(?:{_NOT_ACT_NOUN_ZH}{_ACT_VERBS_ZH}{_NOT_ACT_AFTER_ZH}\s*(?:一下|掉)?\s*"
    rf"(?:[A-Za-z0-9/~.\-_]|[^，。？！,.?!；;：:]{{0,16}}?{_SYSTEM_NOUN_ZH})|"
    r"关机\s*[。！!吧]*\s*$|"
    r"把.{1,60}?(?:杀掉|杀死|干掉|删除|删掉|删了|移除|清空|清理掉?|重启|停止|停掉|关闭|关掉|结束掉?|终止|卸载|执行|运行)"
    rf"{_NOT_ACT_AFTER_ZH})")
_QUESTION_WORD_ZH = _p(r"哪|什么|啥|怎么|怎样|如何|为什么|为何|多少|是否|有没有|有几")
_POLITE_ZH = _p(r"^\s*(?:请|麻烦你?)?\s*你?\s*(?:能不能|能否|可以|可不可以|可否|能)")
#: how a question ends ("nginx 重启了吗", "run queue length?"); a polite request ("can you delete app.log?",
#: "可以帮我重启 nginx 吗") ends so too and is still one
_ASKED_END = _p(r"[?？吗呢么]\s*[。.!！]*\s*$")


def is_request_to_act(text: str) -> bool:
    """``text`` asks the assistant to act on the machine (``_ACT_EN`` / ``_ACT_ZH``) and is no question:
    no question word ("哪", "什么", "有哪些", "which", "what"), and no final "?" / "？" / 吗 / 呢 unless
    the request is a polite one ("can you ...?", "可以…吗")."""
    if _ACT_EN.search(text):
        asked, polite = _QUESTION_WORD_EN, _POLITE_EN
    elif _ACT_ZH.search(text):
        asked, polite = _QUESTION_WORD_ZH, _POLITE_ZH
    else:
        return False
    if asked.search(text):
        return False
    return not _ASKED_END.search(text) or polite.search(text) is not None


def parse(text: str) -> list[Intent]:
    """Recognized intents in a stable order; an empty list means "not understood". Only the
    ``parsed_part`` of a long message is looked at."""
    text = parsed_part(text.strip())     # (Chinese numerals are read where a count is: ``_process_args``, ``_log_args``)
    if not text:
        return []
    if is_request_to_act(text):
        return [Intent("refuse", 3.0)]
    scores = _score(text)
    if scores.get("history", 0) >= THRESHOLD:
        args = history_arguments(text)
        if args:
            return [Intent("history", scores["history"], "history_search", args)]
    if _REMEMBERED.search(text):
        return [Intent("remembered", 2.0, "user_memory", {})]
    download = parse_download_request(text)   # "下载 <name>", "download <name>", "send me <name>"
    if download is not None:
        return [Intent("download", 2.0, "offer_download", download)]
    file_request = parse_file_request(text)   # list_dir / read_file / search_files
    if file_request is not None:
        return [Intent(file_request[0], 2.0, *file_request)]
    if _LOG_WORDS.search(text):
        args = _log_args(text)
        if args:
            return [Intent("read_log", 2.0, "read_log", args)]
        if _LOG_ASKED.search(text):
            return [Intent("log_path", 2.0)]          # which log: the answer asks for its path
    if _CHECK_WORDS.search(text) and _CHECK_ASKED.search(text) or _ONLY_TARGET.fullmatch(text):
        target = _network_target(text)
        if target:         # a port out of 1..65535 too: the tool's answer says the range
            return [Intent("network_check", 2.0, "network_check", {"host": target[0], "port": target[1]})]
    out: list[Intent] = []
    if scores.get("processes", 0) >= THRESHOLD:
        out.append(Intent("processes", scores.pop("processes"), "processes", _process_args(text)))
        scores.pop("cpu", None)
        scores.pop("memory", None)
    for name in ("overview", "cpu", "memory", "disk", "network", "load", "uptime"):
        if scores.get(name, 0) >= THRESHOLD:
            metric = "all" if name == "overview" else name
            note = "io_not_measured" if name == "disk" and _DISK_IO.search(text) else None
            out.append(Intent(name, scores[name], "sys_monitor", {"metric": metric}, note))
    if out and any(i.name == "overview" for i in out):
        out = [i for i in out if i.name in ("overview", "processes")]
    if scores.get("clock", 0) >= THRESHOLD:
        out.append(Intent("clock", scores["clock"], "clock", {}))
    if not out and scores.get("help", 0) >= THRESHOLD:
        out.append(Intent("help", scores["help"]))
    return out
