"""What a turn costs in PostgreSQL statements (issue 17, item 4: the PostgreSQL backend's turns/s):
counted in PostgreSQL's own statement log, so a change that adds round trips to the turn's path
fails here. Also the combined reads that save round trips: ``nplt_try_claim`` (the session lock
and the last message, migration 0005), ``nplt_claim_owned`` (the same, only for the user's live
session, with its model and title: migration 0008) and ``record_and_messages``."""
from __future__ import annotations

import asyncio
import dataclasses
import re

import asyncpg
import pytest

from pg.dbs import fresh_database
from server.app import Server
from storage import StorageConfig
from storage.errors import NotFound
from storage.pg.lock_holder import Claim, LockHolder, key_of
from storage.port import open_store
from testkit.echo_agent import EchoAgent
from testkit.server import V3Client, answer_text, make_config, poll
from protocol import MsgType as T

#: statements of one turn on a node alone on its database (docs/cluster.md): ownership + lock + last
#: message (one call), the user message with the memory layer's read (one statement), the answer and
#: the unlock (the
#: session-list events reuse what the appends returned; the memory layer takes the stored answer
#: from the turn, no read after it; no event notification: no peer)
STATEMENTS_PER_TURN = 4


async def test_a_turn_takes_4_statements(tmp_path, own_server):
    url = await fresh_database(own_server)
    database = url.split("@/", 1)[1].split("?", 1)[0]
    admin = await asyncpg.connect(own_server.url())
    await admin.execute(f"ALTER DATABASE \"{database}\" SET log_statement = 'all'")   # new connections
    # one pool connection: asyncpg introspects the array types of a statement once per connection
    # (a "WITH RECURSIVE typeinfo_tree" query), so a turn that happened to run on a connection the
    # warm-up did not use counted 3 statements more (seen once in a full run, stop 26)
    srv = Server(make_config(tmp_path, storage={"url": url, "pg_pool_size": 1}), agent=EchoAgent(chunks=8))
    host, port = await srv.start()
    log = own_server.dir / "postgres.log"
    try:
        c = await V3Client.connect((host, port))
        r = await c.call(T.CHAT_TEXT, text="warm up")        # the first turn creates and titles it
        await c.turn_events(r["turn_id"])
        await poll(lambda: not srv.runner.lanes, timeout=30)
        await poll(lambda: not srv.runner.background, timeout=30)   # the warm-up's after-turn memory read
        await srv.services.memory.wait_idle()                        # ... and what it started: not counted
        start = log.stat().st_size
        r = await c.call(T.CHAT_TEXT, text="counted")
        assert answer_text(await c.turn_events(r["turn_id"])) == "echo: counted"

        def statements() -> list[str]:
            with open(log, "rb") as f:
                f.seek(start)
                text = f.read().decode(errors="replace")
            return re.findall(r"LOG:  (?:statement|execute [^:]*): (.*)", text)
        # the unlock is the turn's last statement on its path; the session-list reads and the last
        # notification follow in the background
        await poll(lambda: sum("nplt_lock_ops" in s for s in statements()) == 2, timeout=30)
        await poll(lambda: not srv.runner.lanes, timeout=30)
        seen = statements()
        assert sum("nplt_lock_ops" in s for s in seen) == 2             # the claim, the release
        assert not any("RESET ALL" in s or "pg_notify" in s or s.startswith(("BEGIN", "COMMIT"))
                       for s in seen), seen
        await srv.services.memory.wait_idle()                        # (nothing more comes after it)
        seen = statements()
        assert len(seen) == STATEMENTS_PER_TURN, "\n".join(seen)
        assert srv.services.cluster.relay.sent == 0 and not srv.services.cluster.relay.peers
        await c.close()
    finally:
        await srv.stop()
        await admin.execute(f"ALTER DATABASE \"{database}\" RESET log_statement")
        await admin.close()


@pytest.fixture
async def holders(make_holders):
    """A store and the lock holders of two nodes on it."""
    return await make_holders()


async def test_try_claim_takes_a_free_lock_and_reads_the_last_message(holders):
    store, mine, other = holders
    sid = (await store.create("alice")).session_id
    key = key_of("session", sid)
    assert await mine.try_claim(key, sid) == (True, None)              # an empty session
    assert await other.try_claim(key, sid) == (False, None)            # held elsewhere
    assert await mine.try_claim(key, sid) == (False, None)             # never taken twice
    await store.append(sid, "user", "question")
    await mine.unlock(key)
    got, last = await other.try_claim(key, sid)
    assert got and last is not None and last[0] == 1 and b"question" in last[1]
    await other.unlock(key)
    await store.clear(sid)                                             # hidden: not the last one
    assert await mine.try_claim(key, sid) == (True, None)
    await mine.unlock(key)
    gone = "s_20260101_000000000000"
    assert await mine.try_claim(key_of("session", gone), gone) == (True, None)   # no such session


async def test_claim_owned_checks_the_session_in_the_same_round_trip_and_locks_nothing_else(holders):
    store, mine, other = holders
    sid = (await store.create("alice")).session_id
    await store.set_model(sid, "m-2")
    key = key_of("session", sid)
    assert await mine.claim_owned(key, sid, "alice") == Claim(True, None, "m-2", "New chat")
    assert await other.claim_owned(key, sid, "alice") == Claim(False, None, "m-2", "New chat")
    assert await mine.claim_owned(key, sid, "alice") is None           # held here: nothing asked
    await store.append(sid, "user", "question")
    await store.rename(sid, "Named")
    await mine.unlock(key)
    claim = await other.claim_owned(key, sid, "alice")
    assert claim is not None and claim.got and claim.title == "Named"
    assert claim.last is not None and claim.last[0] == 1 and b"question" in claim.last[1]
    await other.unlock(key)
    deleted = (await store.create("alice")).session_id
    await store.delete(deleted)
    gone = "s_20260101_000000000000"
    for s, user in ((sid, "bob"), (deleted, "alice"), (gone, "alice")):
        k = key_of("session", s)
        with pytest.raises(NotFound):
            await mine.claim_owned(k, s, user)
        assert k not in mine.held
        assert await other.try_lock(k)                                # nothing was locked by mine
        await other.unlock(k)


async def test_record_and_messages_is_get_and_messages(pg_url):
    store = await open_store(StorageConfig(url=pg_url))
    try:
        sid = (await store.create("alice", title="t")).session_id
        stored = [await store.append(sid, "user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(6)]
        for after in (0, 2, 4, 99):
            rec, msgs = await store.record_and_messages(sid, after)
            assert rec == await store.get(sid)
            assert msgs == await store.messages(sid, after_id=after)
        # with a memo, a message stored unchanged since the last read is the very same object, and
        # so is one of the last 4 this store appended to the session (what append returned)
        memo: dict = {}
        _, first = await store.record_and_messages(sid, 0, memo)
        assert [m is x for m, x in zip(first, stored)] == [False, False, True, True, True, True]
        assert first == stored
        changed = await store.update(sid, dataclasses.replace(first[1], content="m1, edited"))
        _, again = await store.record_and_messages(sid, 0, memo)
        assert again == await store.messages(sid) and again[1] == changed
        assert [a is b for a, b in zip(first, again)] == [True, False, True, True, True, True]
        assert set(memo) == {1, 2, 3, 4, 5, 6}
        await store.clear(sid)
        await store.append(sid, "user", "after the clear")
        rec, msgs = await store.record_and_messages(sid, 0)
        assert [m.content for m in msgs] == ["after the clear"] and rec.message_count == 1
    finally:
        await store.close()


async def test_an_append_that_reads_answers_the_next_read_as_the_database_would(pg_url):
    """``append(read_after=X)`` reads in its own statement what ``record_and_messages(X)`` would
    return after it; the next such call takes it (no round trip), once, and only for that X, fresh,
    with no other write of this node in between."""
    store = await open_store(StorageConfig(url=pg_url))
    other = await open_store(StorageConfig(url=pg_url))          # a second node: always reads
    try:
        sid = (await store.create("alice", title="t")).session_id
        for i in range(4):
            await store.append(sid, "user" if i % 2 == 0 else "assistant", f"m{i}")
        memo: dict = {}
        _, before = await store.record_and_messages(sid, 1, memo)
        for after in (1, 0, 3, 4, 99):
            new = await store.append(sid, "user", f"q{after}", read_after=after)
            assert store._prefetched, "the append kept what it read"
            rec, msgs = await store.record_and_messages(sid, after, memo)
            assert not store._prefetched
            assert (rec, msgs) == await other.record_and_messages(sid, after)
            assert rec.message_count == new.id and (not msgs or msgs[-1] is new)   # the object append returned
            if after == 1:                  # unchanged since the memo's read: the same objects
                assert len(msgs) == 4 and all(m is b for m, b in zip(msgs, before))
        assert msgs == []
        await store.clear(sid)                                       # hidden messages are not read
        new = await store.append(sid, "user", "after the clear", read_after=0)
        rec, msgs = await store.record_and_messages(sid, 0)
        assert msgs == [new] and rec.message_count == 1 and (rec, msgs) == await other.record_and_messages(sid, 0)
        # not taken: another after_id, another write of this node in between, too old
        await store.append(sid, "assistant", "a", read_after=0)
        assert await store.record_and_messages(sid, 1) == await other.record_and_messages(sid, 1)
        assert not store._prefetched
        await store.append(sid, "user", "b", read_after=0)
        await store.rename(sid, "renamed")
        rec, _ = await store.record_and_messages(sid, 0)
        assert rec.title == "renamed"
        await store.append(sid, "user", "c", read_after=0)
        when, *rest = store._prefetched[sid]
        store._prefetched[sid] = (when - 60, *rest)
        await other.rename(sid, "renamed elsewhere")                  # (what a read now sees)
        assert (await store.record_and_messages(sid, 0))[0].title == "renamed elsewhere"
        with pytest.raises(NotFound):
            await store.append("s_20260101_000000000000", "user", "x", read_after=0)
    finally:
        await store.close()
        await other.close()


async def test_nodes_know_each_other_once_started(tmp_path, pg_url):
    from cluster.conftest import node
    async with node(tmp_path, pg_url, "a") as a:
        ra = a.services.cluster.relay
        assert not ra.peers
        async with node(tmp_path, pg_url, "b") as b:
            rb = b.services.cluster.relay
            assert rb.peers == {a.services.cluster.node_id}      # from the database, at start
            assert ra.peers == {b.services.cluster.node_id}      # from its hello, answered before b serves
        await poll(lambda: not ra.peers, timeout=30)              # b said goodbye


async def test_get_loaded_is_what_the_last_append_returned_once(pg_url):
    store = await open_store(StorageConfig(url=pg_url))
    try:
        sid = (await store.create("alice", title="t")).session_id
        assert store.get_loaded(sid) is None                      # nothing appended yet
        await store.append(sid, "user", "hello")
        rec = store.get_loaded(sid)
        full = await store.get(sid)
        assert (rec.title, rec.updated_at, rec.message_count, rec.preview) == \
            (full.title, full.updated_at, full.message_count, full.preview) == (full.title, full.updated_at, 1, "hello")
        assert store.get_loaded(sid) is None                      # once
        await store.append(sid, "assistant", "hi")
        await store.rename(sid, "renamed")                        # another write: the record is stale
        assert store.get_loaded(sid) is None
        await store.append(sid, "user", "again")
        await store.clear(sid)
        assert store.get_loaded(sid) is None
    finally:
        await store.close()


async def _lock_pids(admin: asyncpg.Connection, keys: list[int]) -> dict[int, int]:
    """key -> pid of the backend holding advisory lock ``key`` (pg_locks splits a bigint key in two)."""
    rows = await admin.fetch("SELECT pid, ((classid::bigint << 32) | objid::bigint) AS k FROM pg_locks "
                             "WHERE locktype = 'advisory' AND granted AND objsubid = 1")
    return {r["k"]: r["pid"] for r in rows if r["k"] in keys}


async def test_session_locks_spread_over_the_lock_connections_and_one_lost_connection_takes_its_own_back(pg_url):
    store = await open_store(StorageConfig(url=pg_url, pg_lock_connections=3, pg_retry_backoff_ms=10))
    mine = LockHolder(store.link, key_of("node", "spread"), "nplt-node:spread")
    other = LockHolder(store.link, key_of("node", "rival"), "nplt-node:rival")
    admin = await asyncpg.connect(pg_url)
    try:
        await mine.open()
        await other.open()
        keys = [key_of("session", f"s{i}") for i in range(12)]
        for k in keys:
            assert await mine.try_lock(k)
        assert mine.held == set(keys)
        held_by = await _lock_pids(admin, [mine.node_key, *keys])
        assert len(held_by) == 13
        lines = {held_by[k] for k in keys}
        assert len(lines) == 3                                          # three connections hold them
        node_pid = held_by[mine.node_key]
        assert node_pid in lines                                        # the first line: node lock too
        for k in keys:                                                  # each key: always the same line
            assert held_by[k] == held_by[next(j for j in keys if j % 3 == k % 3)]

        lost = next(p for p in lines if p != node_pid)                  # end one other line's backend
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", lost)
        gone = [k for k in keys if held_by[k] == lost]

        async def taken_back() -> bool:          # at once, on a new connection, with nothing claimed
            pids = await _lock_pids(admin, gone)
            return set(pids) == set(gone) and len(set(pids.values())) == 1 and lost not in pids.values()
        await poll(taken_back, timeout=10)
        for k in keys:                                                  # none is free for another node
            assert not await other.try_lock(k)
        assert mine.held == set(keys) and mine.retaken == set(gone)
        for k in keys:
            assert await mine.holds(k)
        assert (await _lock_pids(admin, [mine.node_key]))[mine.node_key] == node_pid   # untouched
        assert len(set((await _lock_pids(admin, keys)).values())) == 3
        for k in keys:
            await mine.unlock(k)
        assert not mine.held and not mine.retaken and not await _lock_pids(admin, keys)
    finally:
        await admin.close()
        await mine.close()
        await other.close()
        await store.close()


async def test_a_busy_lock_connection_does_not_hold_up_the_sessions_of_the_others(pg_url):
    store = await open_store(StorageConfig(url=pg_url, pg_lock_connections=2))
    mine = LockHolder(store.link, key_of("node", "busy"), "nplt-node:busy")
    try:
        await mine.open()
        even = next(k for k in (key_of("session", f"e{i}") for i in range(50)) if k % 2 == 0)
        odd = next(k for k in (key_of("session", f"o{i}") for i in range(50)) if k % 2 == 1)
        twin = even - 2 if even > 0 else even + 2                       # the same line as even
        async with mine._line(even).mutex:                              # a statement in progress there
            same = asyncio.ensure_future(mine.try_lock(twin))
            assert await asyncio.wait_for(mine.try_lock(odd), 10)       # the other line answers
            assert not same.done()                                      # the same line waits its turn
        assert await asyncio.wait_for(same, 10)
        assert await mine.try_lock(even)
        assert {even, odd, twin} == mine.held
    finally:
        await mine.close()
        await store.close()
