"""The marker of turns in flight: which sessions had a turn running, so that a restart after a crash
knows which sessions to close (issue 15, item 5) without reading every session of the store.

The marker is a small file beside the history (``turns_in_flight.log``): ``+<session>`` is appended
(and awaited) *before* a turn's user message is stored; when a turn ends the file is rewritten in
place (the running sessions' lines written at offset 0, then the file cut to their length: two
syscalls on the open descriptor, no new file per turn) to name only the sessions still running, so it holds no id of a session whose turns
are over (a purged session leaves no trace in it). After a crash, the sessions it names are the
candidates; the stored messages decide (a candidate whose last message is an answer is left alone),
so a rewrite lost to the crash costs one extra session read and nothing else. Everything is written
by one thread in order, without fsync: a SIGKILL keeps it (the kernel has it), a power cut may lose
the last lines, like the "batched" durability of the store. (``read_marker`` also reads ``-<session>``
lines: the session is no longer running.)
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from storage.fsio import NotRegularFile, open_regular, quarantine, read_bytes

log = logging.getLogger("nplt.turns")

MARKER_NAME = "turns_in_flight.log"
COMPACT_BYTES = 256 << 10


def read_marker(path: str) -> list[str]:
    """Session ids whose last line in the marker file is ``+`` (in first-seen order); [] if no file."""
    try:
        data = read_bytes(path)
    except FileNotFoundError:
        return []
    except NotRegularFile as exc:          # never read or written through a link: set aside, started anew
        _set_aside(path, exc.strerror)
        return []
    state: dict[str, bool] = {}
    for line in data.split(b"\n"):   # a torn last line (no newline) still names its session
        if len(line) > 1 and line[:1] in (b"+", b"-"):
            state[line[1:].decode("ascii", "replace")] = line[:1] == b"+"
    return [sid for sid, running in state.items() if running]


def _set_aside(path: str, what: str) -> None:
    """``path`` is a symbolic link or not a regular file (a directory, a FIFO, ...): an empty directory
    is removed, anything else moved to ``quarantine/`` beside it (a link as the link itself, its
    target never touched; the ERROR line is ``fsio.quarantine``'s), never deleted."""
    try:
        os.rmdir(path)                     # (only an empty directory, never through a link)
    except OSError:
        pass
    else:
        log.error("%s %s (an empty directory): removed, the marker is started anew", path, what)
        return
    quarantine(os.path.dirname(path) or ".", path, reason=f"the turn marker {what}; it is started anew")


class NoMarker:
    """Used when the store has no directory of its own (tests' stand-ins, PostgreSQL): marks nothing."""

    path: str | None = None

    async def started(self, session_id: str) -> None:
        return None

    def ended(self, session_id: str) -> None:
        return None

    def reset(self, keep: list[str]) -> None:
        return None

    def close(self) -> None:
        return None


class InFlightTurns(NoMarker):
    """The marker file of one server; every write runs on its own single thread (in order)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._size = 0
        self._running: dict[str, int] = {}     # session -> turns marked and not ended (normally 0 or 1)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="nplt-inflight")
        self._pending: set[Future] = set()
        # Turn ends coalesce: while a rewrite is queued last on the thread, a later end only
        # updates ``_keep`` (what that rewrite writes when it runs) instead of queuing another.
        self._keep: tuple[str, ...] = ()
        self._rewrite_queued = False
        # Turn starts coalesce too: lines marked while a write is queued and not yet started go out
        # with it, in one pwrite, and their callers wake together (one hand-off for the batch; a
        # thread hop a turn cost the loop more than all the rest of the marker).
        self._lock = threading.Lock()
        self._lines: list[bytes] = []            # start lines for the queued write (under _lock)
        self._lines_keep: tuple[str, ...] = ()   # the running sessions when the last of them was added
        self._lines_done: asyncio.Future[None] | None = None   # their callers' future (None: no write queued)

    # -- the writer thread ------------------------------------------------------------------------
    def _open(self) -> int:
        # Not O_APPEND: on Linux pwrite ignores its offset on such a descriptor. One thread writes,
        # so ``_size`` is where the next line goes.
        if self._fd is None:
            self._fd = open_regular(self.path, os.O_WRONLY | os.O_CREAT, 0o600)   # (never through a link)
            self._size = os.fstat(self._fd).st_size
        return self._fd

    def _write(self, line: bytes, keep: tuple[str, ...]) -> None:
        fd = self._open()
        if self._size + len(line) > COMPACT_BYTES:
            self._rewrite(keep)
        os.pwrite(fd, line, self._size)
        self._size += len(line)

    def _rewrite(self, keep: tuple[str, ...] | list[str]) -> None:
        """Make the file one ``+`` line per session still running: written at offset 0, then the
        file is cut to that length. (A SIGKILL between the two leaves old lines after the new ones:
        at worst sessions whose turns were over are named too, which recovery checks anyway.)"""
        data = b"".join(b"+" + sid.encode() + b"\n" for sid in keep)
        fd = self._open()
        if data:
            os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        self._size = len(data)

    def _rewrite_latest(self) -> None:
        self._rewrite_queued = False     # first: an end from now on queues a rewrite of its own
        self._rewrite(self._keep)

    # -- the runner's side ------------------------------------------------------------------------
    async def started(self, session_id: str) -> None:
        """Mark a turn of ``session_id`` as running; returns once the line is written (the file is
        compacted to the running sessions when it grows past ``COMPACT_BYTES``). Starts that come
        while a write is queued share it."""
        self._running[session_id] = self._running.get(session_id, 0) + 1
        self._rewrite_queued = False     # this line goes after a queued rewrite: the next end needs its own
        line = b"+" + session_id.encode() + b"\n"
        with self._lock:
            self._lines.append(line)
            self._lines_keep = tuple(self._running)
            done = self._lines_done
            if done is None:
                done = self._lines_done = asyncio.wrap_future(self._pool.submit(self._write_lines))
        await asyncio.shield(done)       # (a cancelled caller leaves the others' write alone)

    def _write_lines(self) -> None:
        """The writer thread: every start line queued so far, in one write (an error reaches every
        caller of the batch)."""
        with self._lock:
            lines, keep = self._lines, self._lines_keep
            self._lines, self._lines_done = [], None
        self._write(b"".join(lines), keep)

    def ended(self, session_id: str) -> None:
        """The turn ended (answer stored or not): the file is rewritten in the background (turn ends
        that come before the thread gets to it share one rewrite)."""
        left = self._running.get(session_id, 0) - 1
        if left > 0:
            self._running[session_id] = left
            return
        self._running.pop(session_id, None)
        self._keep = tuple(self._running)
        if self._rewrite_queued:         # the queued rewrite has not started yet: it writes _keep
            return
        try:
            fut = self._pool.submit(self._rewrite_latest)
            self._rewrite_queued = True
        except RuntimeError:   # closed: a turn cancelled late at shutdown; the next start checks it
            return
        self._pending.add(fut)
        fut.add_done_callback(self._done)

    def _done(self, fut: Future) -> None:
        self._pending.discard(fut)
        if not fut.cancelled() and fut.exception() is not None:
            log.warning("turn marker not written: %s", fut.exception())

    def reset(self, keep: list[str]) -> None:
        """At start-up (blocking: call it off the loop): start a fresh file holding ``keep``."""
        self._pool.submit(self._rewrite, keep).result()

    def close(self) -> None:
        """Flush the pending lines and close the file (blocking)."""
        self._pool.shutdown(wait=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
