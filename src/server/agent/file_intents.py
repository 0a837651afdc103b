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
_CASE_TAIL = r"(?:\s*,?\s*(?:ignor(?:e|ing)[- ](?:the[- ])?case|case[- ]insensitive(?:ly)?|忽略大小写|不区分大小写))?"

_LIST = re.compile(r"\b(?:ls|list|dir)\b|\bwhat(?:'s| is) in\b|\bfiles? (?:in|under)\b|\bcontents of (?:the )?"
                   r"(?:directory|folder|dir)\b|列出|目录下|文件夹下|目录里|目录中|有哪些文件|有什么文件|下的文件",
                   re.IGNORECASE)
_READ = re.compile(r"\b(?:cat|read|open|view|print|show(?: me)?)\b|\bcontents?\b|的内容|内容|打开|读取|显示|查看|看看|看一下",
                   re.IGNORECASE)
_LOGISH = re.compile(r"\b(?:tail|logs?|syslog)\b|日志|最后\s*\d*\s*行", re.IGNORECASE)

_GREP_EN = [
    re.compile(rf"\bgrep\s+{_QUOTED}?(.+?){_QUOTED}?\s+(?:in\s+|from\s+)?({TARGET}){_CASE_TAIL}\s*[?.!]*\s*$", re.I),
    re.compile(rf"\b(?:search|look|find|grep)\s+(?:for\s+)?{_QUOTED}?(.+?){_QUOTED}?\s+(?:in|inside|within|under)\s+"
               rf"({TARGET}){_CASE_TAIL}\s*[?.!]*\s*$", re.I),
]
#: the options of a grep command, right after "grep" ("grep -ci 502 access.log", "grep --count -w ERROR app.log")
_GREP_OPTIONS = re.compile(r"\bgrep((?:\s+-{1,2}(?:[A-Za-z][A-Za-z-]*(?:=\S*)?|\d+))+)(?=\s)(?:\s+--(?=\s))?", re.I)
#: grep options search_files can honour: -i (ignore_case), -c (the answer says how many lines match), -n (every
#: match is shown with its line number), -w (a whole-word regex), -E (a regex), -F (literal, the default), -r/-R
#: (a directory is always searched recursively), -H/-s (no effect on the answer). Any other option (-v, -o, -l,
#: -A/-B/-C, -m, -x, ...) is refused by name, never searched for as text (``UnsupportedOption``).
GREP_SHORT = {"i": "ignore_case", "c": "count", "n": None, "w": "word", "E": "regex", "F": "fixed", "r": None,
              "R": None, "H": None, "s": None}
GREP_LONG = {"ignore-case": "ignore_case", "count": "count", "line-number": None, "word-regexp": "word",
             "extended-regexp": "regex", "fixed-strings": "fixed", "recursive": None, "with-filename": None,
             "no-messages": None}
#: what grep's unsupported options do, for the refusal ("grep option -v (lines NOT matching) is not supported")
GREP_UNSUPPORTED = {"v": ("lines NOT matching", "不匹配的行"), "invert-match": ("lines NOT matching", "不匹配的行"),
                    "o": ("only the matching part", "只输出匹配部分"), "l": ("file names only", "只输出文件名"),
                    "L": ("files without a match", "没有匹配的文件"), "x": ("whole-line matches", "整行匹配"),
                    "A": ("lines after each match", "匹配之后的行"), "B": ("lines before each match", "匹配之前的行"),
                    "C": ("lines around each match", "匹配前后的行"), "m": ("a match limit", "匹配数上限"),
                    "P": ("Perl regexes", "Perl 正则")}
#: an English count asked of a file ("how many ERROR lines in app.log?", "count 502 in nginx/access.log",
#: "how many times does timeout appear in app.log", "how many lines in app.log contain ERROR"): grepped, the
#: answer says how many ("N lines match"), like the Chinese "access.log 里有几个 502". The file must look like one
#: (a path or a name with an extension): "how many cores in total" is no count of a file.
_COUNT_EN = [
    re.compile(rf"\bhow\s+(?:many\s+times|often)\s+(?:does|do|did|is|are)\s+{_QUOTED}?(.+?){_QUOTED}?\s+(?:appear|occur|"
               rf"show\s+up|come\s+up|logged|found)\s+in\s+(?:the\s+)?(?:file\s+)?({PATH}){_CASE_TAIL}\s*[?.!]*\s*$", re.I),
    re.compile(rf"\b(?:how\s+many|count(?:\s+(?:of|the))*|number\s+of)\s+(?:lines?\s+(?:with|containing|matching|mentioning)"
               rf"\s+|occurrences\s+of\s+|times\s+)?{_QUOTED}?(.+?){_QUOTED}?\s*(?:\b(?:lines?|entries|occurrences|"
               rf"times|matches|hits)\b\s*)?(?:\b(?:are|were|is)\s+(?:there\s+)?)?(?:\bin|\binside|\bwithin|\bof)\s+(?:the\s+)?(?:file\s+)?"
               rf"({PATH}){_CASE_TAIL}\s*[?.!]*\s*$", re.I),
    re.compile(rf"\bhow\s+many\s+lines?\s+(?:in|of)\s+(?:the\s+)?(?:file\s+)?({PATH})\s+(?:contain|match|have|mention|"
               rf"include)s?\s+{_QUOTED}?(.+?){_QUOTED}?{_CASE_TAIL}\s*[?.!]*\s*$", re.I),
]
#: what a count names that is no text to grep ("how many lines in app.log": the file's length, not asked here)
_NOT_PATTERN = re.compile(r"^(?:lines?|entries|rows|records|times|matches|hits|occurrences|of|the|a|an)$", re.I)
#: what a count of a directory names ("count the files in /var/log", "how many directories in nginx"): its entries,
#: listed by list_dir (the answer says how many), never grepped for the word
_DIR_ENTRIES = re.compile(r"^(?:(?:the|all)\s+)?(?:(?:sub-?)?(?:files?|director(?:y|ies)|dirs?|folders?)|entries|items|"
                          r"sub-?dirs?)$", re.I)
_COUNT_ENTRIES = re.compile(r"\b(?:count|how\s+many|number\s+of)\s+(?:of\s+)?(?:the\s+|all\s+)?(?:sub-?)?(?:files?|"
                            r"director(?:y|ies)|dirs?|folders?|entries|items)\s+(?:are\s+(?:there\s+)?)?"
                            rf"(?:in|under|inside|within)\s+(?:the\s+)?(?:directory\s+|folder\s+|dir\s+)?({TARGET})"
                            r"\s*/?\s*[?.!]*\s*$", re.I)
#: the same in Chinese ("统计 /var/log 下有多少个文件", "nginx 目录里有几个文件"): listed, never grepped for 文件
_COUNT_ENTRIES_ZH = re.compile(rf"({TARGET})\s*(?:目录|文件夹)?\s*(?:下|中|里|里面|内)\s*(?:一共|总共|共)?\s*有?\s*"
                               r"(?:多少|几)\s*个?\s*(?:子目录|文件夹|目录|文件)\s*(?:吗|呢)?\s*[？?。！!]*\s*$")
#: a log level counted or filtered in the plural ("how many errors in app.log"): grepped case-insensitively as
#: the level's stem (error, warn, fatal, critical, exception)
LEVEL_WORDS = {"error": "error", "errors": "error", "warning": "warn", "warnings": "warn", "warn": "warn",
               "warns": "warn", "fatal": "fatal", "fatals": "fatal", "critical": "critical", "criticals": "critical",
               "exception": "exception", "exceptions": "exception"}
#: words that stand for a file named before ("grep ERROR in it", "在它里面搜索"): never a path. The offline
#: agent resolves them to the file of the previous request when it can see it, else asks which file
PRONOUNS = re.compile(r"^(?:it|this|that|them|these|those|there|here|same|the\s+same(?:\s+(?:file|log))?|"
                      r"(?:this|that|the|same)\s+(?:file|log|one)|它|这个|那个|这个文件|那个文件|该文件|这里|那里)$", re.I)
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


#: English number words said as counts ("top three processes", "the last five lines", "twenty-five lines",
#: "a hundred lines"): written in digits where a count is read (``english_numbers``), like the Chinese numerals
EN_UNITS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                                         "fourteen fifteen sixteen seventeen eighteen nineteen".split())}
EN_TENS = {w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)}
_EN_SMALL = rf"(?:(?:{'|'.join(EN_TENS)})(?:[\s-](?:{'|'.join(list(EN_UNITS)[1:10])}))?|{'|'.join(EN_UNITS)})"
_EN_NUM = rf"(?:(?:a|one)\s+hundred(?:\s+(?:and\s+)?{_EN_SMALL})?|{_EN_SMALL})"
#: where an English number is a count: after top / last / first / latest / final / next, or before what is
#: counted (lines, processes, entries, a superlative: "five biggest processes")
_EN_COUNT = re.compile(rf"(?:(?<=\btop\s)|(?<=\blast\s)|(?<=\bfirst\s)|(?<=\blatest\s)|(?<=\bfinal\s)|(?<=\bnext\s))"
                       rf"\s*({_EN_NUM})\b|\b({_EN_NUM})(?=\s+(?:log\s+)?(?:lines?|processes|procs?|programs|entries|rows|"
                       r"most|biggest|largest|heaviest|hungriest|busiest|highest|greediest|top)\b)", re.IGNORECASE)


def en_number(said: str) -> int | None:
    """An English number word as a number: "three" -> 3, "twenty-five" -> 25, "a hundred and five" -> 105."""
    words = re.split(r"[\s-]+", said.lower())
    total = 0
    if "hundred" in words:
        at = words.index("hundred")
        total, words = 100, [w for w in words[at + 1:] if w != "and"]
    for w in words:
        if w in EN_TENS:
            total += EN_TENS[w]
        elif w in EN_UNITS:
            total += EN_UNITS[w]
        else:
            return None
    return total


def english_numbers(text: str) -> str:
    """``text`` with the English number words of counts in digits ("top three processes" -> "top 3
    processes", "last five lines" -> "last 5 lines"); paths and quoted strings are left as said."""
    if not re.search(r"[A-Za-z]", text):
        return text
    kept = _kept_spans(text)

    def digits(m: re.Match[str]) -> str:
        said = m.group(1) or m.group(2)
        if any(a <= m.start() < b for a, b in kept):
            return m.group(0)
        n = en_number(said)
        return m.group(0) if n is None else m.group(0).replace(said, str(n), 1)
    return _EN_COUNT.sub(digits, text)


def counts_in_digits(text: str) -> str:
    """``text`` with its counts in digits, Chinese (``arabic_numbers``) and English (``english_numbers``)."""
    return english_numbers(arabic_numbers(text))


#: a quoted string (a grep pattern, a name with spaces): no numeral in it is a count
_QUOTED_SPAN = re.compile(r"[\"'“”‘’`][^\"'“”‘’`\n]*[\"'“”‘’`]")


def _kept_spans(text: str) -> list[tuple[int, int]]:
    """The spans of ``text`` that ``arabic_numbers`` leaves as said: its quoted strings and its paths
    (``paths_in``: "/data/第三季度/report.log" after a space, "logs/第二批/a.log")."""
    return [m.span() for m in _QUOTED_SPAN.finditer(text)] + _path_spans(text)


_IGNORE_CASE = re.compile(r"\b(?:ignor(?:e|ing)[- ](?:the[- ])?case|case[- ]insensitive(?:ly)?)\b|忽略大小写|不区分大小写", re.IGNORECASE)


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


#: the placeholder a pronoun target ("grep ERROR in it") is searched as, so the patterns find the text around it
_PRONOUN_SLOT = "__it__"
_PRONOUN_TAIL = re.compile(r"\b(in|from|inside|within|of)\s+(it|this|that|them|there|the\s+same(?:\s+(?:file|log))?|"
                           r"(?:this|that|the|same)\s+(?:file|log|one))(?=\s*[?.!]*\s*$)", re.I)


def _grep_options(text: str) -> tuple[dict[str, bool] | str, str]:
    """(the options of a grep command as flags, the text without them): "grep -ci 502 a.log" ->
    ({"count": True, "ignore_case": True}, "grep 502 a.log"). An option search_files cannot honour is
    returned as said ("-v") in place of the flags."""
    m = _GREP_OPTIONS.search(text)
    if m is None:
        return {}, text
    flags: dict[str, bool] = {}
    for token in m.group(1).split():
        if token.startswith("--"):
            name = token[2:].split("=", 1)[0]
            if name not in GREP_LONG:
                return token.split("=", 1)[0], text
            if GREP_LONG[name]:
                flags[GREP_LONG[name]] = True
            continue
        if token[1:].isdigit():
            return token, text                                  # "-5": context lines
        for letter in token[1:]:
            if letter == "e":                                   # -e PATTERN: the pattern follows
                continue
            if letter not in GREP_SHORT:
                return f"-{letter}", text
            if GREP_SHORT[letter]:
                flags[GREP_SHORT[letter]] = True
    return flags, text[:m.start(1)] + text[m.end():]


def unsupported_option(option: str) -> tuple[str, str]:
    """What a refused grep option does, in English and Chinese ("lines NOT matching"), or ("", "")."""
    return GREP_UNSUPPORTED.get(option.lstrip("-"), ("", ""))


def _grep(text: str, previous: str | None = None) -> tuple[str, dict[str, Any]] | None:
    flags, text = _grep_options(text) if re.search(r"\bgrep\b", text, re.I) else ({}, text)
    if isinstance(flags, str):
        return "unsupported", {"option": flags}
    text = _PRONOUN_TAIL.sub(lambda m: f"{m.group(1)} {_PRONOUN_SLOT}", text)
    for pat in _GREP_EN:
        m = pat.search(text)
        if m:
            return _grep_args(text, m.group(1), m.group(2), flags, previous)
    for i, pat in enumerate(_COUNT_EN):
        m = pat.search(text)
        if m:
            pattern, root = (m.group(2), m.group(1)) if i == 2 else (m.group(1), m.group(2))
            return _grep_args(text, pattern, root, {**flags, "count": True}, previous)
    if not _ZH_GREP_WORDS.search(text):
        return None
    for pat in _GREP_ZH:
        m = pat.search(text)
        if m:
            root, pattern = m.group(1), m.group(2)
            return _grep_args(text, pattern, root, flags, previous)
    return None


def _grep_args(text: str, pattern: str, root: str, flags: dict[str, bool],
               previous: str | None) -> tuple[str, dict[str, Any]] | None:
    pattern = re.sub(r"\s*(?:,\s*)?(?:ignor(?:e|ing)[- ](?:the[- ])?case|case[- ]insensitive(?:ly)?|忽略大小写|不区分大小写)\s*$", "", pattern,
                     flags=re.IGNORECASE).strip(" \"'“”‘’`")
    if not pattern:
        return None
    if root == _PRONOUN_SLOT or PRONOUNS.fullmatch(root):     # "grep ERROR in it": the file named before
        if previous is None:
            return "which_file", {"pattern": pattern[:200]}
        root = previous
    if flags.get("count"):
        if _NOT_PATTERN.match(pattern) or _DIR_ENTRIES.match(pattern):
            return None                                       # (the entries of a directory: ``parse_file_request``)
        if re.fullmatch(r"\d+s", pattern):                    # "how many 502s"
            pattern = pattern[:-1]
        elif pattern.lower() in LEVEL_WORDS and not pattern.isupper():   # "how many errors": any case
            pattern, flags = LEVEL_WORDS[pattern.lower()], {**flags, "ignore_case": True}
    args: dict[str, Any] = {"root": root, "pattern": pattern[:1000]}
    regex = bool(flags.get("regex")) and not flags.get("fixed")
    if flags.get("word"):       # -w: a whole word, as RE2 reads \b
        args["pattern"] = (rf"\b(?:{pattern})\b" if regex else rf"\b{re.escape(pattern)}\b")[:1000]
        regex = True
    if regex:
        args["regex"] = True
    if flags.get("ignore_case") or _IGNORE_CASE.search(text):
        args["ignore_case"] = True
    return "search_files", args


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


def parse_file_request(text: str, previous: str | None = None) -> tuple[str, dict[str, Any]] | None:
    """(tool, arguments) for a file request, or None. Two answers call no tool: ("unsupported", {"option"})
    for a grep option search_files cannot honour ("grep -v INFO app.log"), ("which_file", {"pattern"}) for a
    grep in a file named by a pronoun ("grep ERROR in it") when ``previous``, the file of the previous
    request, is not known."""
    if len(text) > MAX_REQUEST_CHARS:
        return None
    entries_zh = _COUNT_ENTRIES_ZH.search(text)
    if entries_zh is not None:        # (before the grep: "有多少个文件" counts entries, it looks for no 文件)
        return "list_dir", {"path": entries_zh.group(1) if not PRONOUNS.fullmatch(entries_zh.group(1)) else previous or "."}
    grep = _grep(text, previous)      # (the pattern and the path as said: "搜索 第三次" stays 第三次)
    if grep is not None:
        return grep
    paths = paths_in(text)
    counted = counts_in_digits(text)  # "最后二十行", "第二到第五行": the lines asked, in digits
    entries = _COUNT_ENTRIES.search(text)
    if entries is not None and not (re.search(r"\b(?:entries|items)\b", entries.group(0), re.I)
                                    and re.search(r"\.[A-Za-z][A-Za-z0-9]{0,7}$", entries.group(1))):
        # "count the files in /var/log": the listing says how many entries ("entries in app.log" are its lines)
        return "list_dir", {"path": entries.group(1) if not PRONOUNS.fullmatch(entries.group(1)) else previous or "."}
    if _LIST.search(text) and not (paths and _READ.search(text) and not re.search(r"目录|folder|directory|\bdir\b|\bls\b", text, re.I)):
        bare = _BARE_DIR.search(text) if not paths else None
        name = bare.group(1) if bare is not None and not bare.group(1).startswith("-") else None
        return "list_dir", {"path": paths[0] if paths else name or "."}
    if paths and _READ.search(text) and (not _LOGISH.search(counted) or _LINES.search(counted)):
        return "read_file", {"path": paths[0], **_line_range(counted)}
    if paths and re.search(r"的内容|\bcontents?\b|\bcat\b", text, re.IGNORECASE):
        return "read_file", {"path": paths[0], **_line_range(counted)}   # "查看 app.log 的内容": from its start
    return None
