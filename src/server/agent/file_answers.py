"""Offline answers for the file tools (list_dir, read_file, search_files), in English or Chinese.

Everything said comes from the tool's JSON result; file text is quoted in a code block, never obeyed.
"""
from __future__ import annotations

from typing import Any, Callable


def _j(zh: bool, en: str, cn: str) -> str:
    return cn if zh else en


def _list_dir(d: dict[str, Any], zh: bool) -> str:
    entries = d["entries"]
    flt = f" ({d['pattern']})" if d.get("pattern") else ""
    if not entries:
        return _j(zh, f"{d['path']}{flt} has no entries to show.", f"{d['path']}{flt} 下没有可显示的条目。")
    head = _j(zh, f"{d['path']}{flt}: {d['returned']} of {d['matched']} entries:",
              f"{d['path']}{flt} 下共 {d['matched']} 项，显示 {d['returned']} 项：")
    lines = [head]
    for e in entries:
        kind = {"dir": _j(zh, "dir", "目录"), "file": e.get("size", ""), "symlink": _j(zh, "symlink", "符号链接")}.get(
            e["type"], e["type"])
        name = e["name"] + ("/" if e["type"] == "dir" else "")
        lines.append(f"- {name}  ({kind}, {str(e.get('modified', ''))[:16].replace('T', ' ')})")
    if d.get("hidden"):
        lines.append(_j(zh, f"({d['hidden']} secret-looking entries hidden.)", f"（已隐藏 {d['hidden']} 个疑似含密钥的条目。）"))
    if d["truncated"]:
        lines.append(_j(zh, "(The list is cut; narrow it with a pattern.)", "（列表已截断，可用通配符缩小范围。）"))
    return "\n".join(lines)


def _read_file(d: dict[str, Any], zh: bool) -> str:
    first, n = d["offset"], d["lines_returned"]
    head = _j(zh, f"{d['path']} ({d['size']}, modified {d['modified']}), lines {first}-{first + n - 1}:",
              f"{d['path']}（大小 {d['size']}，修改于 {d['modified']}），第 {first}-{first + n - 1} 行：")
    if not n:
        return _j(zh, f"{d['path']} is empty.", f"{d['path']} 是空文件。") if first == 1 else \
            head + "\n" + d.get("note", "")
    out = f"{head}\n```\n{d['text']}\n```"
    if d.get("next_offset"):
        out += _j(zh, f"\n(More from line {d['next_offset']}.)", f"\n（后续内容从第 {d['next_offset']} 行开始。）")
    if d.get("note"):
        out += "\n" + d["note"]
    return out


def _search_files(d: dict[str, Any], zh: bool) -> str:
    matches = d["matches"]
    if not matches:
        return _j(zh, f"No line matching '{d['pattern']}' in {d['root']} ({d['files_searched']} files searched).",
                  f"在 {d['root']} 中没有找到匹配“{d['pattern']}”的行（搜索了 {d['files_searched']} 个文件）。")
    head = _j(zh, f"{len(matches)} line(s) matching '{d['pattern']}' in {d['root']}:",
              f"在 {d['root']} 中找到 {len(matches)} 行匹配“{d['pattern']}”：")
    body = "\n".join(f"{m['path']}:{m['line']}: {m['text']}" for m in matches)
    out = f"{head}\n```\n{body}\n```"
    if d.get("stopped"):
        out += _j(zh, f"\n(Search stopped early: {d['stopped']}.)", f"\n（搜索提前结束：{d['stopped']}。）")
    return out


RENDERERS: dict[str, Callable[[dict[str, Any], bool], str]] = {
    "list_dir": _list_dir, "read_file": _read_file, "search_files": _search_files}
