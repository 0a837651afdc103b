"""The storage-side pieces of running several nodes: LISTEN/NOTIFY between stores (a reconnecting
listener) and per-session advisory locks (arrival order, released by a dead connection)."""
from __future__ import annotations

import asyncio

import asyncpg
import pytest

from storage import InvalidArgument, StorageConfig
from storage.pg.locks import lock_key, session_lock
from storage.pg.notify import Listener, publish, publish_in
from storage.port import open_store
from testkit.server import poll


@pytest.fixture
async def two_nodes(pg_url):
    a = await open_store(StorageConfig(url=pg_url, pg_retry_backoff_ms=10))
    b = await open_store(StorageConfig(url=pg_url, pg_retry_backoff_ms=10))
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def test_events_reach_the_other_node_and_survive_a_reconnect(two_nodes, pg_url):
    a, b = two_nodes
    got: asyncio.Queue = asyncio.Queue()
    gaps = asyncio.Event()

    async def on_event(channel, payload):
        await got.put((channel, payload))
    listener = Listener(b.link, ["nplt_session_events"], on_event, on_gap=gaps.set)
    await listener.start()
    try:
        await publish(a.link, "nplt_session_events", {"session_id": "s_1", "turn": 3})
        assert await asyncio.wait_for(got.get(), 10) == ("nplt_session_events", {"session_id": "s_1", "turn": 3})

        async def in_tx(con):                     # only a committed transaction notifies
            async with con.transaction():
                await publish_in(con, "nplt_session_events", {"n": "rolled back"})
                raise asyncpg.RaiseError("abort")
        with pytest.raises(Exception):
            await a.link.run(in_tx, write=True)
        await publish(a.link, "nplt_session_events", {"n": "committed"})
        assert (await asyncio.wait_for(got.get(), 10))[1] == {"n": "committed"}

        for i in range(20):                       # handled one at a time, in order
            await publish(a.link, "nplt_session_events", {"seq": i})
        assert [(await asyncio.wait_for(got.get(), 10))[1]["seq"] for _ in range(20)] == list(range(20))

        with pytest.raises(InvalidArgument):
            await publish(a.link, "nplt_session_events", {"content": "x" * 8000})
        with pytest.raises(InvalidArgument):
            await publish(a.link, "bad channel; drop", {})

        admin = await asyncpg.connect(pg_url)
        try:
            await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE query LIKE 'LISTEN%'")
        finally:
            await admin.close()
        await asyncio.wait_for(gaps.wait(), 30)
        assert listener.connects == 2
        await publish(a.link, "nplt_session_events", {"n": "after reconnect"})
        assert (await asyncio.wait_for(got.get(), 10))[1] == {"n": "after reconnect"}
    finally:
        await listener.close()


async def _waiters(link, key: int) -> int:
    return await link.run(lambda con: con.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
        "AND ((classid::bigint << 32) | objid::bigint) = $1", key), write=False)


async def test_session_lock_serializes_in_arrival_order_across_nodes(two_nodes):
    a, b = two_nodes
    sid = (await a.create("alice")).session_id
    key = lock_key(sid)
    order: list[str] = []
    release = {name: asyncio.Event() for name in ("b1", "a2", "b3")}

    async def turn(store, name):
        async with session_lock(store.link, sid):
            order.append(name)
            await release[name].wait()

    async with session_lock(a.link, sid):
        tasks = []
        for i, (store, name) in enumerate(((b, "b1"), (a, "a2"), (b, "b3")), 1):
            tasks.append(asyncio.create_task(turn(store, name)))
            await poll(lambda i=i: _count_is(a.link, key, i), timeout=10)
        order.append("first")
    for name in ("b1", "a2", "b3"):
        await poll(lambda name=name: order[-1] == name, timeout=10)
        release[name].set()
    await asyncio.gather(*tasks)
    assert order == ["first", "b1", "a2", "b3"]


async def _count_is(link, key: int, n: int) -> bool:
    return await _waiters(link, key) == n


async def test_a_dead_holder_releases_the_lock(two_nodes, pg_url):
    a, b = two_nodes
    sid = (await a.create("alice")).session_id
    acquired = asyncio.Event()
    holder = asyncio.Event()

    async def dead_node():
        async with session_lock(a.link, sid) as pid:
            holder.pid = pid
            holder.set()
            await asyncio.Event().wait()          # "crashes" holding the lock
    dead = asyncio.create_task(dead_node())
    await asyncio.wait_for(holder.wait(), 10)

    async def other_node():
        async with session_lock(b.link, sid):
            acquired.set()
    waiter = asyncio.create_task(other_node())
    await poll(lambda: _count_is(a.link, lock_key(sid), 1), timeout=10)
    admin = await asyncpg.connect(pg_url)
    try:
        await admin.execute("SELECT pg_terminate_backend($1)", holder.pid)
    finally:
        await admin.close()
    await asyncio.wait_for(acquired.wait(), 10)
    await waiter
    dead.cancel()
    with pytest.raises(asyncio.CancelledError):
        await dead
