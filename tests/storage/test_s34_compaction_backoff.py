"""A background compaction that fails (here: its temp snapshot cannot be created, as on a full disk)
is not retried at every append: the session backs off (RETRY_FIRST_S, doubled per failure), the
traceback is logged once, then one counted line per retry; the journal keeps every change. Before,
each append past the threshold rewrote the whole snapshot again and logged another traceback."""
from __future__ import annotations

import logging
import os
import time

from storage import HistoryStore, StorageConfig
from storage import compaction


def compaction_errors(caplog, sid: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR and "background compaction" in r.getMessage()
            and sid in r.getMessage()]


def test_a_failing_compaction_backs_off_and_logs_its_traceback_once(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="storage")
    root = tmp_path / "history"
    store = HistoryStore(StorageConfig(root=str(root), compact_threshold=2))
    try:
        sid = store.create("alice").session_id
        sess = store.cache.get(sid)
        blocker = sess.snap_path + ".tmp"
        os.mkdir(blocker)                          # the new snapshot cannot be written
        snap_before = os.stat(sess.snap_path)
        now = time.monotonic()
        store.compactor.clock = lambda: now          # (frozen: a slow disk must not end the first backoff)
        for i in range(20):
            store.append(sid, "user", f"m{i}")
            store.compactor.barrier()
        errs = compaction_errors(caplog, sid)
        assert len(errs) == 1 and errs[0].exc_info is not None       # one traceback, not one per append
        assert store.compactor.failures(sid) == 1
        assert os.stat(sess.snap_path).st_mtime_ns == snap_before.st_mtime_ns

        store.compactor.clock = lambda: now + compaction.RETRY_FIRST_S + 0.5      # the first backoff is over
        store.append(sid, "user", "m20")
        store.compactor.barrier()
        errs = compaction_errors(caplog, sid)
        assert len(errs) == 2 and errs[1].exc_info is None and "2 failures in a row" in errs[1].getMessage()
        for i in range(21, 30):                     # backing off again (2 x compaction.RETRY_FIRST_S now)
            store.append(sid, "user", f"m{i}")
            store.compactor.barrier()
        assert len(compaction_errors(caplog, sid)) == 2

        os.rmdir(blocker)                          # room again
        store.compactor.clock = lambda: now + compaction.RETRY_MAX_S + 1
        store.append(sid, "user", "m30")
        store.compactor.barrier()
        assert store.compactor.failures(sid) == 0
        assert sess.journal_lines < 2                               # compacted
        assert any("succeeded after 2 failures" in r.getMessage() for r in caplog.records)
        assert [m.content for m in store.messages(sid)] == [f"m{i}" for i in range(31)]
    finally:
        store.close()
    store = HistoryStore(StorageConfig(root=str(root)))
    try:
        assert [m.content for m in store.messages(sid)] == [f"m{i}" for i in range(31)]
    finally:
        store.close()


def test_backoff_doubles_up_to_its_cap(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="storage")
    store = HistoryStore(StorageConfig(root=str(tmp_path / "h"), compact_threshold=2))
    try:
        sid = store.create("bob").session_id
        sess = store.cache.get(sid)
        os.mkdir(sess.snap_path + ".tmp")
        t = [1000.0]
        store.compactor.clock = lambda: t[0]
        store.append(sid, "user", "first")          # (under the threshold: no compaction yet)
        delays = []
        for i in range(14):
            store.append(sid, "user", f"x{i}")
            store.compactor.barrier()
            delays.append(store.compactor._failures[sid].retry_at - t[0])
            t[0] += delays[-1] + 0.001             # just past the backoff: the next append tries again
        assert delays[:4] == [compaction.RETRY_FIRST_S, 2 * compaction.RETRY_FIRST_S, 4 * compaction.RETRY_FIRST_S, 8 * compaction.RETRY_FIRST_S]
        assert max(delays) == compaction.RETRY_MAX_S and delays[-1] == compaction.RETRY_MAX_S
        assert store.compactor.failures(sid) == 14
        assert sum(r.exc_info is not None for r in compaction_errors(caplog, sid)) == 1
        os.rmdir(sess.snap_path + ".tmp")
        store.purge(sid)
        assert store.compactor.failures(sid) == 0
    finally:
        store.close()
