"""Group commit: appends waiting at the same moment share one flush round (one fdatasync of the
shared WAL), an append is acknowledged only after that fsync, and the worker threads of AsyncHistoryStore are not held while
an append waits for its fsync."""
from __future__ import annotations

import asyncio
import errno
import os
import threading

import pytest

import storage.flusher
import storage.fsio
from storage import AsyncHistoryStore, StorageConfig, StorageIOError
from storage_testlib import wait_for


def _gate_fsync(monkeypatch) -> tuple[threading.Event, threading.Event, list[int]]:
    """The first fsync blocks until ``release`` is set (``entered`` tells it started); all fsyncs are
    recorded, in order, with their fd."""
    real = storage.fsio.datasync
    entered, release, calls = threading.Event(), threading.Event(), []

    def sync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            entered.set()
            assert release.wait(30)
        real(fd)
    monkeypatch.setattr(storage.fsio, "datasync", sync)
    return entered, release, calls


def test_appends_waiting_together_share_one_flush_round(open_store, monkeypatch) -> None:
    store = open_store()
    sids = [store.create("u", f"s{i}").session_id for i in range(9)]
    for sid in sids:                                         # journals exist: no first-write dir fsync
        store.append(sid, "user", "warm")
    entered, release, calls = _gate_fsync(monkeypatch)
    rounds0 = store.flusher.batches
    acked: list[str] = []
    first = threading.Thread(target=lambda: acked.append(store.append(sids[0], "user", "first").content))
    first.start()
    assert entered.wait(30)                                  # round 1 is inside its fsync
    others = [threading.Thread(target=lambda s=s: acked.append(store.append(s, "user", "later").content))
              for s in sids[1:]]
    for t in others:
        t.start()
    wait_for(lambda: store.flusher.queued() == 8)           # 8 appends written, waiting for round 2
    assert acked == []                                       # nobody acknowledged before its fsync
    release.set()
    for t in [first, *others]:
        t.join(30)
    assert sorted(acked) == ["first"] + ["later"] * 8
    assert store.flusher.batches - rounds0 == 2              # 9 appends, 2 flush rounds
    assert len(calls) == 2 and len(set(calls)) == 1          # one WAL fdatasync per round, not per journal


def test_appends_to_one_journal_share_one_fsync(open_store, monkeypatch) -> None:
    store = open_store()
    sid, other = store.create("u").session_id, store.create("u").session_id
    store.append(sid, "user", "warm")
    store.append(other, "user", "warm")
    entered, release, calls = _gate_fsync(monkeypatch)
    blocker = threading.Thread(target=store.append, args=(other, "user", "hold the flusher"))
    blocker.start()
    assert entered.wait(30)

    async def main() -> list[int]:
        astore = AsyncHistoryStore(store)
        try:
            tasks = [asyncio.ensure_future(astore.append(sid, "user", f"m{i}")) for i in range(10)]
            await asyncio.to_thread(wait_for, lambda: store.flusher.queued() == 10)
            release.set()
            return [m.id for m in await asyncio.gather(*tasks)]
        finally:
            astore._pool.shutdown(wait=True)

    ids = asyncio.run(main())
    blocker.join(30)
    assert sorted(ids) == list(range(2, 12))
    assert len(calls) == 2                 # the blocker's fsync, then one fsync for all ten appends
    assert [m.id for m in store.messages(sid)] == list(range(1, 12))


def test_async_appends_do_not_hold_worker_threads(root, monkeypatch) -> None:
    """With io_threads=2, 20 appends can wait for the same fsync at once."""
    async def main() -> None:
        store = await AsyncHistoryStore.open(StorageConfig(root=str(root), io_threads=2))
        try:
            sids = [(await store.create("u")).session_id for _ in range(20)]
            for sid in sids:
                await store.append(sid, "user", "warm")
            entered, release, _ = _gate_fsync(monkeypatch)
            tasks = [asyncio.ensure_future(store.append(sids[0], "user", "first"))]
            await asyncio.to_thread(entered.wait, 30)
            tasks += [asyncio.ensure_future(store.append(s, "user", "m")) for s in sids[1:]]
            await asyncio.to_thread(wait_for, lambda: store.sync.flusher.queued() == 19)
            release.set()
            assert [m.id for m in await asyncio.gather(*tasks)] == [2] * 20
        finally:
            await store.close()
    asyncio.run(main())


def test_eviction_leaves_a_session_whose_commit_waits_for_its_round(open_store, monkeypatch) -> None:
    """Eviction does not fsync (or close) a journal under a waiting commit; it evicts it afterwards."""
    store = open_store(lru_size=1)
    a = store.create("u", "a").session_id
    b = store.create("u", "b").session_id                    # (created first: a create waits for a round too)
    store.append(a, "user", "warm")
    entered, release, calls = _gate_fsync(monkeypatch)
    t = threading.Thread(target=store.append, args=(a, "user", "waiting"))
    t.start()
    assert entered.wait(30)                                  # a's commit is inside its round's fsync
    store.get(b)                                             # loads b, over lru_size: a would be the victim
    assert store.cache.get(a) is not None                    # ... but its commit is not durable yet
    assert len(calls) == 1                                   # and eviction did not fsync it itself
    release.set()
    t.join(30)
    wait_for(lambda: store.cache.get(a) is None)            # the maintenance thread trims again
    assert store.cache.get(b) is not None
    assert [m.content for m in store.messages(a)] == ["warm", "waiting"]


def test_creates_waiting_together_share_one_directory_fsync(open_store, root, monkeypatch) -> None:
    """A create is acknowledged once its snapshot and the directory are fsynced; the creates waiting
    at the same moment share one directory fsync, and none is visible before it."""
    store = open_store()
    real = storage.flusher.fsync_dir
    entered, release, dir_syncs = threading.Event(), threading.Event(), []

    def fsync_dir(path: str) -> None:
        dir_syncs.append(path)
        if len(dir_syncs) == 1:
            entered.set()
            assert release.wait(30)
        real(path)
    monkeypatch.setattr(storage.flusher, "fsync_dir", fsync_dir)
    made: list[str] = []
    first = threading.Thread(target=lambda: made.append(store.create("u", "first").session_id))
    first.start()
    assert entered.wait(30)                                  # round 1 is inside its directory fsync
    others = [threading.Thread(target=lambda i=i: made.append(store.create("u", f"s{i}").session_id))
              for i in range(9)]
    for t in others:
        t.start()
    wait_for(lambda: store.flusher.files_queued() == 9)
    assert made == [] and store.list("u")[0] == []           # nothing acknowledged or listed yet
    release.set()
    for t in [first, *others]:
        t.join(30)
    assert len(made) == 10 and len(dir_syncs) == 2           # 10 creates, 2 directory fsyncs
    assert len(store.list("u")[0]) == 10
    assert not list(root.glob("*.tmp"))


def test_a_failed_fsync_on_create_leaves_no_session(open_store, root, monkeypatch) -> None:
    store = open_store()
    with monkeypatch.context() as m:
        def fail(path: str) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        m.setattr(storage.flusher, "fsync_dir", fail)
        with pytest.raises(StorageIOError):
            store.create("u", "never created")
    assert store.list("u")[0] == []
    assert not list(root.glob("session_*"))                  # snapshot, temp file and journal removed
    sid = store.create("u", "created").session_id
    store.close()
    assert open_store().get(sid).title == "created"


def test_async_results_reach_the_loop_and_a_cancelled_call_that_has_not_started_never_runs(root) -> None:
    async def main() -> None:
        store = await AsyncHistoryStore.open(StorageConfig(root=str(root), io_threads=1))
        try:
            sid = (await store.create("u")).session_id
            entered, release = threading.Event(), threading.Event()

            def hold() -> None:
                entered.set()
                assert release.wait(30)
            busy = asyncio.ensure_future(store._run(hold))            # the only worker thread is taken
            await asyncio.to_thread(entered.wait, 30)
            queued = asyncio.ensure_future(store.append(sid, "user", "never"))
            await asyncio.sleep(0)          # one loop iteration: its first step (queued before ours) submits the job
            queued.cancel()
            await asyncio.gather(queued, return_exceptions=True)   # its cancellation reached the job
            release.set()
            await busy
            msgs = await asyncio.gather(*(store.append(sid, "user", f"m{i}") for i in range(50)))
            assert [m.content for m in await store.messages(sid)] == [f"m{i}" for i in range(50)]
            assert sorted(m.id for m in msgs) == list(range(1, 51))
            assert queued.cancelled()
        finally:
            await store.close()
    asyncio.run(main())
