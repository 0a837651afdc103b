"""The append-only journal beside each snapshot: one JSON object per line, one line per change.

Every line carries ``seq`` (the session's change sequence number); replay skips lines whose
``seq`` is not above the snapshot's ``last_seq``, so replaying twice never duplicates anything.
"""
from __future__ import annotations

import errno
import logging
import os
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson

from . import fsio
from .fsio import fsync_dir, open_regular, read_bytes, write_all, write_file_synced

log = logging.getLogger("storage")



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
    """Read and parse a journal. A missing file is an empty journal; a symbolic link or a file that
    is not regular raises NotRegularFile."""
    try:
        data = read_bytes(path)
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

    ``written`` counts the bytes ever appended through this writer and ``synced`` how many of them
    are known durable; both only grow, so a waiter's target survives a journal rewrite. ``fd_lock``
    orders ``sync_through`` (flusher thread) against ``close``/``drop_prefix``. After a failed
    fsync the writer is ``failed``: it refuses further appends until the session is reloaded.

    ``queue`` (an open journal only) counts a line as appended without writing it: the flusher
    thread writes queued lines (``drain``) before the WAL record that makes them durable, so an
    append on the event loop needs no worker thread. Every other file operation drains first, so
    the file always holds the lines in the order they were appended.

    ``on_file`` counts (as ``written`` does) the bytes actually in the file. After a failure cut
    bytes off, ``lost_after`` is the count beyond which appended bytes are gone (None: none are).
    """

    def __init__(self, path: str, valid_len: int) -> None:
        self.path = path
        self.size = valid_len          # file offset of the end of the last complete line
        self.fd: int | None = None
        self.written = 0
        self.synced = 0
        self.failed = False
        self.on_file = 0
        self.lost_after: int | None = None
        self.fd_lock = threading.Lock()
        self._write_lock = threading.Lock()    # orders writes: drained lines before later ones
        self._queued: deque[bytes] = deque()   # appended (counted in size/written), not written yet

    @property
    def dirty(self) -> bool:
        """Some appended bytes are not known durable yet."""
        return self.synced < self.written

    def _open(self) -> int:
        existed = os.path.exists(self.path)
        fd = open_regular(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
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
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return fd

    def append(self, line: bytes, *, sync: bool) -> int:
        """Write one complete line (fsync it too when ``sync``); returns ``written`` after it, the
        target to pass to ``sync_through``. On failure the file is cut back and nothing counts."""
        if self.failed:
            raise OSError(errno.EIO, "an earlier fsync of this journal failed")
        with self._write_lock:
            self._drain_locked()
            fd = self.fd if self.fd is not None else self._open()
            before = self.size
            try:
                write_all(fd, line)
                if sync:
                    fsio.datasync(fd)
            except BaseException:
                try:
                    os.ftruncate(fd, before)
                except OSError:
                    log.exception("storage: could not cut %s back after a failed write", self.path)
                raise
            self.size = before + len(line)
            self.written += len(line)
            self.on_file = self.written      # (drained first; queue() needs the session lock too)
            if sync:
                self.synced = self.written
            return self.written

    def can_queue(self) -> bool:
        """``queue`` is possible: the file is open and no earlier write failed."""
        return self.fd is not None and not self.failed

    def queue(self, line: bytes) -> int:
        """Count one complete line as appended without writing it (caller holds the session lock
        and checked ``can_queue``); ``drain`` writes it. Returns the target for ``mark_synced``."""
        self._queued.append(line)
        self.size += len(line)
        self.written += len(line)
        return self.written

    def drain(self) -> None:
        """Write every queued line, in order (the flusher, before their WAL record; every other file
        operation, first). On failure the file is cut back, the writer is ``failed`` and OSError
        is raised."""
        if self._queued:
            with self._write_lock:
                self._drain_locked()

    def _drain_locked(self) -> None:
        if not self._queued:
            return
        if self.failed:
            raise OSError(errno.EIO, "an earlier write of this journal failed")
        lines = []
        while self._queued:             # deque: queue() may run meanwhile; later lines wait
            lines.append(self._queued.popleft())
        if self.fd is None:             # every closing path drains first: cannot happen
            self.failed = True
            raise OSError(errno.EIO, "journal closed with queued lines")
        data = b"".join(lines)
        start = os.lseek(self.fd, 0, os.SEEK_END)
        try:
            write_all(self.fd, data)
        except OSError:
            self.failed = True
            self.lost_after = self.on_file
            try:
                os.ftruncate(self.fd, start)
            except OSError:
                log.exception("storage: could not cut %s back after a failed write", self.path)
            raise
        self.on_file += len(data)

    def sync_through(self, target: int) -> None:
        """Make the first ``target`` written bytes durable with one fsync covering everything
        written so far (so concurrent waiters share it). Raises OSError if the fsync fails, after
        which the writer is ``failed``."""
        with self.fd_lock:
            if self.synced >= target:
                return
            if self.failed:
                raise OSError(errno.EIO, "an earlier fsync of this journal failed")
            upto = self.written
            if self.fd is None:          # closed or rewritten: both fsync what they keep
                self.synced = upto
                return
            try:
                fsio.datasync(self.fd)
            except OSError:
                self.failed = True
                raise
            self.synced = upto

    def mark_synced(self, target: int) -> None:
        """The first ``target`` written bytes are durable elsewhere (the shared WAL's round)."""
        with self.fd_lock:
            if target > self.synced:
                self.synced = target

    def sync(self) -> None:
        """fsync everything written so far (batched mode's flusher)."""
        self.sync_through(self.written)

    def cut_to_synced(self) -> None:
        """After a failed fsync: drop the bytes not known durable (caller holds the session lock)."""
        with self.fd_lock, self._write_lock:
            self._queued.clear()        # not written: nothing to cut for them
            keep = self.size - (self.written - self.synced)
            if self.fd is not None:
                os.ftruncate(self.fd, keep)
            self.size, self.written = keep, self.synced
            self.on_file = min(self.on_file, self.synced)
            self.lost_after = self.synced if self.lost_after is None else min(self.lost_after, self.synced)

    def drop_prefix(self, offset: int) -> None:
        """Remove the first ``offset`` bytes (already in the snapshot); keep the rest durably."""
        with self.fd_lock:
            self.drain()
            if offset >= self.size:
                fd = self.fd if self.fd is not None else self._open()
                os.ftruncate(fd, 0)
                os.fsync(fd)
                self.size, self.synced = 0, self.written
                return
            with os.fdopen(open_regular(self.path), "rb") as f:
                f.seek(offset)
                tail = f.read(self.size - offset)
            tmp = self.path + ".tmp"
            write_file_synced(tmp, tail)
            os.replace(tmp, self.path)
            fsync_dir(os.path.dirname(self.path) or ".")
            self._close_fd()
            self.size, self.synced = len(tail), self.written

    def release_fd(self) -> bool:
        """Close the file if nothing is pending (every byte written is durable, nothing queued, no
        failure) and no thread uses it right now (never waits); the next write opens it again.
        True if closed. (Out of descriptors: ``fsio.relieve``; caller holds the session lock.)"""
        if self.fd is None or not self.fd_lock.acquire(blocking=False):
            return False
        try:
            if not self._write_lock.acquire(blocking=False):
                return False
            try:
                if self.fd is None or self.failed or self._queued or self.dirty:
                    return False
                self._close_fd()
                return True
            finally:
                self._write_lock.release()
        finally:
            self.fd_lock.release()

    def _close_fd(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)

    def close(self) -> None:
        """fsync anything pending and close the file (a failed writer is closed without fsync)."""
        with self.fd_lock:
            if not self.failed:
                self.drain()
            if self.fd is not None and self.dirty and not self.failed:
                fsio.datasync(self.fd)
                self.synced = self.written
            self._close_fd()
