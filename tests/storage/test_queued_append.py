"""Appends applied on the event loop (AsyncHistoryStore on a loaded, idle session): no worker thread,
the journal line written by the flusher thread before the WAL record, lines in change order, and a
failed write acknowledged to nobody."""
from __future__ import annotations

import asyncio
import errno
import os

import orjson
import pytest

from storage import AsyncHistoryStore, ChatMessage, HistoryStore, StorageConfig, StorageIOError
from storage.wal import decode_records, wal_files
from storage_testlib import journal_path

_real_write = os.write


def test_appends_to_a_loaded_session_take_no_worker_thread_and_keep_change_order(root, monkeypatch) -> None:
    async def main() -> str:
        store = await AsyncHistoryStore.open(StorageConfig(root=str(root)))
        try:
            sid = (await store.create("u")).session_id
            await store.append(sid, "user", "opens the journal")       # through a worker thread
            jobs: list[str] = []
            submit = store._pool.submit
            monkeypatch.setattr(store._pool, "submit", lambda fn, *a, **k: (jobs.append(repr(fn)), submit(fn, *a, **k))[1])
            first = await store.append(sid, "assistant", "draft")
            await store.rename(sid, "renamed")                          # a direct write between queued ones
            both = await asyncio.gather(store.append(sid, "user", "a"), store.append(sid, "user", "b"))
            final = await store.update(sid, ChatMessage(first.id, "assistant", "final", first.timestamp, [], {}))
            assert [first.id, *(m.id for m in both), final.id] == [2, 3, 4, 2]
            assert len(jobs) == 1 and "rename" in jobs[0]               # only the rename took a thread
            return sid
        finally:
            await store.close()
    sid = asyncio.run(main())
    seqs = [orjson.loads(line)["seq"] for line in journal_path(root, sid).read_bytes().splitlines()]
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))
    with HistoryStore(StorageConfig(root=str(root))) as store:
        assert [(m.id, m.content) for m in store.messages(sid)] == [(1, "opens the journal"), (2, "final"),
                                                                    (3, "a"), (4, "b")]
        assert store.get(sid).title == "renamed"


@pytest.mark.parametrize("durability", ["fsync", "batched"])
def test_a_failed_queued_write_is_acknowledged_to_nobody_and_the_session_reloads(root, monkeypatch, durability) -> None:
    def write(fd: int, data) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".journal"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return _real_write(fd, data)

    async def main() -> str:
        store = await AsyncHistoryStore.open(StorageConfig(root=str(root), durability=durability))
        try:
            sid = (await store.create("u")).session_id
            await store.append(sid, "user", "kept")
            before = journal_path(root, sid).read_bytes()
            with monkeypatch.context() as m:
                m.setattr(os, "write", write)
                results = await asyncio.gather(store.append(sid, "assistant", "lost 1"),
                                               store.append(sid, "assistant", "lost 2"), return_exceptions=True)
            assert all(isinstance(r, StorageIOError) for r in results), results
            assert journal_path(root, sid).read_bytes() == before        # nothing half-written
            assert [m.content for m in await store.messages(sid)] == ["kept"]   # reloaded from disk
            assert (await store.append(sid, "assistant", "room again")).id == 2
            if durability == "batched":      # what was acknowledged before the failure is still synced
                await asyncio.to_thread(store.sync.flush)
                records = [r for _, p in wal_files(str(root)) for r in decode_records(open(p, "rb").read())[0]]
                assert sorted(seq for s, seq, _ in records if s == sid) == [1, 2]
            return sid
        finally:
            await store.close()
    sid = asyncio.run(main())
    with HistoryStore(StorageConfig(root=str(root))) as store:
        assert [(m.id, m.content) for m in store.messages(sid)] == [(1, "kept"), (2, "room again")]


def test_batched_mode_writes_the_line_before_the_call_returns(root) -> None:
    """Batched mode acknowledges before any fsync: the line is written before the call returns."""
    async def main() -> None:
        store = await AsyncHistoryStore.open(StorageConfig(root=str(root), durability="batched"))
        try:
            sid = (await store.create("u")).session_id
            await store.append(sid, "user", "one")
            size = journal_path(root, sid).stat().st_size
            await store.append(sid, "user", "two")
            assert journal_path(root, sid).stat().st_size > size
        finally:
            await store.close()
    asyncio.run(main())
