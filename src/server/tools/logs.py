"""The ``read_log`` tool: the tail of a regular file under one of the configured log roots.

Path rules: no NUL bytes and no ``..`` component; relative paths are looked up under each root in
order; the real path (symlinks resolved) must lie inside the real path of a root; only regular
files are read, opened with O_NOFOLLOW and checked again with fstat; reads are capped at
``max_log_bytes`` and done by seeking back from the end of the file.
"""
from __future__ import annotations

import os
import stat
from datetime import datetime
from typing import Any

from server.tools.config import ToolsConfig
from server.tools.units import ToolFailure, fmt_bytes

READ_LOG_SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "minLength": 1, "maxLength": 4096,
                 "description": "Log file path, absolute or relative to a configured log root."},
        "lines": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50,
                  "description": "How many lines from the end of the file."},
    },
    "required": ["path"],
    "additionalProperties": False,
}

_BLOCK = 64 * 1024


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:
        return False


def resolve_log_path(cfg: ToolsConfig, path: str) -> str:
    """Validate ``path`` against the allowlist and return its real path (raises ToolFailure)."""
    if not cfg.log_roots:
        raise ToolFailure("read_log is disabled: no log directories are configured on the server (tools.log_roots)")
    if "\x00" in path:
        raise ToolFailure("path must not contain NUL bytes")
    if ".." in path.replace("\\", "/").split("/"):
        raise ToolFailure(f"path '{path}' must not contain '..' components")
    roots = [os.path.realpath(r) for r in cfg.log_roots]
    if os.path.isabs(path):
        candidates = [path]
    else:
        candidates = [os.path.join(r, path) for r in roots]
    for candidate in candidates:
        real = os.path.realpath(candidate)
        if not any(_inside(real, r) for r in roots):
            if os.path.isabs(path):
                raise ToolFailure(f"path '{path}' is outside the allowed log directories")
            continue   # a symlink under this root pointing out of it: try no further here
        if os.path.lexists(candidate):
            return real
    if os.path.isabs(path) or not any(os.path.lexists(c) for c in candidates):
        raise ToolFailure(f"no such log file: '{path}'")
    raise ToolFailure(f"path '{path}' resolves outside the allowed log directories")


def _tail(fd: int, size: int, lines: int, cap: int) -> tuple[bytes, bool]:
    """The last ``lines`` lines of the file, reading at most ``cap`` bytes; (data, truncated)."""
    pos, data = size, b""
    while pos > 0 and data.count(b"\n") <= lines and len(data) < cap:
        step = min(_BLOCK, pos, cap - len(data))
        pos -= step
        data = os.pread(fd, step, pos) + data
    truncated = pos > 0
    body = data[:-1] if data.endswith(b"\n") else data
    parts = body.split(b"\n")
    if len(parts) > lines:
        parts, truncated = parts[-lines:], True
    elif truncated and parts:
        parts = parts[1:]   # the first line was cut by the byte cap
    return b"\n".join(parts), truncated


def read_log(cfg: ToolsConfig, path: str, lines: int) -> dict[str, Any]:
    """The ``read_log`` tool (blocking)."""
    real = resolve_log_path(cfg, path)
    lines = min(lines, cfg.max_log_lines)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ToolFailure(f"no such log file: '{path}'") from None
    except PermissionError:
        raise ToolFailure(f"permission denied reading '{path}'") from None
    except OSError as e:
        raise ToolFailure(f"cannot open '{path}': {e.strerror or type(e).__name__}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise ToolFailure(f"'{path}' is {kind}; read_log reads regular log files only")
        data, truncated = _tail(fd, st.st_size, lines, cfg.max_log_bytes)
    except IsADirectoryError:
        raise ToolFailure(f"'{path}' is a directory; read_log reads regular log files only") from None
    finally:
        os.close(fd)
    text = data.decode("utf-8", errors="replace")
    return {"path": real, "size": fmt_bytes(st.st_size),
            "modified": datetime.fromtimestamp(st.st_mtime).astimezone().isoformat(timespec="seconds"),
            "lines_returned": text.count("\n") + 1 if text else 0, "truncated": truncated, "text": text}
