"""Child process of test_crash.py: append to one session forever, printing each acknowledged id.

Usage: crash_child.py ROOT SESSION_ID MODE [CHECKPOINT_S]   (MODE: fsync | batched | compact | group | wal)
- fsync:   durable appends, compact_threshold 16 (background compactions happen often)
- batched: batched fsync every 2 ms (a SIGKILL must not lose acknowledged appends either)
- compact: durable appends, and a synchronous compaction right after every acknowledgement,
           so a kill that follows an ack usually lands inside the compaction
- group:   SESSION_ID is a comma-separated list; one writer thread per session appends durably
           (so appends of several sessions share flush rounds) and prints "<session id> <id>"
- wal:     as group, without compaction, with the shared WAL checkpointed every CHECKPOINT_S seconds
- async:   as group, through AsyncHistoryStore on one event loop: appends to loaded sessions are
           applied on the loop and their journal lines written by the flusher thread (queued)
- async-batched: as async, in batched mode (the flusher writes each queued line before the
           append returns; the WAL is fdatasynced every 2 ms)
An id is printed only after append() returned. The parent kills this process with SIGKILL.
"""
from __future__ import annotations

import asyncio
import sys
import threading

from storage import AsyncHistoryStore, HistoryStore, StorageConfig


def main() -> None:
    root, sid, mode = sys.argv[1:4]
    if mode == "group":
        return group(root, sid.split(","), StorageConfig(root=root, compact_threshold=64))
    if mode == "async":
        return asyncio.run(group_async(root, sid.split(","), StorageConfig(root=root, compact_threshold=32)))
    if mode == "async-batched":
        return asyncio.run(group_async(root, sid.split(","), StorageConfig(root=root, compact_threshold=32,
                                                                           durability="batched", batch_ms=2)))
    if mode == "wal":
        return group(root, sid.split(","), StorageConfig(root=root, compact_threshold=10_000_000,
                                                         wal_checkpoint_s=float(sys.argv[4])))
    cfg = StorageConfig(root=root, compact_threshold=16 if mode != "compact" else 1_000_000,
                        durability="batched" if mode == "batched" else "fsync", batch_ms=2)
    store = HistoryStore(cfg)
    i = 0
    while True:
        m = store.append(sid, "user" if i % 2 == 0 else "assistant", f"{mode} {i} " + "x" * (i * 37 % 900),
                         metadata={"i": i})
        sys.stdout.write(f"{m.id}\n")
        sys.stdout.flush()
        if mode == "compact":
            store.compact(sid)
        i += 1


def group(root: str, sids: list[str], cfg: StorageConfig) -> None:
    store = HistoryStore(cfg)
    out = threading.Lock()

    def writer(sid: str) -> None:
        i = 0
        while True:
            m = store.append(sid, "user" if i % 2 == 0 else "assistant", f"group {sid} {i} " + "g" * (i * 53 % 700))
            with out:
                sys.stdout.write(f"{sid} {m.id}\n")
                sys.stdout.flush()
            i += 1

    threads = [threading.Thread(target=writer, args=(sid,), daemon=True) for sid in sids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


async def group_async(root: str, sids: list[str], cfg: StorageConfig) -> None:
    store = AsyncHistoryStore(HistoryStore(cfg))

    async def writer(sid: str) -> None:
        i = 0
        while True:
            m = await store.append(sid, "user" if i % 2 == 0 else "assistant", f"async {sid} {i} " + "a" * (i * 41 % 600))
            sys.stdout.write(f"{sid} {m.id}\n")
            sys.stdout.flush()
            i += 1

    await asyncio.gather(*(writer(sid) for sid in sids))


if __name__ == "__main__":
    main()

