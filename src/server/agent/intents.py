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
from server.agent.file_intents import parse_file_request, paths_in

THRESHOLD = 1.0
MAX_PARSE_CHARS = 2_000      # a longer message (a pasted log) is parsed by its first and last 1,000 characters
CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


def is_chinese(text: str) -> bool:
    return CJK.search(text) is not None


@dataclass(slots=True)
class Intent:
    name: str                      # cpu, memory, disk, network, load, uptime, overview, processes,
    score: float                   # network_check, read_log, list_dir, read_file, search_files, history, clock, help
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)


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
                 (_p(r"网络|网卡|接口|流量|ip\s*地址"), 1.0)]),
    ("load", [(_p(r"\bload(\s+average)?\b|\bloadavg\b"), 1.0), (_p(r"负载"), 1.0)]),
    ("uptime", [(_p(r"\buptime\b|\bboot(ed)?\b|how long .*\b(up|running)\b"), 1.0),
                (_p(r"运行时间|开机|启动时间|运行了多久|运行多久"), 1.0)]),
    ("overview", [(_p(r"\b(system|server|machine|host)\b.*\b(status|health|overview|doing)\b|"
                      r"\bhow is (the )?(system|server|machine)\b|\bstatus\b"), 1.0),
                  (_p(r"系统状态|服务器状态|系统概况|系统情况|服务器怎么样|系统怎么样|机器怎么样|健康"), 1.0)]),
    ("processes", [(_p(r"\bprocess(es)?\b|\bps\b|\btasks?\b"), 1.0),
                   (_p(r"\b(top|most|heaviest|hungriest)\b.*\b(using|consuming|by)\b"), 0.5),
                   (_p(r"进程|程序.*(最多|最高)|占用.*最(多|高)|最.*占用"), 1.0)]),
    ("history", [(_p(r"\b(did|have|had)\s+(i|we)\b.*\b(ask|say|mention|talk|discuss)"), 1.0),
                 (_p(r"\bi\s+(asked|said|mentioned)\b|\bwe\s+(talked|discussed)\b"), 1.0),
                 (_p(r"\b(earlier|before|previously|last time|history|past conversations?)\b"), 0.5),
                 (_p(r"\bsearch\b.*\b(history|conversations?|chats?)\b"), 1.0),
                 (_p(r"(之前|以前|上次|刚才|曾经).*(问|聊|说|提|讨论)|(问过|聊过|说过|提到过|讨论过)"), 1.0),
                 (_p(r"搜索.*(历史|记录|对话)|历史记录|聊天记录"), 1.0)]),
    ("clock", [(_p(r"\bwhat time\b|\b(current )?time is it\b|\bdate\b|\bwhat day\b|\btoday\b|\bclock\b|"
                   r"(?<!much )(?<!long )\btime\b(?!\s*out)"), 1.0),      # ("how much time": a duration)
               (_p(r"几点|(?<!运行)(?<!启动)(?<!长)(?<!多少)时间|日期|几号|星期几|周几|今天"), 1.0)]),   # (多长时间: a duration)
    ("help", [(_p(r"^\s*(hi|hello|hey|help|\?)\s*[!.?]*\s*$|\bwhat can you do\b|\bhelp\b|\bcapabilit"), 1.0),
              (_p(r"^\s*(你好|您好|嗨|帮助)\s*[!！。?？]*\s*$|你能做什么|能做什么|有什么功能|怎么用|帮助"), 1.0)]),
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
_BARE_HOST = re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}|\blocalhost\b|::1)", _FLAGS)
_LINES = re.compile(r"(\d{1,5})\s*(?:lines?|行)", _FLAGS)
_TOPN = re.compile(r"\btop\s+(\d{1,3})\b|前\s*(\d{1,3})|(\d{1,3})\s*个\s*(?:\S{0,8}?)\s*(?:进程|程序)", _FLAGS)
_NAMED = re.compile(r"\b(?:named|called|matching)\s+[\"']?([\w.\-]+)|\b([A-Za-z][\w.\-]*)\s*(?:的)?\s*进程|"
                    r"\b([A-Za-z][\w.\-]*)\s+process(?:es)?\b", _FLAGS)
_NOT_NAMES = {"top", "the", "all", "running", "which", "what", "heaviest", "biggest", "memory", "cpu", "list",
              "show", "any", "my", "some", "of", "by", "most", "hungry", "ram", "mem", "rss"}
_BY_MEMORY = re.compile(r"\b(memory|ram|mem|rss)\b|内存", _FLAGS)
_LOG_WORDS = re.compile(r"\b(tail|log|logs|syslog)\b|日志", _FLAGS)
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
_TOPIC_ZH = [
    re.compile(r"(?:问过|聊过|说过|提到过?|讨论过|问|聊|说|提|讨论)(?:过)?(?:关于)?\s*(.+?)\s*"
               r"(?:的|什么|啥|哪些|吗|么|嘛|呢|事情?|问题|相关|内容|东西)*\s*[？?。！!]*\s*$"),
    re.compile(r"搜索(?:一下)?(?:历史|记录|对话|聊天记录)*\s*(?:中|里)?(?:的|关于)?\s*(.+?)\s*[？?。！!]*\s*$"),
]
_TOPIC_STOP = re.compile(r"^(?:i|me|you|it|that|this|什么|啥|了)$", _FLAGS)


def _score(text: str) -> dict[str, float]:
    scores: dict[str, float] = {}
    for name, patterns in RULES:
        s = sum(w for pat, w in patterns if pat.search(text))
        if s:
            scores[name] = s
    return scores


def history_topic(text: str) -> str | None:
    """The subject of a history question ("what did I ask about nginx earlier" -> "nginx")."""
    for pat in (_TOPIC_ZH if is_chinese(text) else _TOPIC_EN) + (_TOPIC_EN if is_chinese(text) else []):
        m = pat.search(text)
        if m:
            topic = m.group(1).strip(" \"'“”‘’,，。?？")
            topic = re.sub(r"^(?:过|关于|about)\s*", "", topic, flags=re.IGNORECASE).strip()
            topic = re.sub(r"^(?:the|a|an|my|our)\s+", "", topic, flags=re.IGNORECASE)   # "the CPU" -> "CPU"
            if topic and not _TOPIC_STOP.match(topic):
                return topic[:200]
    return None


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
    m = _TOPN.search(text)
    if m:
        args["limit"] = max(1, min(50, int(next(g for g in m.groups() if g))))
    for nm in _NAMED.finditer(text):
        name = next(g for g in nm.groups() if g)
        if name.lower() not in _NOT_NAMES:
            args["name"] = name
            break
    return args


def _log_args(text: str) -> dict[str, Any] | None:
    paths = [p for p in paths_in(text) if p != "/"]   # absolute, relative to a log root, or a file name
    if not paths:
        return None
    args: dict[str, Any] = {"path": paths[0]}
    m = _LINES.search(text)
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


def parse(text: str) -> list[Intent]:
    """Recognized intents in a stable order; an empty list means "not understood". Only the
    ``parsed_part`` of a long message is looked at."""
    text = parsed_part(text.strip())
    if not text:
        return []
    scores = _score(text)
    if scores.get("history", 0) >= THRESHOLD:
        topic = history_topic(text)
        if topic:
            return [Intent("history", scores["history"], "history_search", {"query": topic})]
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
    if _CHECK_WORDS.search(text) and _CHECK_ASKED.search(text):
        target = _network_target(text)
        if target and 1 <= target[1] <= 65535:
            return [Intent("network_check", 2.0, "network_check", {"host": target[0], "port": target[1]})]
    out: list[Intent] = []
    if scores.get("processes", 0) >= THRESHOLD:
        out.append(Intent("processes", scores.pop("processes"), "processes", _process_args(text)))
        scores.pop("cpu", None)
        scores.pop("memory", None)
    for name in ("overview", "cpu", "memory", "disk", "network", "load", "uptime"):
        if scores.get(name, 0) >= THRESHOLD:
            metric = "all" if name == "overview" else name
            out.append(Intent(name, scores[name], "sys_monitor", {"metric": metric}))
    if out and any(i.name == "overview" for i in out):
        out = [i for i in out if i.name in ("overview", "processes")]
    if scores.get("clock", 0) >= THRESHOLD:
        out.append(Intent("clock", scores["clock"], "clock", {}))
    if not out and scores.get("help", 0) >= THRESHOLD:
        out.append(Intent("help", scores["help"]))
    return out
