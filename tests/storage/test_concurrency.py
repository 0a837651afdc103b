"""Concurrent appends from threads and asyncio tasks, LRU and idle eviction, the async facade."""
from __future__ import annotations

import asyncio
import random
import threading
import time

from storage import AsyncHistoryStore, HistoryStore, StorageConfig


def check_acks(store: HistoryStore, sid: str, acks: list[tuple[int, str]]) -> None:
    msgs = store.messages(sid)
    assert [m.id for m in msgs] == list(range(1, len(msgs) + 1))
    by_id = {m.id: m.content for m in msgs}
    assert len(acks) == len(msgs)
    for mid, content in acks:
        assert by_id[mid] == content


def test_threads_append_to_one_session(open_store) -> None:
    store = open_store(compact_threshold=25)               # background compactions interleave
    sid = store.create("u").session_id
    workers, per = 8, 40
    acks: dict[int, list[tuple[int, str]]] = {t: [] for t in range(workers)}
    start = threading.Barrier(workers)

    def work(t: int) -> None:
        start.wait()
        for i in range(per):
            m = store.append(sid, "user", f"t{t}-{i}")
            acks[t].append((m.id, m.content))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(workers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    everything = [a for t in acks for a in acks[t]]
    check_acks(store, sid, everything)
    for t in acks:                                          # each thread's messages in its own order
        assert [c for _, c in sorted(acks[t])] == [f"t{t}-{i}" for i in range(per)]
    store.close()
    store = open_store()
    check_acks(store, sid, everything)


def test_threads_across_sessions_with_eviction_and_compaction(open_store) -> None:
    store = open_store(lru_size=2, compact_threshold=7)
    sids = [store.create("u").session_id for _ in range(6)]
    acks: dict[str, list[tuple[int, str]]] = {s: [] for s in sids}
    lock = threading.Lock()

    def work(t: int) -> None:
        rng = random.Random(t)
        for i in range(30):
            sid = rng.choice(sids)
            m = store.append(sid, "assistant", f"w{t}-{i}")
            with lock:
                acks[sid].append((m.id, m.content))
            if i % 10 == 0:
                store.page(sid, limit=5)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    deadline = time.monotonic() + 10                       # busy sessions are evicted later by
    while store.loaded_count() > 2 and time.monotonic() < deadline:   # the maintenance thread
        time.sleep(0.01)
    assert store.loaded_count() <= 2
    for sid in sids:
        check_acks(store, sid, acks[sid])
    store.close()
    store = open_store(lru_size=2)
    for sid in sids:
        check_acks(store, sid, acks[sid])
    assert store.loaded_count() <= 2


async def test_asyncio_tasks_append_to_one_session(root) -> None:
    store = await AsyncHistoryStore.open(StorageConfig(root=str(root), compact_threshold=30, io_threads=6))
    try:
        sid = (await store.create("u", "async")).session_id
        acks: list[tuple[int, str]] = []

        async def task(t: int) -> None:
            for i in range(5):
                m = await store.append(sid, "user", f"a{t}-{i}")
                acks.append((m.id, m.content))

        await asyncio.gather(*(task(t) for t in range(40)))
        check_acks(store.sync, sid, acks)
        for t in range(40):
            mine = [c for _, c in sorted(a for a in acks if a[1].startswith(f"a{t}-"))]
            assert mine == [f"a{t}-{i}" for i in range(5)]
        page = await store.page(sid, limit=10)
        assert [m.id for m in page.messages] == list(range(191, 201)) and page.total == 200
        hits = await store.search("u", "a7-3")
        assert (hits[0].message_id, hits[0].score) == (dict(map(reversed, acks))["a7-3"], 1.5)
        assert all(h.score < 1.5 for h in hits[1:])
        assert '"schema_version"' in await store.export(sid, "json")
        assert (await store.rename(sid, "renamed")).title == "renamed"
        assert (await store.list("u"))[0][0].title == "renamed"
        assert await store.clear(sid) == 200 and await store.messages(sid) == []
    finally:
        await store.close()
    reopened = HistoryStore(StorageConfig(root=str(root)))
    try:
        assert reopened.get(sid).title == "renamed" and reopened.page(sid).total == 0
    finally:
        reopened.close()


def test_lru_eviction_and_reload(open_store) -> None:
    store = open_store(lru_size=2)
    sids = [store.create("u", f"s{i}").session_id for i in range(5)]
    for sid in sids:
        for i in range(3):
            store.append(sid, "user", f"{sid}-{i}")
        assert store.loaded_count() <= 2
    for sid in sids:
        assert [m.content for m in store.page(sid).messages] == [f"{sid}-{i}" for i in range(3)]
        assert store.append(sid, "user", "more").id == 4
        assert store.loaded_count() <= 2
    assert [r.message_count for r in store.list("u")[0]] == [4] * 5


def test_idle_eviction(open_store) -> None:
    store = open_store(idle_evict_s=60)
    sid = store.create("u").session_id
    store.append(sid, "user", "x")
    assert store.loaded_count() == 1
    assert store.evict_idle() == 0
    assert store.evict_idle(now=time.monotonic() + 61) == 1
    assert store.loaded_count() == 0
    assert store.append(sid, "user", "y").id == 2
    assert store.loaded_count() == 1
