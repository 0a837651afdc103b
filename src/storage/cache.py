"""The bounded LRU of loaded sessions and their per-session locks.

``locked(sid)`` yields a session with its lock held, loading it on a miss through the ``load``
callback; eviction fsyncs and closes a session's journal. Two bounds, whichever is hit first: a
count (``size``: each loaded session holds its journal file open) and a weight (``max_bytes``: the
sum of ``LoadedSession.nbytes()``, the JSON its files hold, a stand-in for its memory). A session
that is busy, compacting or waiting for a flush round is skipped by eviction and retried later by
the maintenance thread, so the bounds can be exceeded briefly.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
import threading

from .errors import NotFound, StorageClosed
from .ids import validate_session_id
from .session import GONE, READY, LoadedSession


class SessionCache:
    """Loaded sessions by id, least recently used first (thread-safe)."""

    def __init__(self, *, size: int, max_bytes: int, idle_s: float, exists: Callable[[str], bool],
                 new: Callable[[str], LoadedSession], load: Callable[[LoadedSession], None]) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.idle_s = idle_s
        self._exists = exists          # is the session in the index?
        self._new = new                # an empty slot for a session id
        self._load = load              # fill a slot from disk (its lock held)
        self._sessions: OrderedDict[str, LoadedSession] = OrderedDict()
        self.lock = threading.Lock()
        self.closed = False

    def check_open(self) -> None:
        if self.closed:
            raise StorageClosed("the history store is closed")

    def __len__(self) -> int:
        with self.lock:
            return len(self._sessions)

    def get(self, sid: str) -> LoadedSession | None:
        with self.lock:
            return self._sessions.get(sid)

    def sessions(self) -> list[LoadedSession]:
        with self.lock:
            return list(self._sessions.values())

    def add(self, sess: LoadedSession) -> None:
        """Insert a session created in memory (status READY)."""
        with self.lock:
            self.check_open()
            self._sessions[sess.sid] = sess
        self.trim()

    def close(self) -> bool:
        """Refuse new work from now on; False if already closed."""
        with self.lock:
            if self.closed:
                return False
            self.closed = True
            return True

    @contextmanager
    def locked(self, sid: str, *, transient: bool = False) -> Iterator[LoadedSession]:
        """Yield the loaded session with its lock held, loading it if needed. A transient load
        (search) is dropped again on exit instead of staying in the LRU."""
        validate_session_id(sid)
        while True:
            with self.lock:
                self.check_open()
                sess = self._sessions.get(sid)
                fresh = sess is None
                if fresh:
                    if not self._exists(sid):
                        raise NotFound(f"session {sid} not found")
                    sess = self._new(sid)
                    sess.transient = transient
                    sess.lock.acquire()
                    self._sessions[sid] = sess
                else:
                    self._sessions.move_to_end(sid)
            if fresh:
                try:
                    self._load(sess)
                except BaseException:
                    self.forget(sess)
                    sess.lock.release()
                    raise
                break
            sess.lock.acquire()
            if sess.status == READY:
                if not transient:
                    sess.transient = False
                break
            sess.lock.release()
        try:
            sess.last_used = time.monotonic()
            yield sess
        finally:
            if sess.transient and sess.status == READY and not sess.compacting:
                self.close_session(sess)
            sess.lock.release()
        if fresh and not transient:
            self.trim()

    def forget(self, sess: LoadedSession) -> None:
        sess.status = GONE
        with self.lock:
            if self._sessions.get(sess.sid) is sess:
                del self._sessions[sess.sid]

    def close_session(self, sess: LoadedSession) -> None:
        """Flush and close a session's journal and drop it (caller holds its lock)."""
        try:
            if sess.writer is not None:
                sess.writer.close()
        finally:
            self.forget(sess)

    def evict(self, sess: LoadedSession) -> bool:
        if not sess.lock.acquire(blocking=False):
            return False          # in use right now: not a good victim
        try:
            if sess.status != READY or sess.compacting or (sess.writer is not None and sess.writer.dirty):
                return False      # (dirty: a commit is waiting for its flush round; closing would fsync here)
            self.close_session(sess)
            return True
        finally:
            sess.lock.release()

    def trim(self) -> None:
        """Evict least recently used sessions beyond ``size`` or ``max_bytes``, skipping busy
        ones. The most recently used session is never the victim."""
        with self.lock:
            sessions = list(self._sessions.values())
        excess = len(sessions) - self.size
        weight = sum(s.nbytes() for s in sessions)
        over = weight - self.max_bytes
        for v in sessions[:-1]:
            if excess <= 0 and over <= 0:
                break
            size = v.nbytes()
            if self.evict(v):
                excess -= 1
                over -= size

    def close_idle_journals(self) -> int:
        """Close the journal file of every loaded session that is idle right now (its lock free,
        nothing waiting to be made durable), least recently used first; the sessions stay loaded
        and a journal is opened again by its next write. Never waits (called from any thread that
        ran out of descriptors: ``fsio.relieve``). Returns how many were closed."""
        with self.lock:
            sessions = list(self._sessions.values())
        closed = 0
        for sess in sessions:
            if sess.writer is None or sess.writer.fd is None or not sess.lock.acquire(blocking=False):
                continue
            try:
                if sess.status == READY and not sess.compacting and sess.writer is not None:
                    closed += sess.writer.release_fd()
            finally:
                sess.lock.release()
        return closed

    def evict_idle(self, now: float | None = None) -> int:
        """Evict sessions unused for ``idle_s``; returns how many."""
        now = time.monotonic() if now is None else now
        with self.lock:
            victims = [s for s in self._sessions.values() if now - s.last_used > self.idle_s]
        return sum(self.evict(v) for v in victims)
