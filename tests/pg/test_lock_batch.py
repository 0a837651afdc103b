"""Claims and releases of session locks that wait for the same holder connection go in one
statement (``LockHolder._drain``, ``nplt_lock_ops``, migration 0011), and each caller still gets
exactly what it would have got alone, in the order asked."""
from __future__ import annotations

import asyncio

import asyncpg
import pytest

from storage.errors import NotFound
from storage.pg.lock_holder import Claim, key_of
from testkit.server import poll


@pytest.fixture
async def nodes(make_holders):
    """A store and the lock holders of two nodes on it, each with one holder connection."""
    return await make_holders(pg_lock_connections=1)


async def test_claims_waiting_together_go_in_one_statement(nodes):
    store, mine, other = nodes
    sids = [(await store.create("alice")).session_id for _ in range(8)]
    await store.append(sids[3], "user", "question")
    bobs = (await store.create("bob")).session_id
    async with mine._line(0).mutex:                     # a statement in progress on the line
        asks = [asyncio.ensure_future(mine.claim_owned(key_of("session", s), s, "alice")) for s in sids + [bobs]]
        await poll(lambda: len(mine._line(0).ops) == 9, timeout=10)
    got = await asyncio.gather(*asks, return_exceptions=True)
    assert mine.statements == 1
    assert isinstance(got[8], NotFound)                 # bob's session: refused alone, nothing locked
    assert all(isinstance(c, Claim) and c.got for c in got[:8])
    assert got[3].last is not None and got[3].last[0] == 1 and got[0].last is None
    assert mine.held == {key_of("session", s) for s in sids}
    for s in sids:                                      # really held: another node is refused
        assert (await other.claim_owned(key_of("session", s), s, "alice")).got is False
    assert (await other.claim_owned(key_of("session", bobs), bobs, "bob")).got is True

    async with mine._line(0).mutex:                     # the releases, together too
        before = mine.statements
        frees = [asyncio.ensure_future(mine.unlock(key_of("session", s))) for s in sids]
        await poll(lambda: len(mine._line(0).ops) == 8, timeout=10)
    await asyncio.gather(*frees)
    assert mine.statements == before + 1 and not mine.held
    for s in sids:
        assert (await other.claim_owned(key_of("session", s), s, "alice")).got is True


async def test_a_release_and_a_claim_of_one_key_keep_their_order(nodes):
    store, mine, other = nodes
    sid = (await store.create("alice")).session_id
    key = key_of("session", sid)
    assert (await mine.claim_owned(key, sid, "alice")).got
    async with mine._line(0).mutex:
        before = mine.statements
        release = asyncio.ensure_future(mine.unlock(key))
        again = asyncio.ensure_future(mine.claim_owned(key, sid, "alice"))
        await poll(lambda: len(mine._line(0).ops) == 2, timeout=10)
    await release
    assert (await again).got is True                    # released first, then taken again
    assert mine.statements == before + 2 and mine.held == {key}
    assert (await other.claim_owned(key, sid, "alice")).got is False
    assert await mine.claim_owned(key, sid, "alice") is None            # held here: nothing asked


async def test_a_claim_withdrawn_before_it_is_sent_is_not_made(nodes):
    store, mine, other = nodes
    sid = (await store.create("alice")).session_id
    key = key_of("session", sid)
    async with mine._line(0).mutex:
        ask = asyncio.ensure_future(mine.claim_owned(key, sid, "alice"))
        await poll(lambda: len(mine._line(0).ops) == 1, timeout=10)
        ask.cancel()
    with pytest.raises(asyncio.CancelledError):
        await ask
    await poll(lambda: not mine._line(0).draining, timeout=10)
    assert not mine.held and mine.statements == 0
    assert (await other.claim_owned(key, sid, "alice")).got is True


async def test_a_claim_withdrawn_while_it_is_taken_is_let_go(nodes, pg_url):
    """The claim's statement is held up in PostgreSQL (the sessions table locked by another
    transaction) and its caller gives up meanwhile: the lock it got is released, not kept."""
    store, mine, other = nodes
    sid = (await store.create("alice")).session_id
    key = key_of("session", sid)
    blocker = await asyncpg.connect(pg_url)
    watcher = await asyncpg.connect(pg_url)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE nplt_sessions IN ACCESS EXCLUSIVE MODE")
        ask = asyncio.ensure_future(mine.claim_owned(key, sid, "alice"))

        async def waiting() -> bool:            # the claim's statement waits for the table
            return bool(await watcher.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT * FROM nplt_lock_ops%' "
                "AND wait_event_type = 'Lock'"))
        await poll(waiting, timeout=10)
        ask.cancel()
        with pytest.raises(asyncio.CancelledError):
            await ask
        await tx.rollback()
    finally:
        await blocker.close()
        await watcher.close()
    await poll(lambda: not mine._line(0).draining, timeout=10)
    assert not mine.held and mine.statements == 2       # taken, then let go
    assert (await other.claim_owned(key, sid, "alice")).got is True
