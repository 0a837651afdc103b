"""A node's connections for contended session locks are capped (``max_waiters``: QUEUE_FULL past
it, not PostgreSQL's TooManyConnections for everyone), and a node refuses to start on a database a
newer release migrated."""
from __future__ import annotations

import asyncio
import contextlib

import asyncpg
import pytest

from protocol.codes import ErrorCode
from storage import StorageConfig
from storage.pg.lock_holder import MAX_LOCK_WAITERS, LockWaitersFull, key_of
from storage.pg.schema import SchemaTooNew, migrations
from storage.port import open_store
from testkit.server import poll


async def _waiting_backends(url: str, app: str) -> int:
    con = await asyncpg.connect(url)
    try:
        return await con.fetchval("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 "
                                  "AND wait_event_type = 'Lock'", app)
    finally:
        await con.close()


async def test_lock_waiter_connections_are_capped_queue_full(make_holders, pg_url):
    store, mine, other = await make_holders(pg_retry_backoff_ms=10)
    assert mine.max_waiters == MAX_LOCK_WAITERS          # no pg_max_lock_waiters in the config: the default
    mine.max_waiters = 2
    keys = [key_of("session", f"s{i}") for i in range(3)]
    for k in keys:
        assert await other.try_lock(k)
    tasks = [asyncio.create_task(mine.wait_lock(k)) for k in keys[:2]]
    granted = None
    try:
        await poll(lambda: _count_is(pg_url, "nplt-node:mine", 2), timeout=10, what="two waits queued")
        assert mine.lock_waiters == 2
        with pytest.raises(LockWaitersFull) as refused:
            await asyncio.wait_for(mine.wait_lock(keys[2]), 10)
        assert refused.value.code == ErrorCode.QUEUE_FULL
        assert "pg_max_lock_waiters" in refused.value.message
        assert await _waiting_backends(pg_url, "nplt-node:mine") == 2      # not three
        # one wait granted and its turn over (its connection closed): room for one more
        await other.unlock(keys[0])
        granted = await asyncio.wait_for(tasks[0], 10)
        assert mine.lock_waiters == 2                    # a granted lock keeps its connection while the turn runs
        with pytest.raises(LockWaitersFull):
            await asyncio.wait_for(mine.wait_lock(keys[2]), 10)
        granted.terminate()
        assert mine.lock_waiters == 1
        third = asyncio.create_task(mine.wait_lock(keys[2]))
        tasks.append(third)
        await poll(lambda: _count_is(pg_url, "nplt-node:mine", 2), timeout=10, what="the third wait queued")
        assert mine.lock_waiters == 2
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
            with contextlib.suppress(BaseException):
                con = await t
                con.terminate()


async def _count_is(url: str, app: str, n: int) -> bool:
    return await _waiting_backends(url, app) == n


async def test_a_database_migrated_by_a_newer_release_is_refused(pg_url):
    store = await open_store(StorageConfig(url=pg_url))
    await store.close()
    known = migrations()[-1].version
    con = await asyncpg.connect(pg_url)
    try:
        await con.execute("INSERT INTO nplt_schema_version (version, name) VALUES ($1, $2)",
                          known + 1, f"{known + 1:04d}_from_the_future.sql")
        with pytest.raises(SchemaTooNew) as refused:
            await asyncio.wait_for(open_store(StorageConfig(url=pg_url, pg_retry_backoff_ms=10)), 30)
        text = str(refused.value)
        assert f"schema version {known + 1}" in text and f"up to {known}" in text and "upgrade this node" in text
        # nothing applied, and the migration lock was let go (the next start does not wait for it)
        assert await con.fetchval("SELECT max(version) FROM nplt_schema_version") == known + 1
        assert await con.fetchval("SELECT pg_try_advisory_lock($1)", 0x6E706C74_00000001)
        await con.execute("SELECT pg_advisory_unlock_all()")
        await con.execute("DELETE FROM nplt_schema_version WHERE version = $1", known + 1)
    finally:
        await con.close()
    again = await open_store(StorageConfig(url=pg_url))       # the same release starts
    await again.close()
