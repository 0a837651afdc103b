"""The shared write-ahead log: one write + one fdatasync per group-commit round, whatever the
number of sessions in it (fsync mode).

A commit still writes its line to its session's journal (no fsync). The flusher then writes the
round's lines to the current WAL file as records and fdatasyncs that one file; once it returns the
lines are durable, and their waiters are acknowledged. The journals are made durable later by a
**checkpoint**: the WAL file is retired (a new generation starts) when it reaches
``checkpoint_bytes`` or is ``checkpoint_s`` old, then a background thread fsyncs every journal the
retired file has records for and deletes it. Until that delete, startup replays the file into the
journals (``wal_replay.py``), so a journal line lost with the page cache is written again.

Files: ``<root>/wal_<generation, 8 digits>.log``. One record per journal line::

    <crc32 of the rest, 8 hex> <session id> <seq> <journal line, ending in \\n>

A journal line is one orjson document (no raw newline), so a record is one line too. A record that
does not end in a newline or whose checksum does not match is a torn tail: replay stops there.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterable

from . import fsio
from .fsio import FILE_MODE, fsync_dir, os_open, write_all

log = logging.getLogger("storage")

WAL_RE = re.compile(r"wal_([0-9]{8})\.log")


def wal_name(generation: int) -> str:
    return f"wal_{generation:08d}.log"


def wal_files(root: str) -> list[tuple[int, str]]:
    """The WAL files in ``root`` as (generation, path), oldest first."""
    found = []
    with os.scandir(root) as it:
        for e in it:
            m = WAL_RE.fullmatch(e.name)
            if m is not None:
                found.append((int(m.group(1)), e.path))
    return sorted(found)


def encode_record(sid: str, seq: int, line: bytes) -> bytes:
    """One WAL record for journal ``line`` (which ends in a newline) of session ``sid``."""
    payload = b"%s %d %s" % (sid.encode(), seq, line)
    return b"%08x %s" % (zlib.crc32(payload), payload)


def decode_records(data: bytes) -> tuple[list[tuple[str, int, bytes]], int]:
    """(records as (sid, seq, journal line with its newline), bytes of ``data`` they span).
    Stops at the first torn or damaged record: nothing after it was ever acknowledged."""
    out: list[tuple[str, int, bytes]] = []
    pos, n = 0, len(data)
    while pos < n:
        end = data.find(b"\n", pos)
        if end < 0:
            break
        rec = data[pos:end + 1]
        head, _, payload = rec.partition(b" ")
        try:
            ok = len(head) == 8 and int(head, 16) == zlib.crc32(payload)
        except ValueError:
            ok = False
        if not ok:
            break
        sid, _, rest = payload.partition(b" ")
        seq, _, line = rest.partition(b" ")
        try:
            out.append((sid.decode("ascii"), int(seq), line))
        except (UnicodeDecodeError, ValueError):
            break
        pos = end + 1
    return out, pos


class SharedLog:
    """The current WAL file (written by the flusher thread only) and the retired ones waiting for
    their checkpoint (the checkpoint thread). ``sync_journals`` fsyncs journal files by path, side
    by side; it raises nothing and returns the paths it could not fsync."""

    def __init__(self, root: str, *, checkpoint_bytes: int, checkpoint_s: float,
                 sync_journals: Callable[[Iterable[str]], list[str]]) -> None:
        self.root = root
        self.checkpoint_bytes = checkpoint_bytes
        self.checkpoint_s = checkpoint_s
        self._sync_journals = sync_journals
        existing = wal_files(root)
        self._generation = existing[-1][0] if existing else 0
        self._fd: int | None = None
        self._size = 0
        self._opened = 0.0
        self._journals: set[str] = set()          # journals with records in the current file
        self._lock = threading.Lock()
        self._retired: list[tuple[str, set[str]]] = []
        self.rounds = 0
        self.checkpoints = 0
        self.checkpoint_fsyncs = 0

    # -- flusher thread ---------------------------------------------------------------------
    def write(self, records: bytes, journals: Iterable[str]) -> None:
        """Append one round's records and fdatasync them. On failure the file is retired (what it
        held before stays there for replay) and the next round starts a new one."""
        fd = self._fd if self._fd is not None else self._open()
        start = self._size
        self._journals.update(journals)
        try:
            write_all(fd, records)
            fsio.datasync(fd)
        except OSError:
            try:
                os.ftruncate(fd, start)
            except OSError:
                log.exception("storage: could not cut the WAL back after a failed write")
            self._retire()
            raise
        self._size = start + len(records)
        self.rounds += 1

    def due(self) -> bool:
        """The current file should be retired and checkpointed."""
        return self._fd is not None and (self._size >= self.checkpoint_bytes
                                         or time.monotonic() - self._opened >= self.checkpoint_s)

    def next_due(self) -> float | None:
        """Seconds until the current file is due by age (None: no file open)."""
        if self._fd is None:
            return None
        return max(0.0, self._opened + self.checkpoint_s - time.monotonic())

    def retire(self) -> None:
        """Close the current file; the next round opens a new generation."""
        if self._fd is not None:
            self._retire()

    def _open(self) -> int:
        self._generation += 1
        path = os.path.join(self.root, wal_name(self._generation))
        fd = os_open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, FILE_MODE)
        try:
            fsync_dir(self.root)            # the new file's entry is durable before any record
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        self._fd, self._size, self._opened = fd, 0, time.monotonic()
        return fd

    def _retire(self) -> None:
        fd, self._fd = self._fd, None
        path = os.path.join(self.root, wal_name(self._generation))
        journals, self._journals = self._journals, set()
        if fd is not None:
            os.close(fd)
        with self._lock:
            self._retired.append((path, journals))

    # -- checkpoint thread ------------------------------------------------------------------
    def checkpoint(self) -> bool:
        """fsync the journals of every retired file, then delete those files (oldest first).
        A journal that cannot be fsynced keeps its file (and the later ones) for the next try."""
        with self._lock:
            todo = list(self._retired)
        done = 0
        for path, journals in todo:
            failed = self._sync_journals(sorted(journals))
            self.checkpoint_fsyncs += len(journals)
            if failed:
                log.error("storage: checkpoint of %s: could not fsync %s; the WAL file is kept",
                          path, ", ".join(failed))
                break
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError:
                log.exception("storage: could not remove the checkpointed WAL file %s", path)
                break
            done += 1
        if done:
            with self._lock:
                del self._retired[:done]
            try:
                fsync_dir(self.root)
            except OSError:
                log.exception("storage: could not fsync %s after a checkpoint", self.root)
            self.checkpoints += 1
        return done == len(todo)

    def pending(self) -> int:
        """Retired files not checkpointed yet."""
        with self._lock:
            return len(self._retired)
