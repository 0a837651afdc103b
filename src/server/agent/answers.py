"""Answers of the offline agent, written from real tool results in English or Chinese.

``render(call, zh)`` turns one finished ToolCall into a short paragraph; every number comes from
the tool's JSON result. Failed calls are reported with the tool's own error message; the tools
write it in English, so for a Chinese question the known ones are said in Chinese (``error_zh``).
A Chinese answer says nothing else in the tools' English either: durations, times (``file_answers.when``),
roles and connect results are written from the result's fields, and an OS error text that is not
known is quoted as the original (``os_error_zh``).

Canned replies (help, not understood) are stored like any answer, so they are worded to stay out of
the user's searches: the reply to an unknown request lists no example requests (it points to
"help"), and the help text's examples name no subject a user would search for (no "nginx"). The
offline agent also marks them ``"canned": true`` in the message metadata.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable

import re

import orjson

from server.agent import downloads, file_answers, file_intents, intents
from server.agent.file_answers import when
from server.memory.sensitive import mentions_secret
from server.memory.recall import QueryMatch
from server.tools.units import fmt_duration
from storage.models import ToolCall

# Every capability is listed with the condition it needs (help_text is not told what this user has):
# the file tools need [tools] file_roots, the log tail [tools] log_roots, documents an upload, what I
# remember long-term memory on the server.
_HELP_LOG_EN = "- the end of a log file (\"tail <name>\", e.g. \"tail syslog\": a path under the server's [tools] log_roots, once set),\n"
_HELP_LOG_ZH = "- 日志文件末尾（“查看 <文件名> 日志”，例如“查看 syslog 日志”：路径在服务器的 [tools] log_roots 下，需先配置），\n"
_HELP_FILES_EN = ("- files: list a directory, show a file, search files (\"ls <dir>\", \"cat <file>\", "
                  "\"grep <text> in <file>\"; once the server sets [tools] file_roots),\n")
_HELP_FILES_ZH = ("- 文件：列出目录、查看文件、搜索文件（“列出 <目录> 目录下的文件”、“查看 <文件> 的内容”、"
                  "“在 <文件> 中搜索 <文字>”，需服务器配置 [tools] file_roots），\n")
HELP_EN = (
    "I'm the offline assistant: no language model is configured, so I understand a fixed set of requests "
    "and answer from live tool results. My tools only read: I never change anything on the machine. I can report:\n"
    "- CPU usage (\"CPU usage\"), memory (\"how much memory is free\"), disks (\"show disk usage\"),\n"
    "- network interfaces and traffic, load average, uptime, or everything at once (\"system status\"),\n"
    "- top processes (\"top processes by memory\", \"top 5 processes named python\"),\n"
    "- whether a port answers (\"check port 22 on localhost\"; only hosts allowed by the server),\n"
    + _HELP_LOG_EN + _HELP_FILES_EN +
    "- your uploaded documents (\"according to my documents, ...\"; once you upload some: `nplt-client kb upload`), "
    "and a download of one (\"download <name>\"),\n"
    "- what you tell me to remember or forget (\"remember that ...\", \"forget ...\", \"what do you remember about "
    "me?\"; when long-term memory is on),\n"
    "- your earlier conversations (\"what did I ask about <topic> earlier\", \"what did we talk about yesterday\"), "
    "and the time.\n"
)
HELP_ZH = (
    "我是离线助手：服务器没有配置大语言模型，所以我只理解一组固定的请求，并用实时工具结果回答。"
    "我的工具都是只读的，不会修改机器上的任何东西。我可以查看：\n"
    "- CPU 使用率（“查看CPU使用率”）、内存（“内存还剩多少”）、磁盘（“磁盘空间”），\n"
    "- 网卡与流量、系统负载、运行时间，或一次查看全部（“系统状态”），\n"
    "- 占用最多的进程（“占用内存最多的进程”、“前5个python进程”），\n"
    "- 端口是否可连通（“检查 127.0.0.1:22 端口”，仅限服务器允许的主机），\n"
    + _HELP_LOG_ZH + _HELP_FILES_ZH +
    "- 你上传的文档（“根据知识库，……”，需先上传文档：`nplt-client kb upload`），以及下载文档（“下载 <文件名>”），\n"
    "- 记住或忘记你告诉我的事（“记住……”、“忘掉……”、“你记得我什么”，需服务器开启长期记忆），\n"
    "- 你之前的对话（“我之前问过<主题>什么”、“昨天我们聊过什么”），以及当前时间。\n"
)
LLM_HINT_EN = ("To chat freely, configure a language model and restart the server, e.g. "
               "`NPLT_LLM_PROVIDER=deepseek NPLT_LLM_API_KEY=sk-...`, or `NPLT_LLM_BASE_URL=http://127.0.0.1:11434/v1` "
               "for a local Ollama (see docs/agent.md).")
LLM_HINT_ZH = ("如需自由对话，请配置大语言模型后重启服务器，例如 "
               "`NPLT_LLM_PROVIDER=deepseek NPLT_LLM_API_KEY=sk-...`，或本地 Ollama："
               "`NPLT_LLM_BASE_URL=http://127.0.0.1:11434/v1`（见 docs/agent.md）。")


#: the heads of the acknowledgement of what long-term memory keeps (``noted``), English then Chinese:
#: ``server.turns`` replaces them when the memory could not store it
NOTED_HEADS = ("Noted:", "好的，记下了：")

def help_text(zh: bool, roots: tuple[list[str], list[str]] | None = None) -> str:
    """The capabilities; with ``roots`` (the server's ``[tools] log_roots`` and ``file_roots``) the log and file
    lines say where they read, or that they are off, instead of naming the settings they need."""
    text = HELP_ZH if zh else HELP_EN
    if roots is not None:
        log_roots, file_roots = roots
        text = text.replace(_HELP_LOG_ZH if zh else _HELP_LOG_EN, _log_line(log_roots, zh))
        text = text.replace(_HELP_FILES_ZH if zh else _HELP_FILES_EN, _files_line(file_roots, log_roots, zh))
    return (text + "\n" + LLM_HINT_ZH) if zh else (text + "\n" + LLM_HINT_EN)


def _log_line(log_roots: list[str], zh: bool) -> str:
    if not log_roots:
        return _j(zh, "- (log files: not enabled on this server; its [tools] log_roots is empty),\n",
                  "- （日志文件：这台服务器没有启用，[tools] log_roots 为空），\n")
    where = ", ".join(log_roots)
    return _j(zh, f"- the end of a log file under {where} (\"tail <name>\", a path relative to that directory, "
                  "e.g. \"tail app.log\", \"last 20 lines of <name>\"),\n",
              f"- {where} 下日志文件的末尾（“查看 <文件名> 日志”，路径相对于该目录，例如“查看 app.log 最后 20 行”），\n")


def _files_line(file_roots: list[str], log_roots: list[str], zh: bool) -> str:
    if not file_roots:
        return _j(zh, "- (files: listing, showing and searching files is not enabled on this server; its [tools] "
                      "file_roots is empty),\n",
                  "- （文件：这台服务器没有启用列出、查看和搜索文件，[tools] file_roots 为空），\n")
    where = ", ".join(list(dict.fromkeys([*file_roots, *log_roots])))
    return _j(zh, f"- files under {where}: list a directory, show a file, search files (\"ls <dir>\", \"cat <file>\", "
                  "\"grep <text> in <file>\", \"how many <text> lines in <file>\"),\n",
              f"- {where} 下的文件：列出目录、查看文件、搜索文件（“列出 <目录> 目录下的文件”、“查看 <文件> 的内容”、"
              "“在 <文件> 中搜索 <文字>”），\n")


def not_understood(zh: bool) -> str:
    """The reply to an unknown request: no example requests in it (see the module docstring)."""
    if zh:
        return "抱歉，离线助手无法理解这个请求。输入“帮助”查看我能做什么。\n\n" + LLM_HINT_ZH
    return ("Sorry, the offline assistant cannot handle that request. Say \"help\" to see what I can do.\n\n"
            + LLM_HINT_EN)


def refusal(zh: bool) -> str:
    """The reply to a request to act on the machine (``intents`` "refuse": kill, delete, restart, run, ...)."""
    return _j(zh, "I can't do that: the offline assistant's tools are read-only, so I never kill processes, delete "
                  "or change files, restart or stop services, or run commands. I can show and check instead: "
                  "processes, logs, files, disk and memory, whether a port answers.",
              "无法执行这个操作：离线助手的工具都是只读的，不会结束进程、删除或修改文件、重启或停止服务，也不会执行命令。"
              "我可以帮你查看和检查：进程、日志、文件、磁盘与内存、端口是否可连通。")


def log_path_needed(zh: bool) -> str:
    """The reply to a log asked for without saying which (``intents`` "log_path": "看下错误日志")."""
    return _j(zh, "Which log file? Give its path, absolute or relative to a log directory of the server "
                  "([tools] log_roots), e.g. \"tail nginx/error.log\".",
              "请告诉我是哪个日志文件：给出它的路径（绝对路径，或相对于服务器日志目录 [tools] log_roots 的路径），"
              "例如“查看 nginx/error.log 最后 20 行”。")


#: what an answer adds to a tool's result for what the question asked beyond it (``intents.Intent.note`` and
#: ``Intent.notes``: a key and the values its text names, ``{pid}``, ``{part}``): (English, Chinese), said before
#: the answer, or after it for the keys of ``NOTES_AFTER``
NOTES = {"io_not_measured": ("Disk I/O (throughput, IOPS) is not measured by the offline tools; disk space is:",
                             "离线工具不测量磁盘 IO（读写速度、IOPS），以下是磁盘空间：")}
NOTES.update({
    "past_reading": ("I only see the machine now: no past readings are kept, so this is the current reading:",
                     "我只能看到机器现在的状态，不保存过去的读数；以下是当前读数："),
    "no_rate": ("No rate (bytes per second) is measured: these are totals since boot.",
                "离线工具不测量速率（每秒字节数）：以下是开机以来的累计流量。"),
    "no_temperature": ("CPU temperature is not read by the offline tools; CPU usage is:",
                       "离线工具不读取 CPU 温度；以下是 CPU 使用率："),
    "decimal_units": ("Sizes are in binary units (1 GiB = 1.074 GB); each is also given in {unit}.",
                      "大小以二进制单位表示（1 GiB = 1.074 GB），并附上 {unit} 换算。"),
    "service_not_checked": ("Services are not checked: the offline tools read no service manager (systemd). "
                            "Processes named like '{service}' (a running process is a sign it is up; a port check "
                            "or its log says more):",
                            "离线工具不检查服务状态（不读取 systemd 等服务管理器）。以下是名称包含“{service_zh}”的进程"
                            "（有进程在运行说明它可能在运行；也可以检查它的端口或查看它的日志）："),
    "user_filter": ("The processes tool cannot filter by user ({user}): the list is of every user's processes, "
                    "each with its user.", "进程工具不能按用户（{user}）筛选：以下列出所有用户的进程，并标出每个进程的用户。"),
    "level_filter": ("Lines with {levels} (any case), from the start of the log:",
                     "包含 {levels}（不区分大小写）的行，从日志开头起："),
    "log_time_range": ("The time range ({range}) was not applied: the offline tools do not read log timestamps, so "
                       "check the times on the lines.", "没有按时间范围（{range}）筛选：离线工具不解析日志时间戳，请看每行的时间。"),
})
#: notes said after the answer: what a message asked that was not answered or not done
NOTES_AFTER = {
    "part_not_answered": ("Not answered: \"{part}\" (the offline assistant did not understand that part).",
                          "未回答：“{part}”（离线助手无法理解这一部分）。"),
    "part_refused": ("Not done: \"{part}\": the offline assistant's tools are read-only.",
                     "未执行：“{part}”：离线助手的工具都是只读的。"),
    "part_not_explained": ("Not answered: \"{part}\": the offline assistant shows and checks, it cannot explain or "
                           "analyze; a configured language model can ([llm] in the server config).",
                           "未回答：“{part}”：离线助手只能查看和检查，不能解释或分析；配置大语言模型（服务器配置 [llm]）后可以。"),
}
#: a PID asked for ("what is process 1"): said before the listing, whether it is in it (``_pid_note``)
_PID_LINE = r"^\d+\. .*\(pid {pid}, .*$"
#: a size in a binary unit, as the tools write it ("20.9 GiB"): given in a decimal unit too when asked
_BINARY_SIZE = re.compile(r"\b(\d+(?:\.\d+)?) (KiB|MiB|GiB|TiB|PiB)\b")
_POWERS = {"KiB": 1, "MiB": 2, "GiB": 3, "TiB": 4, "PiB": 5}
_DECIMAL = {"mb": ("MB", 2), "megabyte": ("MB", 2), "megabytes": ("MB", 2), "gb": ("GB", 3), "gigabyte": ("GB", 3),
            "gigabytes": ("GB", 3), "tb": ("TB", 4), "terabyte": ("TB", 4), "terabytes": ("TB", 4)}


def _in_decimal(answer: str, unit: str) -> str:
    """``answer`` with each binary size followed by its value in the decimal ``unit`` asked ("20.9 GiB (22.4 GB)")."""
    name, power = _DECIMAL.get(unit.lower(), ("GB", 3))

    def add(m: re.Match[str]) -> str:
        value = float(m.group(1)) * 1024 ** _POWERS[m.group(2)] / 1000 ** power
        return f"{m.group(0)} ({value:.1f} {name})"
    return _BINARY_SIZE.sub(add, answer)


def _pid_note(answer: str, pid: int, zh: bool) -> str:
    """Whether the listing holds the PID asked: the tool looks up no single PID."""
    line = re.search(_PID_LINE.format(pid=pid), answer, re.MULTILINE)
    if line:
        return _j(zh, f"PID {pid} is in the list: {line.group(0)}", f"PID {pid} 在列表中：{line.group(0)}")
    return _j(zh, f"PID {pid} is not among the processes listed: the processes tool cannot look up one PID, it lists the "
                  "top processes by CPU or memory (optionally by name); ask for processes named like it instead.",
              f"PID {pid} 不在上面的列表中：进程工具不能按 PID 查询单个进程，只能按 CPU 或内存列出占用最多的进程（可按名称筛选）；"
              "可以改为按进程名查询。")


def with_notes(answer: str, found: list[Any], zh: bool) -> str:
    """``answer`` with the notes of the intents ``found`` (``NOTES`` and a PID asked, each on its own line
    before it; ``NOTES_AFTER``, after it). Decimal units asked convert the sizes of the answer."""
    before: list[str] = []
    after: list[str] = []
    services = [str(v.get("service")) for i in found for k, v in i.notes if k == "service_not_checked"]
    for i in found:
        keyed = [(i.note, {})] if i.note else []
        for key, values in keyed + list(i.notes):
            if key == "service_not_checked":    # said once for every service asked ("is nginx up and postgres down?")
                values = {"service": "', '".join(dict.fromkeys(services)), "service_zh": "”“".join(dict.fromkeys(services))}
            if key in NOTES:
                before.append(_j(zh, *NOTES[key]).format(**values))
            elif key in NOTES_AFTER:
                after.append(_j(zh, *NOTES_AFTER[key]).format(**values))
            elif key == "pid_asked":            # (first: the answer to the question asked)
                before.append(_pid_note(answer, int(values["pid"]), zh))
            if key == "decimal_units":
                answer = _in_decimal(answer, str(values.get("unit", "GB")))
    if not before and not after:
        return answer
    return "\n".join([*dict.fromkeys(before), answer, *dict.fromkeys(after)])


def unsupported_option(option: str, zh: bool) -> str:
    """The reply to a grep option search_files cannot honour ("grep -v INFO app.log"): never searched as text."""
    en, cn = file_intents.unsupported_option(option)
    return _j(zh, f"grep option {option}{f' ({en})' if en else ''} is not supported: the file search finds the lines "
                  "that match a text or a regular expression, with -i (ignore case), -w (whole words), -E (regex), "
                  "-c (how many lines match) and -n (line numbers are always shown).",
              f"不支持 grep 选项 {option}{f'（{cn}）' if cn else ''}：文件搜索只能找出匹配文字或正则表达式的行，支持 -i（忽略大小写）、"
              "-w（整词）、-E（正则）、-c（匹配行数）和 -n（总是显示行号）。")


def which_file(pattern: str, zh: bool) -> str:
    """The reply to a search in a file named by a pronoun ("grep ERROR in it") with no earlier file known."""
    return _j(zh, f"Which file should I search for '{pattern}'? Give its path, e.g. \"grep {pattern} in app/app.log\".",
              f"要在哪个文件中搜索“{pattern}”？请给出它的路径，例如“在 app/app.log 中搜索 {pattern}”。")


def without_tool(found: list[Any], zh: bool, roots: tuple[list[str], list[str]] | None = None) -> str:
    """The reply to recognized intents that call no tool: a refusal to act, a log asked for by no path, a
    grep option not supported, a file named by a pronoun, else the help text (``roots``: see ``help_text``)."""
    names = {i.name for i in found}
    if "refuse" in names:
        return refusal(zh)
    if "log_path" in names:
        return log_path_needed(zh)
    if "forget" in names:
        part = next(str(i.arguments.get("part", "")) for i in found if i.name == "forget")
        return forget_apart(part, zh)
    for i in found:
        if i.name == "unsupported":
            return unsupported_option(str(i.arguments.get("option", "")), zh)
        if i.name == "which_file":
            return which_file(str(i.arguments.get("pattern", "")), zh)
    return help_text(zh, roots)


def tool_results(rendered: list[str], found: list[Any], zh: bool,
                 roots: tuple[list[str], list[str]] | None = None) -> str:
    """The answer to a message of several requests: the tool results ``rendered``, then the reply to each
    request of ``found`` that calls no tool ("show disk usage and tail the error log": "Which log file?";
    "show memory and grep -v INFO app.log": the -v refused), then the notes (``with_notes``). No request is
    dropped silently."""
    canned = [without_tool([i], zh, roots) for i in found if not i.tool and i.name in WITHOUT_TOOL_AFTER]
    return with_notes("\n\n".join([*rendered, *dict.fromkeys(canned)]), [i for i in found if i.tool], zh)


#: the requests without a tool answered after the tool results of the same message (``tool_results``): a
#: help or "who are you" clause gets the help text, a clause asking to forget is not done (``forget_apart``);
#: a clause to remember is answered by ``offline`` (``noted``)
WITHOUT_TOOL_AFTER = ("refuse", "log_path", "unsupported", "which_file", "help", "forget")


def forget_apart(part: str, zh: bool) -> str:
    """The reply to a request to forget sent with other requests ("show memory and forget everything"): the
    user memory takes back only what a message asks alone, so nothing was forgotten, and how to do it."""
    return _j(zh, f"Not done: \"{part}\": nothing was forgotten; send the request to forget as a message of its own. "
                  + WHERE_MEMORY_EN,
              f"未执行：“{part}”：没有忘记任何内容；请把要忘记的内容单独发一条消息。" + WHERE_MEMORY_ZH)


def courtesy(zh: bool) -> str:
    """The reply to thanks or an acknowledgement ("thanks", "got it", "谢谢", "好的")."""
    return "不客气。还有什么需要帮忙的吗？" if zh else "You're welcome. Anything else?"


def memory_off(zh: bool) -> str:
    return _j(zh, "Long-term memory is turned off on this server.", "这台服务器关闭了长期记忆。")


#: a request to forget that takes many items ("Forget everything") lists this many of them
MAX_FORGOTTEN_LISTED = 20
WHERE_MEMORY_EN = ("To see what I remember: the memory list (F7 in the TUI, or `nplt-client memory list`); "
                   "to delete one item: `nplt-client memory forget ID`.")
WHERE_MEMORY_ZH = "查看我记住的内容：记忆列表（TUI 中按 F7，或 `nplt-client memory list`）；删除其中一条：`nplt-client memory forget ID`。"


def noted(items: list[tuple[str, str]], zh: bool, kept: bool = True,
          forgotten: list[tuple[str, list[str]]] | None = None) -> str:
    """The reply to a message that only states facts or preferences or takes something back
    (``knowledge_route.statement_items``: (kind, text)): what was understood, as the user memory keeps
    it, so the user can check it; ``kept`` False (long-term memory turned off): that it stays in this
    conversation only. A value said to hold no longer ("no longer", "<subject> is <value>") is noted
    as such. What the user asks to forget ("forget", what): ``forgotten`` (``memory_answers.forgotten``:
    each request with the texts of the items it removes) says what was forgotten, the items as the memory
    list shows them, and which requests matched nothing remembered (with where to see and delete the
    items); with long-term memory off and nothing else in the message, that nothing was kept. A take-back
    naming a secret is not repeated (a secret is never kept anyway)."""
    said = [no_longer(text, zh) if kind == "no longer" else text for kind, text in items if kind != "forget"]
    asked = [text for kind, text in items if kind == "forget"]
    parts = []
    if said:
        if not kept:
            head = _j(zh, "Long-term memory is turned off on this server, so this stays in this conversation only:",
                      "这台服务器关闭了长期记忆，以下内容只保留在本次对话中：")
        else:
            head = NOTED_HEADS[1] if zh else NOTED_HEADS[0]
        parts.append("\n".join([head, *(f"- {item}" for item in said)]))
        if any(_LANGUAGE_ASKED.search(item) and _asks_other_language(item, zh) for item in said):
            parts[-1] += _j(zh, "\n(The offline assistant answers in the language of the question; a configured "
                                "language model follows this preference.)",
                            "\n（离线助手按提问的语言回答；配置大语言模型后会按这个偏好回答。）")
    if asked and not kept and not said:
        parts.append(_j(zh, "Long-term memory is turned off on this server; nothing was kept.",
                        "这台服务器关闭了长期记忆，没有保存任何内容。"))
    elif asked and (not kept or forgotten is None):
        head = _j(zh, "OK, I won't remember that:", "好的，不再记住：")
        parts.append("\n".join([head, *(f"- {_unless_secret(what, zh)}" for what in asked)]))
    elif asked:
        parts.append(_forgotten(forgotten or [], zh))
    return "\n\n".join(parts)


#: a preference about the language of the answers ("以后用英文回答", "always answer in Chinese"): the offline
#: agent cannot follow it (it answers in the language of each question), and the acknowledgement says so
_LANGUAGE_ASKED = re.compile(r"(?:英文|英语|中文|汉语|普通话|\b(?:english|chinese|mandarin)\b).*(?:回答|回复|答复|作答|\b(?:answers?|"
                             r"repl(?:y|ies)|respon(?:d|ses?))\b)|(?:回答|回复|答复|\b(?:answer|reply|respond)\b).*"
                             r"(?:英文|英语|中文|汉语|\b(?:english|chinese)\b)", re.IGNORECASE)


def _asks_other_language(item: str, zh: bool) -> bool:
    """Whether a language preference asks for a language other than the question's ("以后用英文回答" asked in
    Chinese): the offline agent answers each question in its own language, so it cannot follow it."""
    english = re.search(r"英文|英语|\benglish\b", item, re.IGNORECASE) is not None
    chinese = re.search(r"中文|汉语|普通话|\b(?:chinese|mandarin)\b", item, re.IGNORECASE) is not None
    return english if zh else chinese


def _forgotten(forgotten: list[tuple[str, list[str]]], zh: bool) -> str:
    """What requests to forget removed (``noted``), and which of them matched nothing."""
    gone = [text for _, texts in forgotten for text in texts]
    missed = [_unless_secret(what, zh) for what, texts in forgotten if not texts]
    parts = []
    if gone:
        lines = [_j(zh, "OK, I've forgotten:", "好的，已忘记：")]
        lines += [f"- {text}" for text in gone[:MAX_FORGOTTEN_LISTED]]
        if len(gone) > MAX_FORGOTTEN_LISTED:
            more = len(gone) - MAX_FORGOTTEN_LISTED
            lines.append(_j(zh, f"- ... and {more} more", f"- ……另有 {more} 条"))
        parts.append("\n".join(lines))
    if missed:
        head = _j(zh, "I don't remember anything that matches this, so nothing was forgotten:",
                  "我没有记住与此相符的内容，没有忘记任何信息：")
        parts.append("\n".join([head, *(f"- {what}" for what in missed), _j(zh, WHERE_MEMORY_EN, WHERE_MEMORY_ZH)]))
    return "\n\n".join(parts)


def no_longer(said: str, zh: bool) -> str:
    """A value said to hold no longer (``distill.takes_back``'s "<subject> is <value>", of Chinese
    "<subject>是/在<value>"): "The prod DB host is no longer db-prod-41", "生产数据库在杭州（已不再成立）"."""
    said = _unless_secret(said, zh)
    subject, is_, value = said.partition(" is ")       # (an English subject never holds " is ")
    if is_:
        return f"{subject} is no longer {value}"
    return f"{said}（已不再成立）" if zh else f"{said} (no longer so)"


def _unless_secret(text: str, zh: bool) -> str:
    """``text``, or a note in its place when it names or holds a secret (never repeated in an answer)."""
    if mentions_secret(text):
        return _j(zh, "(something secret: secrets are never kept)", "（涉及机密的内容：机密从不保存）")
    return text


def _j(zh: bool, en: str, cn: str) -> str:
    return cn if zh else en


def _cpu(d: dict[str, Any], zh: bool) -> str:
    cores = "、".join(f"{c}%" for c in d["per_core"]) if zh else ", ".join(f"{c}%" for c in d["per_core"])
    if zh:
        return (f"CPU 使用率：{d['percent']}%（采样 {d['sample_s']:g} 秒，{d['cores_logical']} 个逻辑核心；"
                f"各核心：{cores}）。")
    return (f"CPU usage: {d['percent']}% (sampled over {d['sample_s']:g} s, {d['cores_logical']} logical cores; "
            f"per core: {cores}).")


def _memory(d: dict[str, Any], zh: bool) -> str:
    sw = d["swap"]
    high = float(d["percent"]) >= MEMORY_HIGH_PERCENT
    swapping = sw["total"] != "0 B" and float(sw["percent"]) >= SWAP_HIGH_PERCENT
    if zh:
        swap = f"交换分区：已用 {sw['used']} / 共 {sw['total']}（{sw['percent']}%）。" if sw["total"] != "0 B" else "未启用交换分区。"
        verdict = (f"内存偏高：已用 {d['percent']}%（不低于 {MEMORY_HIGH_PERCENT}%）。" if high else
                   f"内存正常：已用 {d['percent']}%（低于 {MEMORY_HIGH_PERCENT}%）。")
        if swapping:
            verdict += f"交换分区已用 {sw['percent']}%（不低于 {SWAP_HIGH_PERCENT}%）。"
        return f"内存：已用 {d['used']} / 共 {d['total']}（{d['percent']}%），可用 {d['available']}。{swap}{verdict}"
    swap = f"Swap: {sw['used']} used of {sw['total']} ({sw['percent']}%)." if sw["total"] != "0 B" else "No swap configured."
    verdict = (f"High: {d['percent']}% used ({MEMORY_HIGH_PERCENT}% or more)." if high else
               f"Normal: {d['percent']}% used (under {MEMORY_HIGH_PERCENT}%).")
    if swapping:
        verdict += f" Swap is {sw['percent']}% used ({SWAP_HIGH_PERCENT}% or more)."
    return f"Memory: {d['used']} used of {d['total']} ({d['percent']}%), {d['available']} available. {swap} {verdict}"


#: memory this used (percent of RAM) is "high" in the memory answer's verdict, else "normal"
MEMORY_HIGH_PERCENT = 90
#: swap this used (percent) is named in the memory answer's verdict
SWAP_HIGH_PERCENT = 50
#: a filesystem this full (percent used) is "nearly full" in the disk answer and its verdict
DISK_FULL_PERCENT = 90
#: a 1-minute load average above this per logical core is "high" in the load answer's verdict
LOAD_HIGH_PER_CORE = 1.0


def _disk(d: dict[str, Any], zh: bool) -> str:
    fss = d["filesystems"]
    if not fss:
        return _j(zh, "No mounted filesystems were found.", "没有找到已挂载的文件系统。")
    full = [fs for fs in fss if fs["percent"] >= DISK_FULL_PERCENT]
    fullest = max(fss, key=lambda fs: fs["percent"])
    if full:
        names = _j(zh, ", ", "、").join(f"{fs['mount']} ({fs['percent']}%)" if not zh else f"{fs['mount']}（{fs['percent']}%）"
                                       for fs in full)
        verdict = _j(zh, f"Nearly full: {names}.", f"快满了：{names}。")
    else:
        verdict = _j(zh, f"No filesystem is nearly full (the fullest, {fullest['mount']}, is at {fullest['percent']}%).",
                     f"没有快满的文件系统（最满的 {fullest['mount']} 已用 {fullest['percent']}%）。")
    lines = [_j(zh, "Disk usage:", "磁盘使用情况：")]
    for fs in fss:
        warn = _j(zh, " ⚠ nearly full", " ⚠ 接近满") if fs["percent"] >= DISK_FULL_PERCENT else ""
        lines.append(_j(zh, f"- {fs['mount']} ({fs['fstype']}, {fs['device']}): {fs['used']} used of {fs['total']} "
                            f"({fs['percent']}%), {fs['free']} free{warn}",
                        f"- {fs['mount']}（{fs['fstype']}，{fs['device']}）：已用 {fs['used']} / 共 {fs['total']}"
                        f"（{fs['percent']}%），剩余 {fs['free']}{warn}"))
    lines.append(verdict)
    return "\n".join(lines)


def _network(d: dict[str, Any], zh: bool) -> str:
    io = d["io"]
    lines = [_j(zh, f"Network since boot: sent {io['sent']}, received {io['received']} "
                    f"(errors in/out {io['errors_in']}/{io['errors_out']}, drops in/out {io['drops_in']}/{io['drops_out']}).",
                f"开机以来网络流量：发送 {io['sent']}，接收 {io['received']}"
                f"（入站/出站错误 {io['errors_in']}/{io['errors_out']}，丢包 {io['drops_in']}/{io['drops_out']}）。")]
    lines.append(_j(zh, "Interfaces:", "网络接口："))
    for nic in d["interfaces"]:
        addrs = ", ".join(a["address"] for a in nic["addresses"]) or _j(zh, "no address", "无地址")
        state = _j(zh, "up" if nic["up"] else "down", "启用" if nic["up"] else "未启用")
        traffic = _j(zh, f"; sent {nic['sent']}, received {nic['received']}", f"；发送 {nic['sent']}，接收 {nic['received']}") \
            if "sent" in nic else ""
        lines.append(_j(zh, f"- {nic['name']} ({state}): {addrs}{traffic}", f"- {nic['name']}（{state}）：{addrs}{traffic}"))
    return "\n".join(lines)


def _load(d: dict[str, Any], zh: bool) -> str:
    per_core = round(float(d["load_1m"]) / max(int(d["cores_logical"] or 1), 1), 2)
    high = per_core > LOAD_HIGH_PER_CORE
    verdict = _j(zh, f" {'High' if high else 'Normal'}: {per_core} per core (1 min).",
                 f"{'偏高' if high else '正常'}：每核 {per_core}（1 分钟）。")
    return _j(zh, f"Load average: {d['load_1m']} (1 min), {d['load_5m']} (5 min), {d['load_15m']} (15 min) "
                  f"on {d['cores_logical']} logical cores.",
              f"系统负载：{d['load_1m']}（1 分钟）、{d['load_5m']}（5 分钟）、{d['load_15m']}（15 分钟），"
              f"共 {d['cores_logical']} 个逻辑核心。") + verdict


def duration_zh(seconds: float) -> str:
    """93784 -> '1 天 2 小时 3 分钟'; under a minute -> '42 秒'."""
    return fmt_duration(seconds, (" 天", " 小时", " 分钟", " 秒"))


def _uptime(d: dict[str, Any], zh: bool) -> str:
    return _j(zh, f"Uptime: {d['uptime']} (booted {when(d['boot_time'])}).",
              f"已运行 {duration_zh(d['uptime_s'])}（开机时间 {when(d['boot_time'])}）。")


_METRICS: dict[str, Callable[[dict[str, Any], bool], str]] = {
    "cpu": _cpu, "memory": _memory, "disk": _disk, "network": _network, "load": _load, "uptime": _uptime}


def _sys_monitor(d: dict[str, Any], zh: bool) -> str:
    if d["metric"] != "all":
        return _METRICS[d["metric"]](d[d["metric"]], zh)
    parts = [_cpu(d["cpu"], zh), _load(d["load"], zh), _memory(d["memory"], zh), _disk(d["disk"], zh),
             _uptime(d["uptime"], zh)]
    head = _j(zh, "System overview:", "系统概况：")
    return head + "\n" + "\n".join(parts)


def _processes(d: dict[str, Any], zh: bool) -> str:
    procs = d["processes"]
    by = _j(zh, "CPU" if d["sort_by"] == "cpu" else "memory", "CPU" if d["sort_by"] == "cpu" else "内存")
    flt = d.get("name_filter")
    if not procs:
        return _j(zh, f"No running process matches '{flt}'." if flt else "No processes could be read.",
                  f"没有名称包含“{flt}”的进程。" if flt else "无法读取进程信息。")
    counted = f"共 {d['total_processes']} 个，匹配 {d['matched']} 个" if flt else f"共 {d['total_processes']} 个"
    gone = d["total_processes"] - d["matched"]
    if flt:
        of = f"{d['matched']} matched of {d['total_processes']}"
    else:                 # (no filter: the processes not counted ended or could not be read while sampled)
        of = f"{d['matched']} of {d['total_processes']}; {gone} vanished or unreadable" if gone else \
            f"{d['total_processes']} in all"
    head = _j(zh, f"Top {len(procs)} processes by {by} ({of}):",
              f"按{' CPU ' if d['sort_by'] == 'cpu' else by}排序的前 {len(procs)} 个进程（{counted}）：")
    lines = [head]
    for i, p in enumerate(procs, 1):
        user = p["user"] or "?"
        lines.append(_j(zh, f"{i}. {p['name']} (pid {p['pid']}, {user}): CPU {p['cpu_percent']}%, "
                            f"RSS {p['rss']} ({p['memory_percent']}%)",
                        f"{i}. {p['name']}（pid {p['pid']}，用户 {user}）：CPU {p['cpu_percent']}%，"
                        f"内存 {p['rss']}（{p['memory_percent']}%）"))
    return "\n".join(lines)


def _network_check(d: dict[str, Any], zh: bool) -> str:
    target = f"{d['host']}:{d['port']}"
    if d["reachable"]:
        return _j(zh, f"{target} is reachable: TCP connect to {d['address']} succeeded in {d['latency_ms']} ms.",
                  f"{target} 可以连通：TCP 连接 {d['address']} 成功，耗时 {d['latency_ms']} 毫秒。")
    if not zh:
        tried = "; ".join(f"{a['address']}: {a['result']}" for a in d["attempts"])
        return f"{target} is not reachable ({tried})."
    tried = "；".join(f"{a['address']}：{os_error_zh(a['result'])}" for a in d["attempts"])
    return f"{target} 无法连通（{tried}）。"


def _read_log(d: dict[str, Any], zh: bool) -> str:
    head = _j(zh, f"Last {d['lines_returned']} lines of {d['path']} ({d['size']}, modified {when(d['modified'])}):",
              f"{d['path']} 的最后 {d['lines_returned']} 行（大小 {d['size']}，修改于 {when(d['modified'])}）：")
    if not d["text"]:
        return head + _j(zh, " the file is empty.", "文件为空。")
    return f"{head}\n```\n{d['text']}\n```"


_ROLES_ZH = {"user": "你", "assistant": "助手", "system": "系统", "tool": "工具"}   # who said a history hit


def _history_line(h: dict[str, Any], zh: bool) -> str:
    title = h.get("title") or h.get("session_id", "")
    role = h.get("role", "")
    said = [f"[{title}]", _ROLES_ZH.get(role, role) if zh else role,
            when(h.get("timestamp") or h.get("time"))]                # storage / memory hits
    text = h.get("snippet") or h.get("content") or h.get("text") or ""
    return "- " + " ".join(p for p in said if p) + _j(zh, ": ", "：") + text


def _about(match: QueryMatch, q: str, h: dict[str, Any]) -> bool:
    """Whether a hit's own text (not the turns around it) is about ``q``: one of its words, the query
    itself (a storage search matches substrings), or the day a relative time in it names."""
    text = h.get("snippet") or h.get("content") or h.get("text") or ""
    return q.strip().casefold() in text.casefold() or match.text_matches(text, h.get("timestamp") or h.get("time"))


def _hit_time(h: dict[str, Any]) -> str:
    return str(h.get("timestamp") or h.get("time") or "")


def _history_days(d: dict[str, Any], topic: str, days: str, zh: bool) -> str:
    """A history question about days ("昨天我问过 redis 的什么问题", "三天前问过什么") or the recent turns
    (``intents.RECENT_QUERY``): the hits of those days only (the search also finds the topic on other
    days), newest first; when none falls on them, that is said, and the topic's hits of other days follow."""
    now = datetime.now(timezone.utc)
    on_days = QueryMatch(days, now)            # (no words given: only the day counts)
    recent = d["query"] == intents.RECENT_QUERY
    said = _j(zh, "in the last 7 days" if recent else days, "最近 7 天" if recent else days)
    newest = sorted(d["hits"], key=_hit_time, reverse=True)
    dated = [h for h in newest if on_days.matches((), _hit_time(h) or None)]
    if not topic:
        if not dated:
            return _j(zh, f"I found no earlier messages {said}.", f"{said}没有找到之前的对话。")
        head = _j(zh, f"Your earlier messages {said} ({len(dated)}, newest first):",
                  f"{said}的对话（{len(dated)} 条，最新的在前）：")
        return "\n".join([head, *(_history_line(h, zh) for h in dated)])
    match = QueryMatch(topic, now)
    about = [h for h in dated if _about(match, topic, h)]
    if about:
        head = _j(zh, f"Found {len(about)} message(s) about '{topic}' {said}:",
                  f"{said}找到 {len(about)} 条与“{topic}”相关的历史消息：")
        return "\n".join([head, *(_history_line(h, zh) for h in about)])
    lines = [_j(zh, f"Nothing about '{topic}' {said} in your earlier conversations.",
                f"{said}的对话中没有找到与“{topic}”相关的内容。")]
    other = [h for h in newest if h not in dated and _about(match, topic, h)]
    if other:
        lines.append(_j(zh, f"Other days' messages about '{topic}':", f"其他日期提到“{topic}”的消息："))
        lines += [_history_line(h, zh) for h in other]
    return "\n".join(lines)


def _history(d: dict[str, Any], zh: bool) -> str:
    """The hits whose own text is about the query are "about" it; the others (found by the words of
    the turns around them) are listed apart, as related messages. A query naming days ("redis 昨天")
    keeps to those days (``_history_days``)."""
    hits, q = d["hits"], d["query"]
    topic, days = intents.split_days(q) if q != intents.RECENT_QUERY else ("", q)
    if days:
        return _history_days(d, topic, days, zh)
    if not hits:
        return _j(zh, f"I found nothing about '{q}' in your earlier conversations.",
                  f"在你之前的对话中没有找到与“{q}”相关的内容。")
    match = QueryMatch(q, datetime.now(timezone.utc))
    about = [h for h in hits if _about(match, q, h)]
    related = [h for h in hits if not any(h is a for a in about)]
    lines = []
    if about:
        lines.append(_j(zh, f"Found {len(about)} earlier message(s) about '{q}':",
                        f"找到 {len(about)} 条与“{q}”相关的历史消息："))
        lines += [_history_line(h, zh) for h in about]
    if related:
        lines.append(_j(zh, f"Related earlier message(s) from around them, not naming '{q}' themselves:"
                        if about else f"No earlier message names '{q}'; {len(related)} related earlier message(s):",
                        f"附近的相关消息（本身未提到“{q}”）：" if about else
                        f"没有历史消息直接提到“{q}”；{len(related)} 条相关的历史消息："))
        lines += [_history_line(h, zh) for h in related]
    return "\n".join(lines)


_WEEKDAYS_ZH = {"Monday": "星期一", "Tuesday": "星期二", "Wednesday": "星期三", "Thursday": "星期四",
                "Friday": "星期五", "Saturday": "星期六", "Sunday": "星期日"}


def _clock(d: dict[str, Any], zh: bool) -> str:
    local = d["local"].replace("T", " ")[:19]
    utc = d["utc"][11:19]
    weekday = _WEEKDAYS_ZH.get(d["weekday"], d["weekday"])
    if zh and d["utc_offset"] == "+00:00":          # the zone is UTC (or at UTC's offset): UTC said once
        return f"现在是 {local} UTC（{weekday}）。"
    return _j(zh, f"It is {local} ({d['timezone']}, UTC{d['utc_offset']}), {d['weekday']}; UTC time {utc}.",
              f"现在是 {local}（{d['timezone']}，UTC{d['utc_offset']}，{weekday}），UTC 时间 {utc}。")


def _user_memory(d: dict[str, Any], zh: bool) -> str:
    if not d["enabled"]:
        return memory_off(zh)
    items = d["items"]
    if not items:
        return _j(zh, "I don't remember anything about you yet. Tell me facts or preferences "
                      "(\"remember that ...\") and I will.",
                  "我还没有记住关于你的任何信息。告诉我事实或偏好（“记住……”），我就会记下。")
    head = _j(zh, f"I remember {d['count']} thing(s) about you (newest first):",
              f"我记得关于你的 {d['count']} 条信息（最新的在前）：")
    kinds = {"fact": _j(zh, "fact", "事实"), "preference": _j(zh, "preference", "偏好")}
    lines = []
    for i in items:
        kind, made = kinds.get(i["kind"], i["kind"]), when(i["created_at"])
        lines.append(_j(zh, f"- {i['text']} ({kind}; session {i['session_id']}, {made})",
                        f"- {i['text']}（{kind}；会话 {i['session_id']}，{made}）"))
    return "\n".join([head, *lines])


_WHAT_ZH = {"log directories": "日志目录", "file directories": "文件目录"}
#: the OS's error texts the tools pass on (lower case: ``netcheck._describe``, a DNS failure's strerror, ...)
_OS_ERRORS_ZH = {"connection refused": "连接被拒绝", "timed out": "连接超时", "connection timed out": "连接超时",
                 "no route to host": "没有到该主机的路由", "network is unreachable": "网络不可达",
                 "host is unreachable": "主机不可达", "host is down": "主机已关闭",
                 "connection reset by peer": "连接被对方重置",
                 "name or service not known": "域名无法解析",
                 "nodename nor servname provided, or not known": "域名无法解析",        # (macOS)
                 "no address associated with hostname": "该域名没有地址",
                 "temporary failure in name resolution": "域名解析暂时失败",
                 "non-recoverable failure in name resolution": "域名解析失败"}
_MISSING_ZH = {"no such file or directory": "找不到文件或目录", "no such file": "找不到文件",
               "no such log file": "找不到日志文件"}


def _what(m: re.Match[str]) -> str:
    return _WHAT_ZH.get(m["what"], m["what"])


def os_error_zh(text: str) -> str:
    """An OS error text (a connect attempt's result, a DNS failure) in Chinese; one not known is quoted."""
    return _OS_ERRORS_ZH.get(text.strip().lower(), f"原始错误信息：{text}")


#: the tools' error messages (server/tools: paths.py, netcheck.py, registry.py, ...) said in Chinese
_ERRORS_ZH: list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]] = [(re.compile(p, re.S), f) for p, f in [
    (r"path '(?P<p>.*)' is outside the allowed (?P<what>.+)",
     lambda m: f"路径“{m['p']}”不在允许的{_what(m)}内"),
    (r"path '(?P<p>.*)' resolves outside the allowed (?P<what>.+)",
     lambda m: f"路径“{m['p']}”实际指向允许的{_what(m)}之外"),
    (r"(?P<kind>no such (?:file or directory|file|log file)): '(?P<p>.*)' \(looked for under (?P<roots>.*)\)",
     lambda m: f"{_MISSING_ZH[m['kind']]}：“{m['p']}”（查找了：{m['roots']}）"),     # (a miss naming the roots searched)
    (r"(?P<kind>no such (?:file or directory|file|log file)): '(?P<p>.*)'",
     lambda m: f"{_MISSING_ZH[m['kind']]}：“{m['p']}”"),
    (r"'(?P<p>.*)' is ambiguous: it is found as (?P<where>.*); give the full path",
     lambda m: f"“{m['p']}”有多个同名的文件或目录：{m['where']}；请给出完整路径"),
    (r"(?P<tool>\w+) is disabled: no (?P<what>.+?) are configured on the server \((?P<key>[\w.]+)\)",
     lambda m: f"{m['tool']} 未启用：服务器没有配置{_what(m)}（{m['key']}）"),
    (r"permission denied (?P<verb>reading|listing) '(?P<p>.*)'",
     lambda m: f"没有权限{'读取' if m['verb'] == 'reading' else '列出'}“{m['p']}”"),
    (r"path '(?P<p>.*)' is refused: it is part of the server's own data \((?P<what>.*)\), which the tools never read",
     lambda m: f"路径“{m['p']}”被拒绝：它属于服务器自己的数据（{m['what']}），工具从不读取"),
    (r"'(?P<p>.*)' is refused: (?:files named like '.*'|'.*' directories) may hold secrets and are never read",
     lambda m: f"“{m['p']}”被拒绝：这类文件或目录可能含有密钥，从不读取"),
    (r"path '(?P<p>.*)' (?:is|resolves) under (?P<pseudo>\S+), a pseudo filesystem that is never readable",
     lambda m: f"路径“{m['p']}”位于伪文件系统 {m['pseudo']} 下，从不读取"),
    (r"(?:path )?'(?P<p>.*)' must not contain '\.\.' components", lambda m: f"路径“{m['p']}”不能包含“..”"),
    (r"'(?P<p>.*)' is (?:a directory|a symbolic link|not a regular file); .*",
     lambda m: f"“{m['p']}”不是普通文件"),
    (r"'(?P<p>.*)' is not a directory; .*", lambda m: f"“{m['p']}”不是目录"),
    (r"'(?P<p>.*)' has (?P<n>\d+) hard links and is refused.*",
     lambda m: f"“{m['p']}”有 {m['n']} 个硬链接，已拒绝：硬链接可能暴露允许目录之外的文件"),
    (r"'(?P<p>.*)' is a binary file.*", lambda m: f"“{m['p']}”是二进制文件，只能读取文本文件"),
    (r"host '(?P<h>.*)' is not allowed: .*",
     lambda m: f"不允许连接主机“{m['h']}”：network_check 只能连接服务器 tools.allowed_hosts 中列出的主机（默认仅本机）"),
    (r"host '(?P<h>.*)' resolves to (?P<a>.*), which is not allowed .*",
     lambda m: f"主机“{m['h']}”解析到 {m['a']}，不在允许范围内（每个地址都必须列在 tools.allowed_hosts 中）"),
    (r"'(?P<h>.*)' resolved to no address", lambda m: f"“{m['h']}”没有解析到任何地址"),
    (r"DNS resolution of '(?P<h>.*)' timed out after (?P<s>[\d.]+) s", lambda m: f"解析“{m['h']}”超时（{m['s']} 秒）"),
    (r"DNS resolution of '(?P<h>.*)' failed: (?P<e>.*)", lambda m: f"解析“{m['h']}”失败（{os_error_zh(m['e'])}）"),
    (r"tool '(?P<t>.*)' timed out after (?P<s>[\d.]+) s", lambda m: f"{m['s']} 秒内没有完成"),
    (r"history search is unavailable on this server", lambda m: "这台服务器不提供历史搜索"),
    (r"history search failed \((?P<e>\w+)\)", lambda m: f"历史搜索失败（{m['e']}）"),
    (r"cannot (?P<verb>list|open) '(?P<p>.*)': (?P<e>.*)",
     lambda m: f"无法{'列出' if m['verb'] == 'list' else '打开'}“{m['p']}”（{os_error_zh(m['e'])}）"),
    (r"'(?P<p>.*)' has (?P<n>\d+) lines; offset (?P<o>\d+) is past the end",
     lambda m: f"“{m['p']}”只有 {m['n']} 行，第 {m['o']} 行已超出文件末尾"),
    (r"this server has no knowledge base", lambda m: "这台服务器没有知识库"),
    (r"downloads are unavailable on this server", lambda m: "这台服务器不提供下载"),
]]


def error_zh(err: str) -> str:
    """A tool's (English) error message in Chinese; one not known is given as it is, marked as the original."""
    for pat, say in _ERRORS_ZH:
        m = pat.fullmatch(err)
        if m:
            return say(m)
    return f"原始错误信息：{err}"


RENDERERS: dict[str, Callable[[dict[str, Any], bool], str]] = {
    "sys_monitor": _sys_monitor, "processes": _processes, "network_check": _network_check,
    "read_log": _read_log, "history_search": _history, "clock": _clock, "offer_download": downloads.render,
    "user_memory": _user_memory,
    **file_answers.RENDERERS}


#: what each tool does, said in a failure ("读取文件失败：…。"): the tool's internal name is not shown
_DOING_ZH = {"read_file": "读取文件", "read_log": "读取日志", "list_dir": "列出目录", "search_files": "搜索文件",
             "network_check": "检查端口", "sys_monitor": "读取系统信息", "processes": "读取进程列表",
             "history_search": "搜索历史对话", "clock": "读取时间", "offer_download": "准备下载",
             "user_memory": "读取记忆", "search_knowledge": "搜索知识库"}
_PORT_RANGE = re.compile(r"argument 'port': expected an integer in 1\.\.65535, got (?P<p>-?\d+)")


def _doing_zh(tool: str) -> str:
    return _DOING_ZH.get(tool, f"工具 {tool} ")


def _sentence(text: str) -> str:
    """``text`` ending as a Chinese sentence does (with "。" unless it ends with one already)."""
    return text if text.endswith(("。", "！", "？", "…")) else text + "。"


def _miss_hint(tool: str, err: str, zh: bool) -> str:
    """What to do about a file not found by a relative path: where such a path is looked for."""
    if not re.fullmatch(r"no such (?:file or directory|file|log file): '[^/'][^']*'", err):   # (roots named: no hint)
        return ""
    if tool == "read_log":
        return _j(zh, "\n(A relative path is looked for under each log directory of the server, [tools] log_roots; "
                      "give the log's path, e.g. nginx/error.log, or an absolute one.)",
                  "\n（相对路径在服务器的每个日志目录（[tools] log_roots）下查找；请给出日志文件的路径，例如 nginx/error.log，"
                  "或绝对路径。）")
    if tool in ("search_files", "read_file", "list_dir"):
        return _j(zh, "\n(A relative path is looked for under each file directory of the server, [tools] file_roots, "
                      "not in subdirectories; give the path from there, e.g. logs/app.log, or an absolute one. A log is "
                      "also shown by \"tail <name>\", looked for under [tools] log_roots.)",
                  "\n（相对路径在服务器的每个文件目录（[tools] file_roots）下查找，不查找子目录；请给出从那里开始的路径，"
                  "例如 logs/app.log，或绝对路径。日志文件也可以用“查看 <文件名> 日志”，在 [tools] log_roots 下查找。）")
    return ""


def _disabled_hint(tool: str, err: str, zh: bool) -> str:
    """What still works when the file search is off: a log's last lines ("errors in app.log" and English
    counts are searched with it, so they need ``[tools] file_roots``)."""
    if tool != "search_files" or not re.match(r"\w+ is disabled: ", err):
        return ""
    return _j(zh, "\n(Counting or filtering lines of a log uses the file search, which needs [tools] file_roots; "
                  "\"tail <log>\" shows a log's last lines from [tools] log_roots.)",
              "\n（统计或筛选日志行使用文件搜索，需要服务器配置 [tools] file_roots；“查看 <文件名> 日志”可以显示 [tools] log_roots "
              "下日志的最后几行。）")


def render(call: ToolCall, zh: bool) -> str:
    """One paragraph for one finished tool call."""
    try:
        data = orjson.loads(call.result) if call.result else {}
    except orjson.JSONDecodeError:
        data = {"error": call.result}
    if call.status != "success" or "error" in data:
        err = str(data.get("error", call.status))
        if _PORT_RANGE.fullmatch(err):         # network_check given a port out of range ("检查 localhost:70000 端口")
            return _j(zh, f"The port must be between 1 and 65535 (got {_PORT_RANGE.fullmatch(err)['p']}).",
                      f"端口必须在 1–65535 之间（收到的是 {_PORT_RANGE.fullmatch(err)['p']}）。")
        hint = _miss_hint(call.tool_name, err, zh) or _disabled_hint(call.tool_name, err, zh)
        if call.status == "timeout":
            return _j(zh, f"The {call.tool_name} tool timed out: {err}",
                      _sentence(f"{_doing_zh(call.tool_name)}超时：{error_zh(err)}"))
        return _j(zh, f"The {call.tool_name} tool could not answer: {err}",
                  _sentence(f"{_doing_zh(call.tool_name)}失败：{error_zh(err)}")) + hint
    if data.get("truncated") and "partial" in data:
        return _j(zh, f"The {call.tool_name} result was too large to show.", f"{_doing_zh(call.tool_name)}的结果过大，无法显示。")
    try:
        return RENDERERS[call.tool_name](data, zh)
    except (KeyError, TypeError, ValueError):
        return _j(zh, f"The {call.tool_name} tool returned: {call.result}", f"工具 {call.tool_name} 返回：{call.result}")
