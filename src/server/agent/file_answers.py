"""Offline answers for the file tools (list_dir, read_file, search_files), in English or Chinese.

Everything said comes from the tool's JSON result; file text is quoted in a code block, never obeyed.
A time is said as ``when`` writes it, in every offline answer.
"""
from __future__ import annotations

from typing import Any, Callable

from server.memory.recall import format_time, parse_time


def _j(zh: bool, en: str, cn: str) -> str:
    return cn if zh else en


def when(ts: Any) -> str:
    """A tool's ISO timestamp as ``2026-11-27 10:40 UTC``, the memory block's form (``recall.format_time``):
    an answer is stored text, read later in any time zone. A value that is no timestamp is shown as it is."""
    return format_time(ts) if isinstance(ts, str) and parse_time(ts) else str(ts or "")


#: list_dir's entry types in each language (a file is described by its size)
_KINDS = {"dir": ("dir", "目录"), "symlink": ("symlink", "符号链接"), "other": ("other", "其他类型"),
         "unknown": ("unknown", "无法读取")}


def _list_dir(d: dict[str, Any], zh: bool) -> str:
    entries = d["entries"]
    flt = _j(zh, f" ({d['pattern']})", f"（{d['pattern']}）") if d.get("pattern") else ""
    if not entries:
        return _j(zh, f"{d['path']}{flt} has no entries to show.", f"{d['path']}{flt} 下没有可显示的条目。")
    if d.get("scan_limit"):      # a directory larger than tools.max_dir_scan: only its first entries examined
        head = _j(zh, f"{d['path']}{flt}: at least {d['matched']} entries; only the first {d['scan_limit']} of the "
                      f"directory were examined (in directory order, tools.max_dir_scan), and these "
                      f"{d['returned']} are the first by name among them:",
                  f"{d['path']}{flt} 下至少有 {d['matched']} 项；只检查了按目录顺序的前 {d['scan_limit']} 项"
                  f"（tools.max_dir_scan），以下 {d['returned']} 项是其中按名称排在最前的：")
    else:
        head = _j(zh, f"{d['path']}{flt}: {d['returned']} of {d['matched']} entries:",
                  f"{d['path']}{flt} 下共 {d['matched']} 项，显示 {d['returned']} 项：")
    lines = [head]
    for e in entries:
        en, cn = _KINDS.get(e["type"], (e["type"], e["type"]))
        about = [e.get("size", "") if e["type"] == "file" else _j(zh, en, cn)]
        if "modified" in e:
            about.append(when(e["modified"]))
        name = e["name"] + ("/" if e["type"] == "dir" else "")
        lines.append(_j(zh, f"- {name}  ({', '.join(about)})", f"- {name}（{'，'.join(about)}）"))
    if d.get("hidden"):
        lines.append(_j(zh, f"({d['hidden']} secret-looking entries hidden.)", f"（已隐藏 {d['hidden']} 个疑似含密钥的条目。）"))
    if d["truncated"] and not d.get("scan_limit"):
        lines.append(_j(zh, "(The list is cut; narrow it with a pattern.)", "（列表已截断，可用通配符缩小范围。）"))
    return "\n".join(lines)


def _read_file(d: dict[str, Any], zh: bool) -> str:
    first, n = d["offset"], d["lines_returned"]
    head = _j(zh, f"{d['path']} ({d['size']}, modified {when(d['modified'])}), lines {first}-{first + n - 1}:",
              f"{d['path']}（大小 {d['size']}，修改于 {when(d['modified'])}），第 {first}-{first + n - 1} 行：")
    if not n:
        if first == 1 and (d.get("bytes") == 0 or ("bytes" not in d and d.get("size") == "0 B")):
            return _j(zh, f"{d['path']} is empty.", f"{d['path']} 是空文件。")
        if first == 1:               # (not empty: nothing of it could be shown)
            return _j(zh, f"{d['path']} ({d['size']}, modified {when(d['modified'])}): no complete line within the "
                          "read limit.", f"{d['path']}（大小 {d['size']}，修改于 {when(d['modified'])}）：读取上限内没有完整的行。") \
                + ("\n" + _byte_cap(d, zh) if d.get("read_limit") else "")
        return head + ("\n" + _byte_cap(d, zh) if d.get("read_limit") else "")
    out = f"{head}\n```\n{d['text']}\n```"
    if d.get("cut_line"):
        out += _j(zh, f"\n(Line {d['cut_line']} is longer than the read limit ({d.get('read_limit', '')}, "
                      "tools.max_file_bytes): only its start is shown, cut where the text ends with [… line cut].)",
                  f"\n（第 {d['cut_line']} 行超过读取上限（{d.get('read_limit', '')}，tools.max_file_bytes）："
                  "只显示了它的开头，在 [… line cut] 处截断。）")
    if d.get("next_offset"):
        out += _j(zh, f"\n(More from line {d['next_offset']}.)", f"\n（后续内容从第 {d['next_offset']} 行开始。）")
    if d.get("read_limit"):
        out += "\n" + _byte_cap(d, zh)
    return out


def _byte_cap(d: dict[str, Any], zh: bool) -> str:
    """The tool's note on a file longer than ``tools.max_file_bytes``, in the question's language."""
    return _j(zh, f"(Only the first {d['read_limit']} of the file are read (tools.max_file_bytes); "
                  "search_files or read_log reach the rest.)",
              f"（只读取了文件的前 {d['read_limit']}（tools.max_file_bytes）；其余部分可用 search_files 或 read_log 查看。）")


# why search_files ended early (``stopped``), in each language
STOPPED = {"limit": ("the match limit was reached", "已达到匹配条数上限"),
           "max_search_files": ("tools.max_search_files files searched", "已搜索 tools.max_search_files 个文件"),
           "max_search_bytes": ("tools.max_search_bytes read", "已读取 tools.max_search_bytes 字节"),
           "search_timeout_s": ("tools.search_timeout_s reached", "已达到 tools.search_timeout_s 时限"),
           "max_result_chars": ("the result is as long as tools.max_result_chars allows",
                                "结果已达到 tools.max_result_chars 长度上限")}


def _search_files(d: dict[str, Any], zh: bool) -> str:
    matches = d["matches"]
    if not matches:
        return _j(zh, f"No line matching '{d['pattern']}' in {d['root']} ({d['files_searched']} files searched).",
                  f"在 {d['root']} 中没有找到匹配“{d['pattern']}”的行（搜索了 {d['files_searched']} 个文件）。")
    n = len(matches)                  # a count asked ("access.log 里有几个 502") is this number
    if d.get("stopped") == "limit":   # more lines match than were returned: the count is a lower bound
        head = _j(zh, f"At least {n} lines match '{d['pattern']}' in {d['root']} (the first {n} are shown):",
                  f"在 {d['root']} 中至少有 {n} 行匹配“{d['pattern']}”（显示前 {n} 行）：")
    else:
        head = _j(zh, f"{n} line(s) matching '{d['pattern']}' in {d['root']}:",
                  f"在 {d['root']} 中找到 {n} 行匹配“{d['pattern']}”：")
    body = "\n".join(f"{m['path']}:{m['line']}: {m['text']}" for m in matches)
    out = f"{head}\n```\n{body}\n```"
    if d.get("stopped"):
        en, cn = STOPPED.get(d["stopped"], (d["stopped"], d["stopped"]))
        out += _j(zh, f"\n(Search stopped early: {en}.)", f"\n（搜索提前结束：{cn}。）")
    return out


RENDERERS: dict[str, Callable[[dict[str, Any], bool], str]] = {
    "list_dir": _list_dir, "read_file": _read_file, "search_files": _search_files}
