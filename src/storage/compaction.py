"""Compaction: fold a session's journal into a new snapshot, on one background thread.

When a journal reaches ``threshold`` lines, a consistent copy of the session is taken under its
lock and a new snapshot is streamed to ``<snapshot>.tmp`` off the lock; then, under the lock again,
it is renamed in and the journal lines it covers are dropped (see docs/storage.md, Compaction).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .fsio import fsync_dir
from .index import SessionIndex
from .session import READY, LoadedSession, file_stat, write_snapshot

log = logging.getLogger("storage")


class Compactor:
    """The compaction worker (one thread, FIFO)."""

    def __init__(self, root: str, index: SessionIndex, threshold: int, after: Callable[[], None]) -> None:
        self.root = root
        self.index = index
        self.threshold = threshold
        self._after = after            # called when a background compaction ends (cache trim)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="storage-compact")

    def maybe_schedule(self, sess: LoadedSession) -> bool:
        """Queue a background compaction if the journal reached the threshold. Holds sess.lock.

        Sets ``sess.compacting`` while one is queued; returns whether one was queued.
        """
        if sess.compacting or sess.journal_lines < self.threshold:
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
                # Appends made while this snapshot was written may have filled the journal again;
                # nothing else would compact it until the next append. (Queued behind this one on
                # the single worker, so it cannot start before this call returns.)
                sess.compacting = False
                queued_again = self.maybe_schedule(sess)
        except Exception:
            log.exception("storage: background compaction of %s failed", sess.sid)
            _unlink_quiet(tmp)
        finally:
            if not queued_again:
                sess.compacting = False
            self._after()

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
