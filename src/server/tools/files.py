"""The read-only file browsing tools: ``list_dir`` and ``read_file``, under ``tools.file_roots`` (read_file
and search_files also under ``tools.log_roots``, looked in after the file roots: ``file_policy``).

Paths go through ``server.tools.paths`` (the same checks as read_log). list_dir never follows a
symlink, hides secret-looking names (counted in ``hidden``) and leaves out the server's own data
(``protected``: its history directory, log file, ...) without a word; read_file reads text only (a NUL
byte or invalid UTF-8 in the first block refuses the file as binary), at most ``max_file_bytes``
from the start of the file, and cuts its answer to fit the result budget, saying where to go on
(``next_offset``). Lines are redacted as they are read (``LineRedactor``, from the first line, so a key
block is masked whatever ``offset`` is), and the budget is counted on what is shown. Every function
blocks: the registry runs them in a thread.

Both open the checked path with ``paths.open_under`` (never following a symlink on the way, so a folder
swapped for a link out of the root between the check and the open is refused) and then work on that
descriptor only: list_dir lists ``os.scandir(fd)``, read_file reads with ``pread``. Their results carry
``paths.FILE_NOTE`` (``note``): file text and names are quoted data, never instructions.
"""
from __future__ import annotations

import fnmatch
import heapq
import os
import stat
from datetime import datetime
from typing import Any, Iterable

from server.tools.config import ToolsConfig
from server.tools.paths import (FILE_NOTE, SECRET_DIRS, Guard, PathPolicy, Protected, is_secret_name,
                                open_directory, open_regular)
from server.tools.secrets import LineRedactor
from server.tools.units import ToolFailure, fmt_bytes, to_json

LIST_DIR_SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "minLength": 1, "maxLength": 4096,
                 "description": "Directory, absolute or relative to an allowed root."},
        "pattern": {"type": "string", "minLength": 1, "maxLength": 200,
                    "description": "Only names matching this glob, e.g. '*.log'."},
        "limit": {"type": "integer", "minimum": 1, "maximum": 500, "default": 100,
                  "description": "How many entries at most (sorted by name)."},
    },
    "required": ["path"],
    "additionalProperties": False,
}

READ_FILE_SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "minLength": 1, "maxLength": 4096,
                 "description": "Text file, absolute or relative to an allowed root."},
        "offset": {"type": "integer", "minimum": 1, "maximum": 100_000_000, "default": 1,
                   "description": "First line to return (1 = the first line of the file)."},
        "lines": {"type": "integer", "minimum": 1, "maximum": 500, "default": 200,
                  "description": "How many lines to return."},
    },
    "required": ["path"],
    "additionalProperties": False,
}

BLOCK = 64 * 1024
RESULT_MARGIN = 1024      # room left in max_result_chars for the fields around the text
CUT_MARK = " [… line cut]"   # ends read_file's text when its line is longer than max_file_bytes (``cut_line``)
CUT_REDACT_MARGIN = 4096     # characters past what is shown of a cut line that are redacted with it
_PURPOSE = "read_file reads regular text files only"


# the file tools that also look under (and read in) ``tools.log_roots``, after ``tools.file_roots``: a log
# read_log tails ("tail app.log") is found by its name for a search or a read too ("app.log 里有没有 ERROR")
LOG_ROOT_TOOLS = ("read_file", "search_files")


def file_policy(cfg: ToolsConfig, tool: str, protected: tuple[Protected, ...] = ()) -> PathPolicy:
    """The roots of a file tool: ``tools.file_roots`` (none: the tool is disabled); for ``LOG_ROOT_TOOLS``
    then ``tools.log_roots``, whose files read_log reads already. A relative name is looked for under
    each in order; one found as two different entries is refused as ambiguous, and a miss names the
    roots looked under (``PathPolicy.explain``)."""
    fallback = tuple(cfg.log_roots) if tool in LOG_ROOT_TOOLS else ()
    return PathPolicy(tuple(cfg.file_roots), "file directories", "tools.file_roots", tool, protected,
                      fallback=fallback, explain=tool in LOG_ROOT_TOOLS)


def iso_mtime(ts: float) -> str:
    return datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")


def looks_binary(head: bytes) -> bool:
    """A NUL byte, or bytes that are not UTF-8 (a character cut at the end of the block is fine)."""
    if b"\x00" in head:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start < len(head) - 3
    return False


def _entry(e: os.DirEntry[str]) -> dict[str, Any]:
    """One listed entry (``e`` from ``os.scandir(fd)``: its lstat is taken relative to that fd, still open)."""
    try:
        st = e.stat(follow_symlinks=False)
    except OSError:
        return {"name": e.name, "type": "unknown"}
    if stat.S_ISDIR(st.st_mode):
        kind = "dir"
    elif stat.S_ISREG(st.st_mode):
        kind = "file"
    elif stat.S_ISLNK(st.st_mode):
        kind = "symlink"
    else:
        kind = "other"
    out: dict[str, Any] = {"name": e.name, "type": kind}
    if kind == "file":
        out["size"] = fmt_bytes(st.st_size)
        out["bytes"] = st.st_size
    out["modified"] = iso_mtime(st.st_mtime)
    return out


def list_dir(cfg: ToolsConfig, path: str, pattern: str | None, limit: int,
             protected: tuple[Protected, ...] = ()) -> dict[str, Any]:
    """The ``list_dir`` tool (blocking)."""
    policy = file_policy(cfg, "list_dir", protected)
    real = policy.resolve(path)
    guard = policy.guard()
    fd, _ = open_directory(real, path, "use read_file to read a file")
    try:
        return _list(cfg, fd, real, path, pattern, limit, guard)
    finally:
        os.close(fd)


def _list(cfg: ToolsConfig, fd: int, real: str, path: str, pattern: str | None, limit: int,
          guard: Guard) -> dict[str, Any]:
    """list_dir on the open directory ``fd`` (at ``real``, checked): entries and their lstat by the fd.

    Up to ``max_dir_scan`` entries are examined (in directory order: the order the disk gives); the
    first ``limit`` by name of those matching are kept in a bounded heap (memory of ``limit`` entries,
    whatever the directory's size) and shown sorted by name. A directory with more entries than
    ``max_dir_scan`` is said to be so (``scan_limit``, ``examined``, ``scan_note``): its ``matched`` is
    then a lower bound, and the names shown are the first by name among the entries examined only."""
    limit = min(limit, cfg.max_list_entries)
    smallest: list[tuple[str, os.DirEntry[str]]] = []    # a max-heap by name (inverted): the ``limit`` first
    matched = scanned = hidden = 0
    complete = True
    try:
        with os.scandir(fd) as it:
            for e in it:
                if scanned >= cfg.max_dir_scan:
                    complete = False
                    break
                scanned += 1
                if guard.hides(os.path.join(real, e.name)):
                    continue      # the server's own data: not even counted
                if is_secret_name(e.name, os.path.basename(real)) or e.name.lower() in SECRET_DIRS:
                    hidden += 1
                    continue
                if pattern is None or fnmatch.fnmatch(e.name, pattern):
                    matched += 1
                    if len(smallest) < limit:
                        heapq.heappush(smallest, (_Desc(e.name), e))
                    elif e.name < smallest[0][0].name:
                        heapq.heapreplace(smallest, (_Desc(e.name), e))
    except PermissionError:
        raise ToolFailure(f"permission denied listing '{path}'") from None
    except OSError as e:
        raise ToolFailure(f"cannot list '{path}': {e.strerror or type(e).__name__}") from None
    names = sorted((e for _, e in smallest), key=lambda e: e.name)
    entries: list[dict[str, Any]] = []
    budget = cfg.max_result_chars - RESULT_MARGIN
    for e in names:
        item = _entry(e)
        budget -= len(to_json(item)) + 1
        if budget < 0:
            break
        entries.append(item)
    out: dict[str, Any] = {"path": real, "entries": entries, "returned": len(entries), "matched": matched,
                           "truncated": len(entries) < matched or not complete, "note": FILE_NOTE}
    if pattern is not None:
        out["pattern"] = pattern
    if hidden:
        out["hidden"] = hidden   # secret-looking names, never listed
    if not complete:
        out["scan_limit"] = cfg.max_dir_scan
        out["examined"] = scanned
        out["scan_note"] = (f"The directory has more than {cfg.max_dir_scan} entries: only the first {scanned} "
                            "(in directory order, not by name) were examined (tools.max_dir_scan). 'matched' "
                            "counts those only (the directory holds at least that many), and the entries shown "
                            "are the first by name among them, not necessarily the directory's first names.")
    return out


class _Desc:
    """A name that orders backwards: ``heapq``'s min-heap of them keeps the largest name on top (the
    one to drop when a smaller name comes)."""
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __lt__(self, other: _Desc) -> bool:
        return self.name > other.name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.name == other.name


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _decode_cut(data: bytes) -> str:
    """``_decode`` of bytes cut at an arbitrary place: a character cut at the end is left out (not
    shown as U+FFFD)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start >= len(data) - 3 and e.reason == "unexpected end of data":
            return _decode(data[:e.start])
        return _decode(data)


def read_file(cfg: ToolsConfig, path: str, offset: int, lines: int,
              protected: tuple[Protected, ...] = (), secrets: Iterable[str] = ()) -> dict[str, Any]:
    """The ``read_file`` tool (blocking): lines ``offset``.. of a text file, within the byte cap, redacted
    (``secrets``: values redacted besides the secret shapes)."""
    real = file_policy(cfg, "read_file", protected).resolve(path, missing="no such file")
    fd, st = open_regular(real, path, _PURPOSE)
    redactor = LineRedactor(secrets)
    try:
        head = os.pread(fd, min(BLOCK, cfg.max_file_bytes), 0)
        if looks_binary(head):
            raise ToolFailure(f"'{path}' is a binary file ({fmt_bytes(st.st_size)}); read_file shows text files only")
        lines = min(lines, cfg.max_read_lines)
        budget = cfg.max_result_chars - RESULT_MARGIN
        line_no, pos, rest = 1, 0, b""
        cut_line = None         # the number of a line shown cut at the byte cap
        out: list[str] = []
        used = 0
        stopped = None          # why the answer ends before the end of the file
        while True:
            if pos >= cfg.max_file_bytes:
                stopped = "byte_cap"
                break
            block = head if pos == 0 else os.pread(fd, min(BLOCK, cfg.max_file_bytes - pos), pos)
            if not block:
                break
            pos += len(block)
            parts = (rest + block).split(b"\n")
            rest = parts.pop()
            for text in redactor.lines([_decode(raw) for raw in parts]):
                if line_no >= offset:
                    if len(out) >= lines:
                        stopped = "lines"
                        break
                    if used + len(text) + 1 > budget and out:
                        stopped = "size"
                        break
                    out.append(text[:budget])
                    used += len(text) + 1
                line_no += 1
            if stopped:
                break
        if stopped == "byte_cap" and rest and line_no >= offset and not out:
            # a line longer than what is left of the byte cap (a minified JSON file's only line): its
            # start, cut and said to be (``cut_line``), instead of nothing and a file that looks empty
            # (only what can be shown is redacted, with a margin: a secret cut at the margin starts after
            # the text shown; redacting a whole 1 MiB line took ~2 s)
            text = redactor.lines([_decode_cut(rest[:(budget + CUT_REDACT_MARGIN) * 4])])[0]
            out.append(text[:budget])
            cut_line = line_no
        elif not stopped and rest and line_no >= offset:
            text = redactor.lines([_decode(rest)])[0]
            if len(out) >= lines:
                stopped = "lines"
            elif used + len(text) + 1 > budget and out:
                stopped = "size"
            else:
                out.append(text[:budget])
                line_no += 1
    finally:
        os.close(fd)
    if offset > 1 and not out and stopped is None:
        raise ToolFailure(f"'{path}' has {line_no - 1} lines; offset {offset} is past the end")
    result: dict[str, Any] = {"path": real, "size": fmt_bytes(st.st_size), "bytes": st.st_size,
                              "modified": iso_mtime(st.st_mtime), "offset": offset, "lines_returned": len(out),
                              "text": "\n".join(out), "truncated": stopped is not None, "note": FILE_NOTE}
    if stopped in ("lines", "size"):
        result["next_offset"] = offset + len(out)
    if stopped == "byte_cap":
        result["read_limit"] = fmt_bytes(cfg.max_file_bytes)
        result["note"] = (f"{FILE_NOTE} Only the first {fmt_bytes(cfg.max_file_bytes)} of the file are read "
                          "(tools.max_file_bytes); use search_files or read_log for the rest.")
    if cut_line is not None:
        result["cut_line"] = cut_line
        result["text"] += CUT_MARK
        result["note"] += (f" Line {cut_line} is longer than the read limit ({fmt_bytes(cfg.max_file_bytes)}, "
                           f"tools.max_file_bytes): only its start is shown, cut where '{CUT_MARK.strip()}' stands.")
    return result
