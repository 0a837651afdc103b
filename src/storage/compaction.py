"""Compaction: fold a session's journal into a new snapshot, on one background thread.

When a journal reaches ``threshold`` lines, a consistent copy of the session is taken under its
lock and a new snapshot is streamed to ``<snapshot>.tmp`` off the lock; then, under the lock again,
it is renamed in and the journal lines it covers are dropped (see docs/storage.md, Compaction).
A session whose background compaction failed is not compacted again in the background before a
backoff (RETRY_FIRST_S, doubled per failure in a row, at most RETRY_MAX_S) has passed.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .fsio import fsync_dir
from .index import SessionIndex
from .session import READY, LoadedSession, file_stat, write_snapshot

log = logging.getLogger("storage")

#: after a background compaction of a session failed (a full disk, an I/O error), the next one is
#: not tried for this long; each failure in a row doubles it, up to RETRY_MAX_S. Appends go on
#: meanwhile (the journal holds them; nothing is lost), without rewriting the snapshot each time.
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 300.0


class _Failures:
    """One session's background compactions failed in a row: how many, and when to try again."""

    __slots__ = ("count", "retry_at")

    def __init__(self) -> None:
        self.count = 0
        self.retry_at = 0.0


class Compactor:
    """The compaction worker (one thread, FIFO)."""

    def __init__(self, root: str, index: SessionIndex, threshold: int, after: Callable[[], None]) -> None:
        self.root = root
        self.index = index
        self.threshold = threshold
        self._after = after            # called when a background compaction ends (cache trim)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="storage-compact")
        # sessions whose last background compactions failed (kept across evictions; dropped by a
        # success or ``forget``)
        self._failures: dict[str, _Failures] = {}
        self._failures_lock = threading.Lock()
        self.clock: Callable[[], float] = time.monotonic     # (tests move it)

    def maybe_schedule(self, sess: LoadedSession) -> bool:
        """Queue a background compaction if the journal reached the threshold and the session is
        not backing off after failures. Holds sess.lock.

        Sets ``sess.compacting`` while one is queued; returns whether one was queued.
        """
        if sess.compacting or sess.journal_lines < self.threshold:
            return False
        if self._failures:
            with self._failures_lock:
                failed = self._failures.get(sess.sid)
                if failed is not None and self.clock() < failed.retry_at:
                    return False
        sess.compacting = True
        try:
            self._pool.submit(self._background, sess, _capture(sess))
        except RuntimeError:              # shutting down: close() compacts
            sess.compacting = False
            return False
        return True

    def barrier(self, timeout: float = 30) -> None:
        """Wait until every compaction queued before this call has finished (tests, benchmarks)."""
        self._pool.submit(lambda: None).result(timeout=timeout)

    def _install(self, sess: LoadedSession, tmp: str, offset: int, lines: int) -> None:
        """Rename the new snapshot in, then drop the journal lines it covers. Holds sess.lock."""
        os.replace(tmp, sess.snap_path)
        fsync_dir(self.root)
        sess.snap_stat = file_stat(sess.snap_path)
        sess.writer.drop_prefix(offset)
        sess.journal_lines = max(sess.journal_lines - lines, 0)
        sess.jdisk = sess.writer.size
        self.index.put(sess.state.record, sess.files())

    def _background(self, sess: LoadedSession, cap: tuple) -> None:
        head, msgs, offset, lines = cap
        tmp = sess.snap_path + ".tmp"
        queued_again = False
        try:
            write_snapshot(tmp, head, msgs)
            with sess.lock:
                if sess.status != READY:
                    os.unlink(tmp)
                    return
                self._install(sess, tmp, offset, lines)
                self._succeeded(sess.sid)
                # Appends made while this snapshot was written may have filled the journal again;
                # nothing else would compact it until the next append. (Queued behind this one on
                # the single worker, so it cannot start before this call returns.)
                sess.compacting = False
                queued_again = self.maybe_schedule(sess)
        except Exception as exc:
            self._failed(sess.sid, exc)
            _unlink_quiet(tmp)
        finally:
            if not queued_again:
                sess.compacting = False
            self._after()

    def _failed(self, sid: str, exc: Exception) -> None:
        """Log a failed background compaction (the traceback only for the first of a run of
        failures, then one line with the count) and back off: RETRY_FIRST_S, doubled per failure."""
        with self._failures_lock:
            failed = self._failures.setdefault(sid, _Failures())
            failed.count += 1
            delay = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** min(failed.count - 1, 30))
            failed.retry_at = self.clock() + delay
            count = failed.count
        if count == 1:
            log.exception("storage: background compaction of %s failed (the journal keeps every change; "
                          "next try in %.0f s at the earliest)", sid, delay)
        else:
            log.error("storage: background compaction of %s failed again: %s (%d failures in a row; next "
                      "try in %.0f s at the earliest)", sid, exc, count, delay)

    def _succeeded(self, sid: str) -> None:
        if self._failures:
            with self._failures_lock:
                failed = self._failures.pop(sid, None)
            if failed is not None:
                log.info("storage: background compaction of %s succeeded after %d failures", sid, failed.count)

    def failures(self, sid: str) -> int:
        """How many background compactions of ``sid`` failed in a row (0: none, or it then succeeded)."""
        with self._failures_lock:
            failed = self._failures.get(sid)
            return failed.count if failed is not None else 0

    def forget(self, sid: str) -> None:
        """The session is gone (purged): drop its failure count."""
        with self._failures_lock:
            self._failures.pop(sid, None)

    def compact_locked(self, sess: LoadedSession) -> None:
        """Compact now, in the caller's thread (caller holds sess.lock)."""
        head, msgs, offset, lines = _capture(sess)
        tmp = sess.snap_path + ".tmp"
        try:
            write_snapshot(tmp, head, msgs)
            self._install(sess, tmp, offset, lines)
        except BaseException:
            _unlink_quiet(tmp)
            raise
        self._succeeded(sess.sid)

    def close(self) -> None:
        """Finish queued compactions and stop the worker."""
        self._pool.shutdown(wait=True)


def _capture(sess: LoadedSession) -> tuple[dict[str, Any], list[dict[str, Any]], int, int]:
    return sess.state.head(), sess.state.msgs[:], sess.writer.size, sess.journal_lines


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        log.exception("storage: could not remove %s", path)
