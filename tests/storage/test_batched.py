"""Batched mode (``durability = "batched"``): an append is acknowledged once its journal line is
written, not synced; appends to loaded sessions take no worker thread (the flusher writes their
lines at once); every ``batch_ms`` the lines written meanwhile reach the shared WAL with one write
and one fdatasync, so a power loss after that loses nothing (the WAL replays what the journals
lost). The SIGKILL side is tests/storage/test_crash.py (``batched``, ``async-batched``)."""
from __future__ import annotations

import asyncio
import random
import shutil
import threading
import time
from pathlib import Path

import pytest

import storage.fsio
from storage import AsyncHistoryStore, HistoryStore, StorageConfig
from storage.wal import decode_records, wal_files
from storage_testlib import journal_path


def _count_datasyncs(monkeypatch) -> list[int]:
    real, calls = storage.fsio.datasync, []

    def sync(fd: int) -> None:
        calls.append(fd)
        real(fd)
    monkeypatch.setattr(storage.fsio, "datasync", sync)
    return calls


def test_appends_are_acknowledged_without_a_worker_thread_or_an_fsync_and_synced_together(root, monkeypatch) -> None:
    async def main() -> None:
        store = await AsyncHistoryStore.open(StorageConfig(root=str(root), durability="batched",
                                                           batch_ms=10_000, io_threads=1))
        try:
            sids = [(await store.create("u")).session_id for _ in range(20)]
            for sid in sids:
                await store.append(sid, "user", "opens the journal")    # through the worker thread
            await asyncio.to_thread(store.sync.flush)
            busy, free = threading.Event(), threading.Event()
            store._pool.submit(lambda: (busy.set(), free.wait(30)))     # the only worker is taken
            assert await asyncio.to_thread(busy.wait, 30)
            syncs = _count_datasyncs(monkeypatch)
            sizes = {sid: journal_path(root, sid).stat().st_size for sid in sids}
            msgs = await asyncio.wait_for(asyncio.gather(*(store.append(s, "user", f"to {s}") for s in sids)), 30)
            assert [m.id for m in msgs] == [2] * 20
            assert all(journal_path(root, s).stat().st_size > sizes[s] for s in sids)   # written ...
            assert syncs == []                                                       # ... not synced
            assert all(store.sync.cache.get(s).writer.dirty for s in sids)
            free.set()
            rounds = store.sync.flusher.fsyncs
            await asyncio.to_thread(store.sync.flush)                   # the periodic sync, now
            assert store.sync.flusher.fsyncs == rounds + 1 and len(syncs) == 1   # one for all 20
            assert not any(store.sync.cache.get(s).writer.dirty for s in sids)
            (_, wal), = wal_files(str(root))
            records, _ = decode_records(Path(wal).read_bytes())
            assert sorted((sid, seq) for sid, seq, _ in records) == sorted((s, q) for s in sids for q in (1, 2))
        finally:
            free.set()
            await store.close()
    asyncio.run(main())


def test_the_periodic_sync_runs_by_itself_every_batch_ms(root) -> None:
    with HistoryStore(StorageConfig(root=str(root), durability="batched", batch_ms=20)) as store:
        sid = store.create("u").session_id
        for i in range(30):
            store.append(sid, "user", f"m{i}")
        writer = store.cache.get(sid).writer
        deadline = time.monotonic() + 30
        while writer.dirty:
            assert time.monotonic() < deadline, "the batched appends were never synced"
            time.sleep(0.005)
        assert store.flusher.fsyncs >= 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_after_the_sync_a_power_loss_loses_nothing_acknowledged(root, tmp_path, seed) -> None:
    """The journals' unsynced bytes are thrown away (cut at random, as a power loss would) in a copy
    of the directory taken after the sync; the WAL gives every acknowledged message back."""
    rng = random.Random(seed)
    crashed = tmp_path / "crashed"

    async def main() -> dict[str, list[str]]:
        store = await AsyncHistoryStore.open(StorageConfig(root=str(root), durability="batched", batch_ms=10_000))
        try:
            sids = [(await store.create("u")).session_id for _ in range(4)]
            await asyncio.to_thread(store.sync.checkpoint)              # nothing left in any WAL file
            acked: dict[str, list[str]] = {sid: [] for sid in sids}
            for i in range(60):
                sid = rng.choice(sids)
                text = f"{sid} {i} " + "x" * rng.randint(0, 300)
                await store.append(sid, "user", text)
                acked[sid].append(text)
            await asyncio.to_thread(store.sync.flush)
            shutil.copytree(root, crashed)                              # the disk as a crash finds it
            return acked
        finally:
            await store.close()
    acked = asyncio.run(main())
    assert wal_files(str(crashed))
    for sid in acked:
        jp = journal_path(crashed, sid)
        data = jp.read_bytes()
        jp.write_bytes(data[:rng.randint(0, len(data))])
    with HistoryStore(StorageConfig(root=str(crashed))) as store:
        for sid, texts in acked.items():
            assert [m.content for m in store.messages(sid)] == texts


def test_a_purge_takes_the_pending_lines_out_of_the_wal_too(root) -> None:
    """The purge's checkpoint first syncs what is pending, so no WAL file keeps the purged text."""
    with HistoryStore(StorageConfig(root=str(root), durability="batched", batch_ms=10_000)) as store:
        sid = store.create("u").session_id
        keep = store.create("u").session_id
        store.append(keep, "user", "kept")
        store.append(sid, "user", "the code word is PELICAN")      # written, its WAL record pending
        store.purge(sid)
        store.flush()                                                # the next periodic sync, now
        assert not [p for _, p in wal_files(str(root)) if b"PELICAN" in Path(p).read_bytes()]
        assert not [p for p in root.rglob("*") if p.is_file() and b"PELICAN" in p.read_bytes()]
        assert [m.content for m in store.messages(keep)] == ["kept"]
