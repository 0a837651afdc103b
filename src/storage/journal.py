"""The append-only journal beside each snapshot: one JSON object per line, one line per change.

Every line carries ``seq`` (the session's change sequence number); replay skips lines whose
``seq`` is not above the snapshot's ``last_seq``, so replaying twice never duplicates anything.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import orjson

from .fsio import fsync_dir, write_file_synced

log = logging.getLogger("storage")

_sync = getattr(os, "fdatasync", os.fsync)


@dataclass(slots=True)
class JournalScan:
    """What a journal file held when it was read."""
    entries: list[dict[str, Any]] = field(default_factory=list)
    valid_len: int = 0          # bytes up to the end of the last complete line
    disk_len: int = 0           # file size when read
    lines: int = 0              # complete lines (good or bad)
    torn: bool = False          # an unterminated last line was ignored
    bad_lines: list[int] = field(default_factory=list)   # 1-based numbers of unparsable lines
    rejected: list[int] = field(default_factory=list)    # seqs of entries that failed to apply


def scan_journal(path: str) -> JournalScan:
    """Read and parse a journal. A missing file is an empty journal."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return JournalScan()
    scan = JournalScan(disk_len=len(data))
    end = data.rfind(b"\n") + 1
    scan.valid_len = end
    if end < len(data):
        scan.torn = True
    if end == 0:
        return scan
    for n, raw in enumerate(data[:end - 1].split(b"\n"), start=1):
        scan.lines += 1
        try:
            entry = orjson.loads(raw)
        except orjson.JSONDecodeError:
            scan.bad_lines.append(n)
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("seq"), int) or "op" not in entry:
            scan.bad_lines.append(n)
            continue
        scan.entries.append(entry)
    return scan


class JournalWriter:
    """Appends lines to one journal. Opened lazily; callers serialize appends (session lock).

    ``fd_lock`` only orders ``sync`` (background flusher) against ``close``/``rewrite``.
    """

    def __init__(self, path: str, valid_len: int) -> None:
        self.path = path
        self.size = valid_len
        self.fd: int | None = None
        self.dirty = False
        self.fd_lock = threading.Lock()

    def _open(self) -> int:
        existed = os.path.exists(self.path)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        disk = os.fstat(fd).st_size
        if disk > self.size:
            log.warning("storage: %s: dropping %d bytes of a torn last line", self.path, disk - self.size)
            os.ftruncate(fd, self.size)
            os.fsync(fd)
        elif disk < self.size:
            log.warning("storage: %s shrank from %d to %d bytes outside the store", self.path, self.size, disk)
            self.size = disk
        if not existed:
            fsync_dir(os.path.dirname(self.path) or ".")
        self.fd = fd
        return fd

    def append(self, line: bytes, *, sync: bool) -> None:
        """Write one complete line; fsync it when ``sync``. On failure the file is cut back."""
        fd = self.fd if self.fd is not None else self._open()
        before = self.size
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
            if sync:
                _sync(fd)
        except BaseException:
            try:
                os.ftruncate(fd, before)
            except OSError:
                log.exception("storage: could not cut %s back after a failed write", self.path)
            raise
        self.size = before + len(line)
        if not sync:
            self.dirty = True

    def sync(self) -> None:
        """fsync pending batched writes (called from the flusher thread)."""
        with self.fd_lock:
            if self.fd is not None and self.dirty:
                self.dirty = False
                _sync(self.fd)

    def drop_prefix(self, offset: int) -> None:
        """Remove the first ``offset`` bytes (already in the snapshot); keep the rest durably."""
        with self.fd_lock:
            if offset >= self.size:
                fd = self.fd if self.fd is not None else self._open()
                os.ftruncate(fd, 0)
                os.fsync(fd)
                self.size, self.dirty = 0, False
                return
            with open(self.path, "rb") as f:
                f.seek(offset)
                tail = f.read(self.size - offset)
            tmp = self.path + ".tmp"
            write_file_synced(tmp, tail)
            os.replace(tmp, self.path)
            fsync_dir(os.path.dirname(self.path) or ".")
            self._close_fd()
            self.size, self.dirty = len(tail), False

    def _close_fd(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)

    def close(self) -> None:
        """fsync anything pending and close the file."""
        with self.fd_lock:
            if self.fd is not None and self.dirty:
                _sync(self.fd)
                self.dirty = False
            self._close_fd()
