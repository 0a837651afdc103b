"""Long-term user memory on PostgreSQL (issues 17 and 18): ``DocUserMemoryStore`` over ``PgUserDocs``
on a real embedded PostgreSQL. Two stores on one database stand for two nodes: each keeps its own
cache, dropped through LISTEN/NOTIFY when the other writes, and a write never overwrites the
other's (compare and set on the row's version)."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import pytest

from pg.dbs import fresh_database
from protocol.codes import ErrorCode
from server.memory.user_memory import item_subject
from server.memory.user_store import DocUserMemoryStore, MemoryItem
from server.memory.user_store_pg import PgUserDocs
from storage import StorageUnavailable
from storage.config import StorageConfig
from storage.pg.link import PgLink
from testkit.server import poll


def item(n: int, text: str, session: str = "s1", message: int = 1) -> MemoryItem:
    return MemoryItem(f"m{n}", "fact", text, session, message, "2026-11-26T10:00:00+00:00")


@contextlib.asynccontextmanager
async def node_store(url: str, max_items: int = 200) -> AsyncIterator[DocUserMemoryStore]:
    link = PgLink(StorageConfig(url=url, pg_retry_backoff_ms=10))
    await link.open()
    store = DocUserMemoryStore(PgUserDocs(link), max_items=max_items)
    try:
        yield store
    finally:
        await store.close()
        await link.close()


async def test_the_store_semantics_hold_on_postgresql_and_survive_a_new_process(pg_url):
    async with node_store(pg_url, max_items=3) as s:
        first = item(1, "prod DB host is db-prod-42")
        assert await s.add("alice", [first], learned=("s1", 1)) == [first]
        assert await s.add("alice", [item(2, "Prod  DB host is db-prod-42", "s2", 3)]) == []   # known text
        assert await s.list("bob") == [] and await s.learned("alice", "s1") == 1
        for n in range(5):                                          # max_items: the oldest go first
            await s.add("alice", [item(10 + n, f"fact {n}", "s1", n)])
        assert [i.id for i in await s.list("alice")] == ["m12", "m13", "m14"]
        assert await s.forget("alice", "m13") and not await s.forget("alice", "nope")
        await s.mark_forgetting("alice", "s9")
    async with node_store(pg_url) as fresh:                         # what a restarted node reads
        assert [i.id for i in await fresh.list("alice")] == ["m12", "m14"]
        assert await fresh.add("alice", [item(20, "fact 3", "s1", 3)]) == []    # the tombstone holds
        assert await fresh.add("alice", [item(21, "fact 3", "s1", 8)]) != []    # said again, later
        assert await fresh.learned("alice", "s1") == 1
        doc = await fresh.backend.load("alice")
        assert doc[0].pending == []     # marked by a process that ended without finishing: done at load
        assert await fresh.forget_session("alice", "s1") == 3 and await fresh.list("alice") == []
    con = await asyncpg.connect(pg_url)
    try:
        assert await con.fetchval("SELECT count(*) FROM nplt_user_memory") == 1     # alice only
    finally:
        await con.close()


async def test_what_one_node_learns_or_forgets_reaches_the_other_nodes_cache(pg_url):
    async with node_store(pg_url) as a, node_store(pg_url) as b:
        assert await b.list("alice") == []                          # b caches alice's (empty) document
        await a.add("alice", [item(1, "the vault host is vault-7")])
        await poll(lambda: _cached_ids(b, "alice") is None, timeout=10)   # dropped by the notification
        assert [i.id for i in await b.list("alice")] == ["m1"]
        assert await b.forget("alice", "m1")
        await poll(lambda: _cached_ids(a, "alice") is None, timeout=10)
        assert await a.list("alice") == []
        assert await a.add("alice", [item(2, "the vault host is vault-7")]) == []  # b's tombstone, seen by a
        assert _cached_ids(a, "bob") is None                        # nothing cached for anyone else


async def test_corrections_and_edited_away_messages_hold_across_nodes(pg_url):
    async with node_store(pg_url) as a, node_store(pg_url) as b:
        await a.add("alice", [item(1, "The vault host is vault-7.", "s1", 1)], learned=("s1", 1), key=item_subject)
        await b.add("alice", [item(2, "The vault host is vault-8.", "s2", 4)], learned=("s2", 4), key=item_subject)
        assert [i.text for i in await b.list("alice")] == ["The vault host is vault-8."]    # a's item replaced
        # node b edits message 4 of s2 away while node a is still learning from message 6 of it
        assert await b.forget_messages("alice", "s2", [4, 6]) == 1
        assert await a.add("alice", [item(3, "Our region is eu-3.", "s2", 6)], learned=("s2", 6)) == []
        await poll(lambda: _cached_ids(b, "alice") is None, timeout=10)
        # the correction was edited away: the fact it replaced, still said in s1, comes back
        assert [i.text for i in await b.list("alice")] == ["The vault host is vault-7."]
    async with node_store(pg_url) as fresh:                          # what a restarted node reads
        assert [i.text for i in await fresh.list("alice")] == ["The vault host is vault-7."]
        assert await fresh.add("alice", [item(4, "Our region is eu-3.", "s2", 6)]) == []   # the tombstone holds


async def test_concurrent_writes_from_two_nodes_lose_nothing(pg_url):
    async with node_store(pg_url) as a, node_store(pg_url) as b:
        await a.list("alice")
        await b.list("alice")                                       # both caches hold version "none"

        async def write(store: DocUserMemoryStore, base: int) -> None:
            for n in range(10):
                await store.add("alice", [item(base + n, f"fact {base + n}")])
        await asyncio.gather(write(a, 0), write(b, 100), write(a, 200), write(b, 300))
        want = {f"m{base + n}" for base in (0, 100, 200, 300) for n in range(10)}
        async with node_store(pg_url) as fresh:
            assert {i.id for i in await fresh.list("alice")} == want    # every add kept, none overwritten
        for node in (a, b):     # each cache holds the last write, or the other node's notification dropped it
            await poll(lambda: _cached_ids(node, "alice") in (None, want), timeout=10)
            assert {i.id for i in await node.list("alice")} == want


async def test_a_node_that_loses_every_compare_and_set_still_gets_its_update_in(pg_url):
    async with node_store(pg_url) as a, node_store(pg_url) as b:
        await a.add("alice", [item(0, "fact 0")])
        save, lost = a.backend.save, []

        async def overtaken(user_id, doc, version):       # node b writes between each read and save of a
            lost.append(version)
            await b.add("alice", [item(100 + len(lost), f"fact {100 + len(lost)}")])
            return await save(user_id, doc, version)
        a.backend.save = overtaken
        for n in range(1, 4):
            assert [i.id for i in await a.add("alice", [item(n, f"fact {n}")])] == [f"m{n}"]
        assert len(lost) == 3                   # one lost compare and set each, then the locked update
        want = {"m0", "m1", "m2", "m3", "m101", "m102", "m103"}
        assert {i.id for i in await a.list("alice")} == want
        await poll(lambda: _cached_ids(b, "alice") in (None, want), timeout=10)
        assert {i.id for i in await b.list("alice")} == want


async def test_a_listener_reconnect_drops_every_cached_user(pg_url):
    async with node_store(pg_url) as a:
        await a.add("alice", [item(1, "x is 1")])
        await a.list("bob")
        assert _cached_ids(a, "alice") == {"m1"}
        listener = a.backend._listener
        connects = listener.connects
        con = await asyncpg.connect(pg_url)
        try:       # PostgreSQL ends the listener's connection: notifications may be missed meanwhile
            await con.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE pid <> pg_backend_pid() AND query ILIKE 'LISTEN%'")
        finally:
            await con.close()
        await poll(lambda: listener.connects > connects and _cached_ids(a, "alice") is None, timeout=10)
        assert _cached_ids(a, "bob") is None
        assert [i.id for i in await a.list("alice")] == ["m1"]


def _cached_ids(store: DocUserMemoryStore, user: str) -> set[str] | None:
    got = store._cache.get(user)
    return None if got is None else {i.id for i in got[0].items}


async def test_postgresql_down_is_storage_unavailable_and_the_store_recovers(own_server):
    url = await fresh_database(own_server)
    link = PgLink(StorageConfig(url=url, pg_retry_attempts=2, pg_retry_backoff_ms=10, pg_connect_timeout_s=2))
    await link.open()
    store = DocUserMemoryStore(PgUserDocs(link))
    try:
        await store.add("alice", [item(1, "the vault host is vault-7")])
        own_server.stop()
        for call in (store.list("bob"), store.add("alice", [item(2, "the db host is db-1")])):
            with pytest.raises(StorageUnavailable) as err:      # bob: not cached; alice's add: a write
                await call
            assert err.value.code == ErrorCode.STORAGE_UNAVAILABLE
        own_server.start()

        async def back() -> bool:
            try:
                await store.list("bob")
                return True
            except StorageUnavailable:
                return False
        await poll(back, timeout=30)
        assert await store.add("alice", [item(2, "the db host is db-1")]) != []   # nothing half-written before
        assert [i.id for i in await store.list("alice")] == ["m1", "m2"]
    finally:
        await store.close()
        await link.close()
