"""Intent recognition for the offline agent: Chinese and English requests -> tool calls.

Each intent has weighted patterns; an intent is kept when its score reaches ``THRESHOLD``. A few
rules resolve overlaps: a history question wins over everything (its topic may mention CPU or
nginx), a process listing absorbs the CPU/memory words that only choose its sort order, a
host:port check replaces the generic network report. Deterministic: no model, no network.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from server.agent.act_requests import is_request_to_act
from server.agent.downloads import parse_download_request
from server.agent.typos import corrected, typo_of
from server.agent.file_intents import (LEVEL_WORDS, PRONOUNS, EN_TENS, EN_UNITS, counts_in_digits, parse_file_request,
                                       paths_in)
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
    #: more such notes, each (key of ``answers.NOTES``, the values its text names: {"pid": 1}, {"part": "..."})
    notes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def said(self) -> tuple[str, str | None, Any]:
        """What the intent asks, without its score: two clauses asking the same are one request."""
        return self.name, self.tool, sorted(self.arguments.items())


def _p(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, _FLAGS)


# ASCII matching: Python's \w (and so \b) counts CJK characters as word characters, so "RAM占用" has no
# \b after "RAM" and [\w.-]+ swallows the Chinese words around a name. (CJK literals still match.)
_FLAGS = re.IGNORECASE | re.ASCII

# (intent, [(pattern, weight)]): English words use \b boundaries (ASCII ones); Chinese has none.
RULES: list[tuple[str, list[tuple[re.Pattern[str], float]]]] = [
    ("cpu", [(_p(r"\bcpus?\b|cpu"), 1.0), (_p(r"\bprocessors?\b|处理器"), 1.0), (_p(r"\bcores?\b"), 1.0)]),
    ("memory", [(_p(r"\b(memory|ram|swap|mem)\b"), 1.0), (_p(r"内存|交换分区|交换空间"), 1.0)]),
    ("disk", [(_p(r"\b(disks?|storage|filesystems?|partitions?|df|mounts?|mounted|mount\s*points?)\b|"
                  r"disk\s+space"), 1.0),
              (_p(r"磁盘|硬盘|存储|分区|文件系统"), 1.0), (_p(r"空间"), 0.5)]),
    ("network", [(_p(r"\b(network|interfaces?|nics?|bandwidth|traffic|ip\s+address(es)?)\b"), 1.0),
                 (_p(r"网络|网卡|接口|流量|带宽|ip\s*地址"), 1.0)]),
    ("load", [(_p(r"\bload(\s+average)?\b|\bloadavg\b"), 1.0), (_p(r"负载"), 1.0)]),
    ("uptime", [(_p(r"\buptime\b|\b(re)?boot(ed|s)?\b|how long .*\b(up|running)\b|\bup\s+since\b|\blast\s+restart\b(?!\s+of)|"
                    r"\b(system|server|machine|host|box)\s+(was\s+|been\s+)?restarted\b|"
                    r"\bwhen\s+(was|did)\s+(the\s+|this\s+)?(system|server|machine|host|box)\s+(last\s+)?(re)?start"), 1.0),
                (_p(r"运行时间|开机|启动时间|运行了多久|运行多久|上次重启|重启时间|什么时候重启"), 1.0)]),
    ("overview", [(_p(r"\b(system|server|machine|host|box)\b.*\b(status|health|healthy|overview|doing|ok|okay)\b|"
                      r"\b(healthy|health)\b.*\b(system|server|machine|host|box)\b|"
                      r"\bhow is (the )?(system|server|machine)\b|\bstatus\b"), 1.0),
                  (_p(r"系统状态|服务器状态|系统概况|系统情况|服务器怎么样|系统怎么样|机器怎么样|健康(?!检查|检测|探测|探针)"), 1.0)]),
    ("processes", [(_p(r"\bprocess(es)?\b|\bps\b|\btasks?\b|\bpids?\s*[#:=]?\s*\d"), 1.0),
                   (_p(r"\b(top|most|heaviest|hungriest)\b.*\b(using|consuming|by)\b"), 0.5),
                   # "sort them by memory": only a process listing is sorted
                   (_p(r"\b(re)?sort(ed)?\b.*\bby\s+(cpu|memory|mem|ram|rss)\b"), 1.0),
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
_PORT_WORD = re.compile(r"(?:\bports?\b|端口)\s*(?:号|number)?\s*[:：]?\s*(\d{1,5})\b|(\d{1,5})\s*(?:号)?\s*端口", _FLAGS)
_HOST_WORD = re.compile(r"(?:\bon\b|\bat\b|\bof\b|\bto\b|主机|在)\s*(\[[0-9a-fA-F:]+\]|\d{1,3}(?:\.\d{1,3}){3}|"
                        r"[A-Za-z][\w.-]*)", _FLAGS)
#: a message that is only host:port ("127.0.0.1:6379", "localhost:8080?"): check it
_ONLY_TARGET = re.compile(r"\s*(?:\[[0-9a-fA-F:]+\]|\d{1,3}(?:\.\d{1,3}){3}|localhost)\s*:\s*\d{1,5}\s*[?？]?\s*", _FLAGS)
_BARE_HOST = re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}|\blocalhost\b|::1)", _FLAGS)
_LINES = re.compile(r"(\d{1,5})\s*(?:(?:log\s+)?lines?|行)|\btail\s+-n\s*(\d{1,5})\b|\btail\s+-(\d{1,5})\b", _FLAGS)
_TOPN = re.compile(r"\btop\s+(\d{1,3})\b|前\s*(\d{1,3})|(\d{1,3})\s*个\s*(?:\S{0,8}?)\s*(?:进程|程序)|"
                   r"\b(\d{1,3})\s+(?:[A-Za-z-]+\s+){0,2}?(?:process(?:es)?|procs|programs)\b", _FLAGS)
_NAMED = re.compile(r"\b(?:named|called|matching)\s+[\"']?([\w.\-]+)|\b([A-Za-z][\w.\-]*)\s*(?:的)?\s*进程|"
                    r"\b([A-Za-z][\w.\-]*)\s+process(?:es)?\b", _FLAGS)
#: words before "process" / "进程" that name no process: question words, articles, pronouns, verbs, number words,
#: and what a listing is sorted or filtered by ("what is process 1", "how many processes", "top three processes",
#: "running processes", "user processes")
_NOT_NAMES = {"top", "the", "all", "running", "which", "what", "heaviest", "biggest", "memory", "cpu", "list",
              "show", "any", "my", "some", "of", "by", "most", "hungry", "ram", "mem", "rss",
              "is", "are", "was", "were", "be", "been", "am", "how", "many", "much", "who", "whose", "why", "where",
              "when", "a", "an", "this", "that", "these", "those", "it", "its", "their", "your", "our", "his", "her",
              "s", "there", "here", "and", "or", "for", "in", "on", "to", "with", "from", "about", "each", "every",
              "other", "total", "number", "count", "active", "current", "live", "big", "largest", "busiest",
              "hungriest", "greediest", "highest", "expensive", "heavy", "user", "users", "system", "kernel",
              "background", "zombie", "defunct", "child", "parent", "single", "same", "new", "old", "do", "does",
              "did", "give", "get", "tell", "me", "see", "check", "find", "sort", "sorted", "display", "view",
              "first", "last", "next", "only", "just", "main", "existing", "alive", "started", "stopped", "open",
              "no", "not", "id", "pid", *EN_UNITS, *EN_TENS, "hundred"}
#: one process asked by its id ("what is process 1", "show pid 4242"): the processes tool looks up none, so its
#: largest listing is searched for it and the answer says whether it is there (``answers`` "pid_asked")
_PID = re.compile(r"\b(?:process|pid)\s*(?:id\s*|number\s*|no\.?\s*)?[#:=]?\s*(\d{1,7})\b(?!\s*(?:%|processes|procs))",
                  _FLAGS)
#: processes of one user ("processes of user root", "processes owned by www-data", "root's processes"): the
#: tool filters by name only, so the answer says the list is of all users (``answers`` "user_filter")
_USER = re.compile(r"\b(?:of|for|by|owned\s+by|run\s+by|started\s+by|belonging\s+to|from)\s+(?:the\s+)?user\s+"
                   r"[\"']?([A-Za-z_][\w.-]*)|\b(?:owned|run|started)\s+by\s+([A-Za-z_][\w.-]*)|"
                   r"\buser\s+([A-Za-z_][\w.-]*)['’]s\s+process|\b([A-Za-z_][\w.-]*)['’]s\s+process(?:es)?\b", _FLAGS)
#: the most processes the tool lists (its schema's maximum of ``limit``)
PROCESS_LIST_MAX = 50
_BY_MEMORY = re.compile(r"\b(memory|ram|mem|rss)\b|内存", _FLAGS)
_LOG_WORDS = re.compile(r"\b(tail|log|logs|syslog)\b|日志", _FLAGS)
#: a log asked to be shown without saying which ("看下错误日志", "show me the error log"): ask for its path
_LOG_ASKED = re.compile(r"^\s*(?:(?:please|can\s+you|could\s+you)\s+)?(?:show|tail|view|open|read|check)\b.*\blogs?\b|"
                        r"(?:查看|看下|看一下|看看|显示|打开|读取|帮我看).*日志", _FLAGS)
#: disk input/output asked: sys_monitor measures space only, and the answer says so
_DISK_IO = re.compile(r"\bi/?o\b|\biops\b|\bthroughput\b|读写|吞吐", _FLAGS)
_CHECK_WORDS = re.compile(r"\b(check|ports?|reachable|connect|open|listening|ping)\b|端口|连通|连接|检查|检测|能否", _FLAGS)
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


#: more ports after the first ("is port 22 or 8080 open", "check ports 80, 443 and 8443 on localhost"): each is checked
_MORE_PORTS = re.compile(r"\bports?\s*(?:number\s*)?[:：]?\s*\d{1,5}((?:\s*(?:,|/|&|\bor\b|\band\b)\s*(?:(?:port\s*)?\d{1,5}\b))+)",
                         _FLAGS)
#: the most ports one message checks
MAX_PORTS_CHECKED = 8


_AT_END = re.compile(r"\s*[?.!？。]*\s*")


#: "<host> 的 <port> 端口" ("检查 web1 的 22 端口和 web2 的 80 端口"): each host its port
_ZH_HOST_PORT = re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}|[A-Za-z][\w.-]*)\s*的\s*(\d{1,5})\s*号?\s*端口", re.ASCII)


def _network_targets(text: str) -> list[tuple[str, int]]:
    """Every (host, port) ``text`` asks to check: one, or one per port of a list on one host, or each
    "<host> 的 <port> 端口"."""
    zh = [(m.group(1), int(m.group(2))) for m in _ZH_HOST_PORT.finditer(text)]
    if zh:
        return list(dict.fromkeys(zh))[:MAX_PORTS_CHECKED]
    target = _network_target(text)
    if target is None:
        return []
    more = _MORE_PORTS.search(text) if not _HOST_PORT.search(text) else None
    ports = [target[1]] + ([int(p) for p in re.findall(r"\d{1,5}", more.group(1))] if more else [])
    return [(target[0], port) for port in dict.fromkeys(ports)][:MAX_PORTS_CHECKED]


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
    if host.lower() in ("port", "the") or host.lower() == "a" and not _AT_END.fullmatch(text[hm.end():]):
        host = "localhost"        # (an article: "on a server"; a host at the end of its clause: "port 22 on a")
    return host, port


def _process_args(text: str) -> dict[str, Any]:
    args: dict[str, Any] = {"sort_by": "memory" if _BY_MEMORY.search(text) else "cpu"}
    m = _TOPN.search(counts_in_digits(text))   # "前三", "两个", "top three": the count in digits (the name as said)
    if m:
        args["limit"] = max(1, min(PROCESS_LIST_MAX, int(next(g for g in m.groups() if g))))
    user = _USER.search(text)
    users = {next(g for g in user.groups() if g).lower()} if user else set()
    for nm in _NAMED.finditer(text):
        name = next(g for g in nm.groups() if g)
        if name.lower() not in _NOT_NAMES and name.lower() not in users:
            args["name"] = name
            break
    return args


def _process_intent(text: str, score: float) -> Intent:
    """The process listing ``text`` asks for, with the notes of what the tool cannot do: look up one PID
    (the largest listing is searched for it), filter by user (every user's processes are listed)."""
    args = _process_args(text)
    intent = Intent("processes", score, "processes", args)
    pid = _PID.search(text)
    if pid:
        args["limit"] = PROCESS_LIST_MAX
        intent.notes.append(("pid_asked", {"pid": int(pid.group(1))}))
    user = _USER.search(text)
    if user:
        intent.notes.append(("user_filter", {"user": next(g for g in user.groups() if g)}))
    return intent


#: a service's log named without a path ("nginx 的 error log", "看下 nginx 的错误日志"): its usual place
#: under a log root, <name>/error.log or <name>/access.log
_NAMED_LOG = re.compile(r"\b([A-Za-z][\w.-]*)\s*(?:的)?\s*(?:(error|access)[\s_-]*logs?\b|(错误|访问)日志)", _FLAGS)
_LOG_KIND = {"错误": "error", "访问": "access"}


#: a log named without a path or an extension ("tail syslog", "tail -n 20 messages", "show me the syslog"):
#: read as that name relative to a log root
_BARE_LOG = re.compile(r"\btail\s+(?:-[A-Za-z]+\s*\d*\s+|-\d+\s+)*(?:the\s+)?([A-Za-z][\w-]*)\s*[?.!]*\s*$|\b(syslog)\b",
                       _FLAGS)
_NOT_LOG_NAMES = {"log", "logs", "file", "files", "the", "a", "an", "my", "me", "of", "for", "end", "last", "latest",
                  "error", "errors", "access", "it", "this", "that", "them", "there"}
#: a log level asked of a log ("errors in app.log", "show warnings in nginx/error.log"): the log is grepped
#: for it, case-insensitively (search_files), instead of showing its last lines. ("the nginx error log" names
#: a log, not a level)
_LEVEL = re.compile(r"\b(errors?|warnings?|warns?|fatal|critical|exceptions?)\b(?![\s_-]*logs?\b)", _FLAGS)
#: a time range asked of a log or a reading ("in the last hour", "since yesterday", "today", "2 hours ago"):
#: the tools read no log timestamps and keep no past readings, so the answer says it was not applied
_TIME_RANGE = re.compile(r"\b(?:in|over|during|for|within|from)\s+the\s+(?:last|past|previous)\s+(?:\d+\s+|few\s+|"
                         r"couple\s+(?:of\s+)?|several\s+)?(?:minutes?|mins?|hours?|hrs?|days?|weeks?|months?|night)\b|"
                         r"\b(?:last|past)\s+(?:\d+\s+)?(?:minutes?|mins?|hours?|hrs?|days?|weeks?|months?|night)\b|"
                         r"\bsince\s+(?:yesterday|this\s+morning|midnight|last\s+\w+|\d{1,2}(?::\d\d)?\s*(?:am|pm)?)\b|"
                         r"\b(?:today|yesterday|tonight|this\s+morning|overnight|earlier\s+today)\b|"
                         r"\b(?:an?|\d+|a\s+few)\s+(?:minutes?|mins?|hours?|hrs?|days?|weeks?)\s+ago\b", _FLAGS)


def _log_intents(text: str, previous: str | None = None) -> list[Intent]:
    """The read_log calls a log request asks for: one per path ("tail nginx/error.log and nginx/access.log"),
    or for a log level asked in English ("errors in the last hour in app.log") a search of the log for it."""
    paths = [p for p in paths_in(text) if p != "/"]   # absolute, relative to a log root, or a file name
    named = _NAMED_LOG.search(text)
    if not paths and named and named.group(1).lower() not in _NOT_NAMES | {"the", "an", "a", "my"}:
        paths = [f"{named.group(1)}/{(named.group(2) or _LOG_KIND[named.group(3)]).lower()}.log"]
    if not paths:
        bare = _BARE_LOG.search(text)
        name = (bare.group(1) or bare.group(2)) if bare else None
        if name and PRONOUNS.fullmatch(name) and previous:
            paths = [previous]                                 # "tail it": the file named before
        elif name and name.lower() not in _NOT_LOG_NAMES:
            paths = [name]
    if not paths:
        return []
    english = not is_chinese(text)
    out: list[Intent] = []
    for path in dict.fromkeys(paths):
        args: dict[str, Any] = {"path": path}
        m = _LINES.search(counts_in_digits(text))   # "最后二十行", "last five lines": the count in digits
        if m:
            args["lines"] = max(1, int(next(g for g in m.groups() if g)))
        out.append(Intent("read_log", 2.0, "read_log", args))
    if not english:
        return out
    rest = text
    for p in paths:
        rest = rest.replace(p, " ")
    levels = list(dict.fromkeys(LEVEL_WORDS[w.lower()] for w in _LEVEL.findall(rest)))
    when = _TIME_RANGE.search(rest)
    for i, intent in enumerate(out):
        if levels:               # the lines of that level, not the last lines of every level
            args = {"root": intent.arguments["path"], "pattern": "|".join(levels) if len(levels) > 1 else levels[0],
                    "ignore_case": True}
            if len(levels) > 1:
                args["regex"] = True
            out[i] = intent = Intent("search_files", 2.0, "search_files", args)
            intent.notes.append(("level_filter", {"levels": ", ".join(levels)}))
        if when:
            intent.notes.append(("log_time_range", {"range": when.group(0), "levels": bool(levels)}))
    return out


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


#: a service's status asked ("what's the status of nginx?", "nginx status", "is nginx running?", "systemctl status
#: nginx"): services are not checked (no service manager is read), so processes named like it are listed and the
#: answer says so (``answers`` "service_not_checked"). The names of the machine and its readings are no service.
_SERVICE_STATUS = [_p(r"^\W*(?:what(?:['’]s|\s+is)\s+|show\s+(?:me\s+)?|check\s+|get\s+)?(?:the\s+)?(?:current\s+)?status\s+of\s+"
                      r"(?:the\s+)?([A-Za-z][\w.@-]*)(?:\s+(?:service|daemon|unit|server|process))?\s*[?.!]*\s*$"),
                   _p(r"^\W*(?:show\s+(?:me\s+)?|check\s+|get\s+)?(?:the\s+)?([A-Za-z][\w.@-]*)\s+(?:service\s+|daemon\s+)?"
                      r"status\s*[?.!]*\s*$"),
                   _p(r"^\W*is\s+(?:the\s+)?([A-Za-z][\w.@-]*)\s+(?:service\s+|daemon\s+|process\s+)?(?:still\s+)?"
                      r"(?:running|up|alive|down|active|dead|started|stopped)\s*[?.!]*\s*$"),
                   _p(r"^\W*(?:systemctl|service)\s+status\s+([A-Za-z][\w.@-]*)|^\W*service\s+([A-Za-z][\w.@-]*)\s+status\b")]
_NOT_SERVICES = _NOT_NAMES | {"server", "machine", "host", "box", "overall", "disk", "disks", "network", "load", "port",
                              "ports", "process", "processes", "everything", "things", "it", "service", "services",
                              "swap", "uptime", "storage", "computer", "node", "vm", "cluster", "health", "system",
                              "systems", "status", "overview", "general", "memory", "mem", "ram", "cpu", "cpus",
                              "net", "networking", "bandwidth", "interfaces", "interface", "usage", "servers",
                              "machines", "hosts", "os", "hardware", "resources", "resource", "performance"}


def _service_status(text: str) -> str | None:
    for pat in _SERVICE_STATUS:
        m = pat.search(text)
        if m:
            name = next(g for g in m.groups() if g)
            return None if name.lower() in _NOT_SERVICES or typo_of(name) else name   # ("netowrk": a metric word)
    return None


#: a question about the past of a reading ("what was the CPU usage yesterday?", "was memory high last night?"):
#: the tools keep no past readings, so the answer says it gives the current one (``answers`` "past_reading")
_PAST_EN = _p(r"\b(?:was|were|had|did|been|peaked?)\b|\byesterday\b|\blast\s+(?:night|week|month|hour|day|weekend|time)\b|"
              r"\b(?:\d+|an?|few)\s+(?:minutes?|hours?|days?|weeks?)\s+ago\b|\bearlier\s+today\b|\bthis\s+morning\b|"
              r"\bovernight\b|\b(?:over|in|during)\s+the\s+(?:last|past)\b|\bhistor(?:y|ical)\b|\btrends?\b")
_PAST_ZH = _p(r"昨天|昨晚|前天|上周|上个月|上星期|(?:\d+|[一二两三四五六七八九十几]+)\s*(?:个)?\s*(?:小时|分钟|天|星期|周)(?:前|以前|之前|内)|"
              r"过去\s*(?:\d+|[一二两三四五六七八九十几]+)|历史(?:数据|记录|曲线)|趋势|峰值")
_PAST_METRICS = ("cpu", "memory", "disk", "network", "load", "overview", "processes")
#: the rate of network traffic asked ("bandwidth usage", "how fast is the network", "网速"): only totals since
#: boot are read, and the answer says so (``answers`` "no_rate")
_RATE = _p(r"\b(?:bandwidth|throughput|rate|speed|per\s+second|mbps|mb/s|kb/s|gbps|bps|how\s+fast)\b|带宽|网速|速率|每秒")
#: a temperature asked ("cpu temperature", "is the CPU hot?", "CPU 温度"): none is read (``answers`` "no_temperature")
_TEMPERATURE = _p(r"\b(?:temperature|temp|thermal|overheat(?:ing)?|hot|heat)\b|温度|过热|发热")
#: decimal units asked ("free memory in GB", "disk space in gigabytes"): sizes are also given in GB
#: (``answers`` "decimal_units"); the tools write binary units (GiB)
_DECIMAL_UNITS = _p(r"\b(?:gb|gigabytes?|tb|terabytes?|mb|megabytes?)\b")


def _with_notes(out: list[Intent], text: str) -> list[Intent]:
    """``out`` with the notes of what the question asked beyond the readings: the past, a rate, a temperature,
    decimal units."""
    past = _PAST_ZH if is_chinese(text) else _PAST_EN
    for intent in out:
        if intent.tool not in ("sys_monitor", "processes"):
            continue
        if intent.name in _PAST_METRICS and past.search(text) and not _JUST_ASKED_NOW.search(text):
            intent.notes.append(("past_reading", {}))
        if intent.name == "network" and _RATE.search(text):
            intent.notes.append(("no_rate", {}))
        if intent.name == "cpu" and _TEMPERATURE.search(text):
            intent.notes.append(("no_temperature", {}))
        if intent.name in ("memory", "disk", "overview") and _DECIMAL_UNITS.search(text):
            intent.notes.append(("decimal_units", {"unit": _DECIMAL_UNITS.search(text).group(0)}))
    return out


#: "right now" / "现在" in a question with a past word ("what was ... and what is it now"): the reading is asked
_JUST_ASKED_NOW = _p(r"\bright\s+now\b|\bcurrently\b|现在|目前|当前")

#: where a message holds several requests ("show disk usage and the last 3 lines of app.log", "tail a.log; grep
#: 502 in b.log", "检查端口 22 以及内存"): each clause is parsed on its own (``parse``). Not inside quotes.
#: the Chinese words that join requests ("查看磁盘然后重启 nginx", "看下 app.log 最后10行，然后搜索 ERROR", "在 app.log 中搜索
#: ERROR 并统计"): 然后 / 并且 / 接着 / 随后 anywhere, 并 / 再 only before a verb and not inside a word (并发, 再次,
#: 不再, 合并, 兼并, 一再, 归并, 吞并, 想再, 要再, 还再) nor right after a verb with no object ("搜索 并查看" is one request)
_CLAUSE_SPLIT_ZH = re.compile(r"\s*[，,]?\s*(?:然后|并且|接着|随后)\s*|"
                              r"(?<![不合兼一归吞并再想要会能还又])(?<!搜索)(?<!查看)(?<!查找)(?<!检查)(?<!显示)(?<!统计)"
                              r"(?<!搜索\s)(?<!查看\s)(?<!查找\s)(?<!检查\s)(?<!显示\s)(?<!统计\s)"
                              r"\s*[，,]?\s*(?:并|再)\s*(?=(?:查看|看|搜索|查找|检查|"
                              r"检测|显示|统计|列出|读取|打开|重启|停止|删除|杀|告诉|计算|数一下|grep|tail|cat))", re.I)
_CLAUSE_SPLIT = re.compile(r"\s+and\s+(?:then\s+|also\s+)?|\s*[;；]\s*|\s*以及\s*|,\s+(?:and\s+)?(?:then\s+|also\s+)?|"
                           + _CLAUSE_SPLIT_ZH.pattern, _FLAGS)
#: a clause that tells the assistant something to keep or to forget ("remember that the staging server is
#: stage-7.internal", "forget everything", "记住…", "忘掉…"): answered without a tool (``answers.tool_results``,
#: ``offline``), never read as a file or a reading
_NOTE_CLAUSE = _p(r"^(?:(?:please|pls|also)\s+)*(?:remember|note|keep\s+in\s+mind)\b(?!\s+(?:me|when|what|how|if)\b)|"
                  r"^(?:请|帮我)?(?:记住|记一下)")
_FORGET_CLAUSE = _p(r"^(?:(?:please|pls|also)\s+)*forget\b|^(?:请|帮我)?(?:忘记|忘掉)")
#: a clause that is a port and its host after a port check ("check port 80 on a and 443 on b"): checked as "port N on b"
_BARE_PORT_CLAUSE = _p(r"^\d{1,5}\s+(?:on|at)\s+\S+$")
#: a Chinese search naming no file after a clause that named one ("…，然后搜索 ERROR"): that file is searched
_ZH_SEARCH_CLAUSE = _p(r"^(?:再|并)?(?:搜索|查找|搜|找)(?:一下)?\s*\S")
#: the requests of a clause answered without a tool that a message of several requests still answers (``parse``)
_NO_TOOL_CLAUSE = {"help", "note", "forget"}
#: intents found before the rest (``_parse_one`` returns at once) that leave the rest of a message unanswered
_FIRST_ONLY = {"download", "list_dir", "read_file", "search_files", "read_log", "network_check", "log_path",
               "unsupported", "which_file", "refuse"}
#: a clause that asks nothing by itself ("please", "thanks", "ok"): not named as unanswered
_FILLER = _p(r"(?:please|pls|thanks?(?:\s+you)?|ok(?:ay)?|hi|hello|hey|so|now|then|also|too|as\s+well|quickly|"
             r"first|next|finally|again|if\s+you\s+can|when\s+you\s+can|谢谢|好的|请)(?:\s+(?:please|too|now))?")


def _first_only(intent: Intent) -> bool:
    """``intent`` is one ``_parse_one`` returns at once (a service's status too): the rest of its clause
    is not read."""
    return intent.name in _FIRST_ONLY or any(key == "service_not_checked" for key, _ in intent.notes)
#: a clause that is a port and its host ("and port 80 on 10.0.0.5"): checked like the clause before it
_PORT_FIRST = _p(r"^(?:the\s+)?ports?\s*\d")
#: a clause that is a name and a state ("is nginx up and postgres down?"): asked like the service of the clause before
_STATE_CLAUSE = _p(r"^(?:the\s+)?[A-Za-z][\w.@-]*\s+(?:service\s+|daemon\s+|process\s+)?(?:still\s+)?"
                   r"(?:running|up|alive|down|active|dead|started|stopped)\s*[?.!]*$")
#: a clause that only follows on a grep before it by counting its matches ("grep ERROR in app.log and count them"):
#: the search's answer starts with how many lines match, so it asks nothing more
_FOLLOW_COUNT = _p(r"^(?:then\s+)?(?:count|tally)(?:\s+(?:them|those|these|it|the\s+(?:matches|hits|lines|results)))?|"
                   r"^how\s+many(?:\s+(?:are\s+there|there\s+are|of\s+them|matches|lines))?$|"
                   r"^(?:统计|数一下|计数)(?:一下)?(?:数量|个数|行数|次数|条数)?$")
#: a clause asking to explain, summarize or analyze what was shown ("and explain it"): the offline assistant only
#: shows and checks, and says so (``answers`` "part_not_explained")
_EXPLAIN = _p(r"^(?:then\s+|please\s+|can\s+you\s+|and\s+)*(?:explain|summari[sz]e|analy[sz]e|interpret|"
              r"what\s+does\s+(?:it|this|that)\s+mean)\b.*$")
#: the most clauses of one message parsed apart
MAX_CLAUSES = 6


def _file_named(found: list[Intent]) -> str | None:
    """The last file or directory ``found`` asks a tool about (a clause's path: "in it" after it is that one)."""
    named = [str(i.arguments.get("path") or i.arguments.get("root")) for i in found
             if i.tool and (i.arguments.get("path") or i.arguments.get("root"))]
    return named[-1] if named else None


def _swallowed(whole: list[Intent]) -> bool:
    """``whole`` is one grep whose pattern ran over a clause into the next one ("grep ERROR in app.log and count
    them" read as a search for 'ERROR in app.log and count' in "them"): the clauses say what was asked."""
    pattern = str(whole[0].arguments.get("pattern", "")) if len(whole) == 1 else ""
    return len(whole) == 1 and whole[0].name in ("search_files", "which_file") and \
        bool(paths_in(pattern) or _CLAUSE_SPLIT_ZH.search(pattern))      # ("搜索 ERROR 并统计")


def clauses(text: str) -> list[str]:
    """``text`` cut where it joins requests (``_CLAUSE_SPLIT``), outside quoted strings."""
    quoted = [m.span() for m in re.finditer(r"[\"'“”‘’`][^\"'“”‘’`\n]*[\"'“”‘’`]", text)]
    parts, start = [], 0
    for m in _CLAUSE_SPLIT.finditer(text):
        if any(a <= m.start() < b for a, b in quoted):
            continue
        parts.append(text[start:m.start()])
        start = m.end()
    parts.append(text[start:])
    return [p.strip(" ,.") for p in parts if p.strip(" ,.?!")]


#: earlier messages read for a follow-up (``previous_file``, ``_previous_listing``), kept parsed: without it
#: every offline turn parsed every earlier user message again (20 earlier messages: ~50 ms on the loop)
EARLIER_PARSED_CACHED = 512


@functools.lru_cache(maxsize=EARLIER_PARSED_CACHED)
def _parsed_alone(text: str) -> tuple[Intent, ...]:
    """The intents of one earlier message read alone (no previous file): read only, never changed."""
    return tuple(_parse_one(text, None))


def previous_file(messages: list[dict[str, Any]] | None) -> str | None:
    """The file the previous request named (its last path), for a pronoun ("now grep ERROR in it"); None
    when no earlier user message of ``messages`` (the last one is the new message) names one."""
    for m in reversed((messages or [])[:-1]):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            for intent in _parsed_alone(parsed_part(m["content"].strip())):
                path = intent.arguments.get("path") or intent.arguments.get("root")
                if path:
                    return str(path)
            found = [p for p in paths_in(m["content"]) if p != "/"]
            if found:
                return found[-1]
    return None


def _previous_listing(messages: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The arguments of the process listing the previous request asked for, or None."""
    for m in reversed((messages or [])[:-1]):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            for intent in _parsed_alone(parsed_part(m["content"].strip())):
                if intent.tool == "processes":
                    return dict(intent.arguments)
            return None
    return None


#: a follow-up that re-sorts the previous listing ("sort them by memory", "now by CPU")
_RESORT = _p(r"^\W*(?:now\s+|and\s+)?(?:re)?(?:sort|order)(?:ed)?\s+(?:them|it|those|these|that|the\s+list)?\s*by\s+"
             r"(cpu|memory|mem|ram|rss)\b|^\W*(?:now\s+|and\s+)?by\s+(cpu|memory|mem|ram|rss)\s*[?.!]*\s*$")


def parse(text: str, messages: list[dict[str, Any]] | None = None) -> list[Intent]:
    """Recognized intents in a stable order; an empty list means "not understood". Only the
    ``parsed_part`` of a long message is looked at. ``messages`` (the turn's context, the new message last)
    resolve a follow-up: a pronoun for the previous file ("now grep ERROR in it"), a re-sort of the
    previous process listing ("sort them by memory"). A message of several requests joined by "and", ";",
    "以及" gets the intents of each (``clauses``); a clause understood by no rule is named in a note."""
    text = parsed_part(text.strip())     # (Chinese numerals are read where a count is: ``_process_args``, ``_log_args``)
    if not text:
        return []
    previous = previous_file(messages) if messages else None
    resort = _RESORT.search(text)
    if resort and messages:
        listing = _previous_listing(messages)
        if listing is not None:
            listing["sort_by"] = "memory" if (resort.group(1) or resort.group(2)).lower() != "cpu" else "cpu"
            return [Intent("processes", 2.0, "processes", listing)]
    whole = _parse_one(text, previous)
    if whole and whole[0].name in ("refuse", "history", "remembered"):
        return whole
    parts = clauses(text)
    if len(parts) < 2 or len(parts) > MAX_CLAUSES:
        return whole
    each: list[list[Intent]] = []
    before = previous                   # the file a pronoun names: an earlier clause's ("tail a.log, and grep X in it")
    for k, part in enumerate(parts):
        note = "forget" if _FORGET_CLAUSE.match(part) else "note" if _NOTE_CLAUSE.match(part) else None
        found = [Intent(note, 2.0, None, {"part": part})] if note else _parse_one(part, before)
        if not found and k and _BARE_PORT_CLAUSE.match(part) and \
                any(i.name == "network_check" for i in each[k - 1]):
            found = _parse_one(f"check port {part}", before)        # "check port 80 on a and 443 on b"
        if not found and k and before and _ZH_SEARCH_CLAUSE.match(part) and not paths_in(part):
            found = _parse_one(f"在 {before} 中{part}", before)       # "看下 app.log 最后10行，然后搜索 ERROR"
        if not found and k and (paths_in(part) or _PORT_FIRST.match(part)):
            verb = parts[k - 1].split()[0]  # "check port 22 on web1 and port 80 on web2", "cat a.conf and b.conf"
            again = _parse_one(f"{verb} {part}", before)
            if again and all(map(_first_only, again)):
                found = again
        if not found and k and _STATE_CLAUSE.match(part) and \
                any(key == "service_not_checked" for i in each[k - 1] for key, _ in i.notes):
            found = _parse_one(f"is {part}", before)      # "is nginx up and postgres down?"
        each.append(found)
        before = _file_named(found) or before
    asked_apart = any(i.name in _NO_TOOL_CLAUSE for r in each for i in r) and any(i.tool for r in each for i in r)
    if not any(map(_first_only, whole)) and not any(_first_only(i) for r in each for i in r) and not asked_apart:
        return whole                      # (the rules found every request: "show CPU and memory")
    said = [i.said() for i in whole]
    if not (all(each) or any([i.said() for i in r] == said for r in each) or _swallowed(whole) or asked_apart):
        return whole                      # (a clause of a grep pattern: "grep ERROR and WARN in app.log")
    merged: list[Intent] = []
    seen: set[Any] = set()
    for intent in (i for r in each for i in r if i.name != "refuse"):
        key = repr(intent.said())
        if key not in seen:
            seen.add(key)
            merged.append(intent)
    tools = [i for i in merged if i.tool]
    if not tools:
        return whole
    for k, (part, result) in enumerate(zip(parts, each)):
        asked = part.strip(" ?!.")
        if not result and _EXPLAIN.match(asked):
            tools[-1].notes.append(("part_not_explained", {"part": part}))
            continue                      # ("show me nginx/error.log and explain it")
        if not result and _FOLLOW_COUNT.match(asked) and any(i.tool == "search_files" for r in each[:k] for i in r):
            continue                      # ("grep ERROR in app.log and count them": the answer says how many)
        if not result and (_FILLER.fullmatch(asked) or len(part.split()) < 2 and not paths_in(part)
                           and not is_chinese(part)):
            continue                      # ("tail app.log, please")
        if not result:
            tools[-1].notes.append(("part_not_answered", {"part": part}))
        elif any(i.name == "refuse" for i in result):
            tools[-1].notes.append(("part_refused", {"part": part}))
    return merged


def _parse_one(text: str, previous: str | None) -> list[Intent]:
    """The intents of one request (``parse`` without the clauses): the first of a download, a file request, a
    log, a port check or a service's status wins; else every system reading the rules score."""
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
    file_request = parse_file_request(text, previous)   # list_dir / read_file / search_files
    if file_request is not None:
        if file_request[0] in ("unsupported", "which_file"):    # (answered without a tool)
            return [Intent(file_request[0], 2.0, None, file_request[1])]
        return [Intent(file_request[0], 2.0, *file_request)]
    if _LOG_WORDS.search(text):
        found = _log_intents(text, previous)
        if found:
            return found
        if _LOG_ASKED.search(text):
            return [Intent("log_path", 2.0)]          # which log: the answer asks for its path
    if _CHECK_WORDS.search(text) and _CHECK_ASKED.search(text) or _ONLY_TARGET.fullmatch(text):
        targets = _network_targets(text)
        if targets:         # a port out of 1..65535 too: the tool's answer says the range
            return [Intent("network_check", 2.0, "network_check", {"host": h, "port": p}) for h, p in targets]
    if not is_chinese(text):       # (before a service's status: "memroy status" is the memory's, no service's)
        fixed = corrected(text)
        if fixed != text:
            scores = {k: v for k, v in _score(fixed).items() if k != "history"}
            text = fixed
    service = None if is_chinese(text) else _service_status(text)
    if service:
        return [Intent("processes", 2.0, "processes", {"sort_by": "cpu", "name": service},   # (a system request)
                       notes=[("service_not_checked", {"service": service})])]
    out: list[Intent] = []
    if scores.get("processes", 0) >= THRESHOLD:
        out.append(_process_intent(text, scores.pop("processes")))
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
    return _with_notes(out, text)
