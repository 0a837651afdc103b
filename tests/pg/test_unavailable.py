"""PostgreSQL going away: calls fail with STORAGE_UNAVAILABLE, nothing unacknowledged is stored, a
connection killed mid-statement leaves nothing half-written, and the store recovers by itself."""
from __future__ import annotations

import asyncio

import asyncpg
import pytest

from pg.dbs import fresh_database
from protocol.codes import ErrorCode
from storage import StorageConfig, StorageUnavailable
from storage.port import open_store
from testkit.server import poll


async def test_stopped_postgres_gives_storage_unavailable_then_recovers(own_server):
    url = await fresh_database(own_server)
    store = await open_store(StorageConfig(url=url, pg_retry_attempts=2, pg_retry_backoff_ms=10,
                                           pg_connect_timeout_s=2))
    try:
        sid = (await store.create("alice")).session_id
        await store.append(sid, "user", "before")
        own_server.stop()
        for call in (store.append(sid, "user", "while down"), store.get(sid), store.list("alice"),
                     store.search("alice", "before")):
            with pytest.raises(StorageUnavailable) as err:
                await call
            assert err.value.code == ErrorCode.STORAGE_UNAVAILABLE
        own_server.start()

        async def back() -> bool:
            try:
                await store.get(sid)
                return True
            except StorageUnavailable:
                return False
        await poll(back, timeout=30)
        await store.append(sid, "user", "after")
        assert [(m.id, m.content) for m in await store.messages(sid)] == [(1, "before"), (2, "after")]
    finally:
        await store.close()


async def test_open_fails_clearly_when_postgres_is_unreachable(tmp_path):
    url = f"postgresql://postgres@/nplt?host={tmp_path}"          # no server on that socket
    with pytest.raises(StorageUnavailable, match="unavailable"):
        await open_store(StorageConfig(url=url, pg_retry_attempts=1, pg_retry_backoff_ms=10))


async def test_connection_killed_mid_append_leaves_nothing_half_written(pg_url):
    store = await open_store(StorageConfig(url=pg_url))
    blocker = await asyncpg.connect(pg_url)
    try:
        sid = (await store.create("alice")).session_id
        await store.append(sid, "user", "one")
        # An uncommitted row with the next id: the append's INSERT waits on it, after its UPDATE of
        # the session row (next_id, message_count, preview) already ran in the same statement.
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("INSERT INTO nplt_messages (session_id, id, body, search_text) "
                              "VALUES ($1, 2, '\\x7b7d'::bytea, '')", sid)
        task = asyncio.create_task(store.append(sid, "user", "two"))
        waiting = "SELECT pid FROM pg_stat_activity WHERE application_name = 'nplt-server' " \
                  "AND wait_event_type = 'Lock'"
        await poll(lambda: blocker.fetchval(waiting), timeout=30)
        assert await blocker.fetchval(f"SELECT pg_terminate_backend(({waiting}))")
        with pytest.raises(StorageUnavailable, match="not acknowledged"):
            await task
        await tx.rollback()
        rec = await store.get(sid)
        assert (rec.message_count, rec.preview) == (1, "one")
        assert [m.content for m in await store.messages(sid)] == ["one"]
        assert (await store.append(sid, "user", "two again")).id == 2
    finally:
        await blocker.close()
        await store.close()


async def test_statement_timeout_is_storage_unavailable(pg_url):
    store = await open_store(StorageConfig(url=pg_url, pg_statement_timeout_ms=200))
    blocker = await asyncpg.connect(pg_url)
    try:
        sid = (await store.create("alice")).session_id
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("SELECT 1 FROM nplt_sessions WHERE session_id = $1 FOR UPDATE", sid)
        with pytest.raises(StorageUnavailable, match="pg_statement_timeout_ms"):
            await store.rename(sid, "blocked")
        await tx.rollback()
        assert (await store.rename(sid, "free")).title == "free"
    finally:
        await blocker.close()
        await store.close()
