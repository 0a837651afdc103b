"""Offline recognition of file requests, in Chinese and English: list a directory, show a file, grep.

"列出 /var/log/nginx 目录下的文件", "what's in /etc/nginx" -> list_dir; "查看 config.yaml 的内容",
"cat /etc/hosts" -> read_file; "grep ERROR in app.log", "在 app.log 中搜索 ERROR" -> search_files.
A request that names no path gets none of them (except a directory listing: "ls nginx" lists the
bare name, "list files" the first allowed root); "第 2 行" / "lines 2-5" choose the lines read. Tails of logs stay with read_log (server.agent.intents).
"""
from __future__ import annotations

import re
from typing import Any

# Paths in ASCII only: Python's \w would swallow the Chinese words around a path.
_C = r"[A-Za-z0-9_.\-@+~]"
_ABS = rf"/(?:{_C}+(?:/{_C}+)*/?)?"      # unambiguous: no nested quantifier can backtrack
_REL = rf"{_C}+(?:/{_C}+)+/?"
_NAME = rf"{_C}*[A-Za-z0-9_]\.[A-Za-z][A-Za-z0-9]{{0,7}}"
_DOTFILE = r"\.[A-Za-z][A-Za-z0-9_.\-]*"
PATH = rf"(?:{_ABS}|{_REL}|{_NAME}|{_DOTFILE}|\.)"
TARGET = rf"(?:{PATH}|{_C}+)"     # after "in" / "在" a bare name is a path too ("grep ERROR in nginx")
_PATH_RE = re.compile(rf"(?<![A-Za-z0-9_/.])({_ABS}|{_REL}|{_NAME}|{_DOTFILE})(?![A-Za-z0-9_/])")
_QUOTED = r"[\"'“”‘’`]"
_CASE_TAIL = r"(?:\s*,?\s*(?:ignore[- ]case|case[- ]insensitive|忽略大小写|不区分大小写))?"

_LIST = re.compile(r"\b(?:ls|list|dir)\b|\bwhat(?:'s| is) in\b|\bfiles? (?:in|under)\b|\bcontents of (?:the )?"
                   r"(?:directory|folder|dir)\b|列出|目录下|文件夹下|目录里|目录中|有哪些文件|有什么文件|下的文件",
                   re.IGNORECASE)
_READ = re.compile(r"\b(?:cat|read|open|view|print|show(?: me)?)\b|\bcontents?\b|的内容|内容|打开|读取|显示|查看|看看|看一下",
                   re.IGNORECASE)
_LOGISH = re.compile(r"\b(?:tail|logs?|syslog)\b|日志|最后\s*\d*\s*行", re.IGNORECASE)

_GREP_EN = [
    re.compile(rf"\bgrep\s+(-i\s+)?{_QUOTED}?(.+?){_QUOTED}?\s+(?:in\s+|from\s+)?({TARGET}){_CASE_TAIL}\s*[?.!]*\s*$", re.I),
    re.compile(rf"\b(?:search|look|find|grep)\s+(?:for\s+)?{_QUOTED}?(.+?){_QUOTED}?\s+(?:in|inside|within|under)\s+"
               rf"({TARGET}){_CASE_TAIL}\s*[?.!]*\s*$", re.I),
]
#: a count asked of a file ("access.log 里有几个 502", "app.log 中有多少行 ERROR"): grepped, the answer says how many
_HOW_MANY = r"有几个|有几条|有几行|有几次|有多少(?:个|条|行|次)?"
#: what a Chinese grep calls the lines it wants ("包含 timeout 的行"), not part of the pattern
_LINE_WORD = r"(?:的(?:行|记录|日志|内容))"
_GREP_ZH = [
    re.compile(rf"在\s*({TARGET})\s*(?:文件|目录)?\s*(?:中|里|里面|内|下)?\s*(?:搜索|查找|搜|找|grep)(?:一下)?\s*"
               rf"{_QUOTED}?(.+?){_QUOTED}?\s*[？?。！!]*\s*$"),
    re.compile(rf"(?:搜索|查找|grep)\s*({TARGET})\s*(?:文件|目录)?\s*(?:中|里|里面|内|下)\s*(?:的)?\s*"
               rf"(?:包含|含有)?\s*{_QUOTED}?(.+?){_QUOTED}?\s*{_LINE_WORD}?\s*[？?。！!]*\s*$"),
    re.compile(rf"({TARGET})\s*(?:文件|目录)?\s*(?:中|里|里面|下)\s*(?:有没有|是否有|包含|{_HOW_MANY})\s*"
               rf"{_QUOTED}?(.+?){_QUOTED}?\s*{_LINE_WORD}?\s*[？?。！!吗]*\s*$"),
]
_ZH_GREP_WORDS = re.compile(rf"搜|找|grep|有没有|是否有|包含|{_HOW_MANY}")
MAX_REQUEST_CHARS = 500      # longer messages are not file requests (and keep the regexes cheap)

# Chinese numerals said as counts and positions ("前三", "最后二十行", "第五行", "两个进程", "一百行"):
# written in digits before the patterns look for numbers (``arabic_numbers``)
_ZH_DIGITS = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
_ZH_NUM = "[零〇一二两三四五六七八九十百]+"
_ZH_COUNT = re.compile(rf"(?<=前)\s*({_ZH_NUM})|(?<=最后)\s*({_ZH_NUM})|(?<=最近)\s*({_ZH_NUM})|(?<=第)\s*({_ZH_NUM})|"
                       rf"(?<=\btop)\s*({_ZH_NUM})|(?<=[到至~-])\s*({_ZH_NUM})(?=\s*行)|"
                       rf"(?<![零〇一二两三四五六七八九十百])({_ZH_NUM})(?=\s*(?:个|行|条))", re.IGNORECASE)


def zh_number(text: str) -> int | None:
    """一..九, 两, 十, 百 (and 零) as a number: "二十" -> 20, "三十五" -> 35, "一百零五" -> 105, "十二" -> 12;
    None for what is no number ("一二")."""
    total, digit = 0, None
    for ch in text:
        if ch in _ZH_DIGITS:
            if digit:                       # two digits in a row ("一二"): not a number said this way
                return None
            digit = _ZH_DIGITS[ch]
        elif ch in "十百":
            total += (digit if digit is not None else 1) * (10 if ch == "十" else 100)
            digit = None
        else:
            return None
    return total + (digit or 0)


def arabic_numbers(text: str) -> str:
    """``text`` with the Chinese numerals of counts and positions in digits: "内存占用前三的进程" ->
    "内存占用前3的进程", "最后二十行" -> "最后20行", "第五到第十行" -> "第5到第10行". A lone "一" before 个/条
    stays ("有没有一个 python 进程": an article, no count); "一下", "一些", "统一" are not touched, nor is
    anything inside a path or a quoted string ("/data/第三季度/report.log", "“第三次”": ``_kept_spans``).
    Only the counts being parsed are read from its result (``intents`` 前N / N个 of a process listing, 最后N行
    of a log, 第N行 of a file): a path, a grep pattern and every other argument come from the text as said."""
    if not re.search(_ZH_NUM, text):
        return text
    kept = _kept_spans(text)

    def digits(m: re.Match[str]) -> str:
        said = next(g for g in m.groups() if g is not None)
        if m.group(7) is not None and said == "一" or any(a <= m.start() < b for a, b in kept):
            return m.group(0)
        n = zh_number(said)
        return m.group(0) if n is None else m.group(0).replace(said, str(n), 1)
    return _ZH_COUNT.sub(digits, text)


#: a quoted string (a grep pattern, a name with spaces): no numeral in it is a count
_QUOTED_SPAN = re.compile(r"[\"'“”‘’`][^\"'“”‘’`\n]*[\"'“”‘’`]")


def _kept_spans(text: str) -> list[tuple[int, int]]:
    """The spans of ``text`` that ``arabic_numbers`` leaves as said: its quoted strings and its paths
    (``paths_in``: "/data/第三季度/report.log" after a space, "logs/第二批/a.log")."""
    return [m.span() for m in _QUOTED_SPAN.finditer(text)] + _path_spans(text)


_IGNORE_CASE = re.compile(r"\b(?:ignore[- ]case|case[- ]insensitive)\b|忽略大小写|不区分大小写", re.IGNORECASE)


# A path with other characters ("/data/日志/app.log") is taken only when quoted or after a space:
# unquoted and next to Chinese words its ends would be a guess.
_WIDE_PATH = r"(?:/[^\s/]*(?:/[^\s/]*)*|[^\s/]+(?:/[^\s/]*)+|[^\s/]*[^\s/.]\.[A-Za-z][A-Za-z0-9]{0,7})"
_WIDE_RE = re.compile(r"[\"'“”‘’`]([^\"'“”‘’`\n]*[^\x00-\x7f][^\"'“”‘’`\n]*)[\"'“”‘’`]"
                      rf"|(?<=\s)({_WIDE_PATH})(?=[\s，。？！,?!]|$)")
_TRAILING = "，。？！,?!"


def _found_paths(text: str) -> list[tuple[tuple[int, int], str]]:
    """((start, end), path) of each path-looking token of ``text``, in the order they appear."""
    found: list[tuple[tuple[int, int], str]] = []
    spans: list[tuple[int, int]] = []
    for m in _WIDE_RE.finditer(text):
        quoted = m.group(1) is not None
        path = m.group(1).strip() if quoted else m.group(2).rstrip(_TRAILING)
        if not path.isascii() and (not quoted or re.fullmatch(_WIDE_PATH, path.replace(" ", "_"))):
            found.append((m.span(), path))
            spans.append(m.span())
    for m in _PATH_RE.finditer(text):
        if not re.fullmatch(r"[\d.]+", m.group(1)) and not any(a <= m.start() < b for a, b in spans):
            found.append((m.span(1), m.group(1)))
    return sorted(found)


def paths_in(text: str) -> list[str]:
    """Path-looking tokens (absolute, relative with a slash, or a file name with an extension), in
    the order they appear; a token with characters outside ASCII only when quoted or between spaces."""
    return [path for _, path in _found_paths(text)]


def _path_spans(text: str) -> list[tuple[int, int]]:
    return [span for span, _ in _found_paths(text)]


def _grep(text: str) -> dict[str, Any] | None:
    for pat in _GREP_EN:
        m = pat.search(text)
        if m:
            groups = m.groups()
            flag, pattern, root = (groups if len(groups) == 3 else (None, *groups))
            return _grep_args(text, pattern, root, bool(flag))
    if not _ZH_GREP_WORDS.search(text):
        return None
    for pat in _GREP_ZH:
        m = pat.search(text)
        if m:
            root, pattern = m.group(1), m.group(2)
            return _grep_args(text, pattern, root, False)
    return None


def _grep_args(text: str, pattern: str, root: str, ignore_case: bool) -> dict[str, Any] | None:
    pattern = re.sub(r"\s*(?:,\s*)?(?:ignore[- ]case|case[- ]insensitive|忽略大小写|不区分大小写)\s*$", "", pattern,
                     flags=re.IGNORECASE).strip(" \"'“”‘’`")
    if not pattern:
        return None
    args: dict[str, Any] = {"root": root, "pattern": pattern[:1000]}
    if ignore_case or _IGNORE_CASE.search(text):
        args["ignore_case"] = True
    return args


# "ls nginx", "list files in nginx", "列出 nginx 目录下的文件": a bare directory name to list
_BARE_DIR = re.compile(rf"(?:\b(?:ls|dir)\s+|\bfiles?\s+(?:in|under)\s+|列出\s*)({_C}+)"
                       r"(?=\s*(?:目录|文件夹|[?.!？。]|$))", re.IGNORECASE)
# "第 2 行", "第2到5行", "line 2", "lines 2-5": where read_file starts and how many lines it shows
_LINES = re.compile(r"第\s*(\d{1,9})\s*(?:(?:-|到|至|~)\s*(?:第\s*)?(\d{1,9})\s*)?行"
                    r"|\blines?\s+(\d{1,9})(?:\s*(?:-|to|through)\s*(\d{1,9}))?\b", re.IGNORECASE)


def _line_range(text: str) -> dict[str, int]:
    m = _LINES.search(text)
    if m is None:
        return {}
    first, last = (int(m.group(1)), m.group(2)) if m.group(1) else (int(m.group(3)), m.group(4))
    first = max(first, 1)
    count = int(last) - first + 1 if last is not None and int(last) >= first else 1
    return {"offset": first, "lines": count}


def parse_file_request(text: str) -> tuple[str, dict[str, Any]] | None:
    """(tool, arguments) for a file request, or None."""
    if len(text) > MAX_REQUEST_CHARS:
        return None
    grep = _grep(text)                # (the pattern and the path as said: "搜索 第三次" stays 第三次)
    if grep is not None:
        return "search_files", grep
    paths = paths_in(text)
    counted = arabic_numbers(text)    # "最后二十行", "第二到第五行": the lines asked, in digits
    if _LIST.search(text) and not (paths and _READ.search(text) and not re.search(r"目录|folder|directory|\bdir\b|\bls\b", text, re.I)):
        bare = _BARE_DIR.search(text) if not paths else None
        name = bare.group(1) if bare is not None and not bare.group(1).startswith("-") else None
        return "list_dir", {"path": paths[0] if paths else name or "."}
    if paths and _READ.search(text) and (not _LOGISH.search(counted) or _LINES.search(counted)):
        return "read_file", {"path": paths[0], **_line_range(counted)}
    if paths and re.search(r"的内容|\bcontents?\b|\bcat\b", text, re.IGNORECASE):
        return "read_file", {"path": paths[0], **_line_range(counted)}   # "查看 app.log 的内容": from its start
    return None
