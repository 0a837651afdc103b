"""A PostgreSQL that stops answering (SIGSTOP of the postmaster and its backends: what a network black
hole looks like to the client; the sockets stay open, nothing comes back): a call on an open
connection ends STORAGE_UNAVAILABLE within ``pg_statement_timeout_ms`` + ``STATEMENT_TIMEOUT_MARGIN_S``
instead of hanging, its connection is dropped, and a turn waiting for a session lock does not wait
forever either. The store recovers once PostgreSQL answers again."""
from __future__ import annotations

import asyncio
import contextlib
import time

import psutil
import pytest

from pg.dbs import fresh_database
from protocol.codes import ErrorCode
from storage import StorageConfig, StorageUnavailable
from storage.pg import link as pg_link
from storage.pg.lock_holder import LockHolder, key_of
from storage.port import open_store
from testkit.server import poll

STATEMENT_MS = 1000
MARGIN_S = 1.0
BOUND_S = STATEMENT_MS / 1000 + MARGIN_S
SLACK_S = 4.0          # a loaded test machine
GUARD_S = 20.0         # the old code never answered: the test fails at this guard instead of hanging


@contextlib.contextmanager
def frozen(server):
    """SIGSTOP the postmaster and every backend; SIGCONT them whatever happens."""
    procs = server.processes()
    assert procs, "the server is not running"
    stopped = []
    try:
        for p in procs:
            try:
                p.suspend()
                stopped.append(p)
            except psutil.NoSuchProcess:
                pass
        yield
    finally:
        for p in stopped:
            try:
                p.resume()
            except psutil.NoSuchProcess:
                pass


def config(url: str) -> StorageConfig:
    return StorageConfig(url=url, pg_statement_timeout_ms=STATEMENT_MS, pg_retry_attempts=1,
                         pg_retry_backoff_ms=50, pg_connect_timeout_s=1.0)


@pytest.fixture
def small_margin(monkeypatch):
    monkeypatch.setattr(pg_link, "STATEMENT_TIMEOUT_MARGIN_S", MARGIN_S)


async def timed(aw, guard: float = GUARD_S) -> tuple[BaseException | None, float]:
    """(the exception ``aw`` raised, or None; seconds it took), failing if it takes ``guard`` s."""
    t0 = time.monotonic()
    try:
        await asyncio.wait_for(aw, guard)
    except asyncio.TimeoutError:
        pytest.fail(f"no answer within {guard} s: the call hangs on a PostgreSQL that does not answer")
    except Exception as exc:
        return exc, time.monotonic() - t0
    return None, time.monotonic() - t0


async def test_calls_on_open_connections_end_storage_unavailable_within_the_bound(own_server, small_margin):
    url = await fresh_database(own_server)
    store = await open_store(config(url))
    try:
        assert store.link.call_timeout == BOUND_S
        sid = (await store.create("alice")).session_id
        await store.append(sid, "user", "before")
        await asyncio.gather(*(store.get(sid) for _ in range(3)))     # several pooled connections, idle
        idle = list(store.link.leases._idle)
        assert len(idle) >= 2
        used = [proxy._con for proxy in idle[-2:]]      # (the two calls below take these: last in, first out)
        with frozen(own_server):
            # a read and a write, each on an open pooled connection: sent, never answered
            (read_err, read_s), (write_err, write_s) = await asyncio.gather(
                timed(store.list("alice")), timed(store.append(sid, "user", "while frozen")))
            for err, took in ((read_err, read_s), (write_err, write_s)):
                assert isinstance(err, StorageUnavailable), err
                assert err.code == ErrorCode.STORAGE_UNAVAILABLE
                assert "did not answer" in str(err) and "pg_statement_timeout_ms" in str(err)
                assert BOUND_S - 0.2 <= took <= BOUND_S + SLACK_S, took
            assert "not acknowledged" in str(write_err)
            assert all(con.is_closed() for con in used)                 # dropped, not back in the pool
            assert not any(proxy in store.link.leases._idle for proxy in idle[-2:])
            # the readiness probe answers too (its connection dropped, not left cancelling)
            err, took = await timed(store.check_ready())
            assert isinstance(err, StorageUnavailable) and took <= BOUND_S + SLACK_S
        # PostgreSQL answers again: the store recovers by itself

        async def back() -> bool:
            try:
                await store.get(sid)
                return True
            except StorageUnavailable:
                return False
        await poll(back, timeout=30)
        await store.append(sid, "user", "after")
        contents = [m.content for m in await store.messages(sid)]
        assert contents[0] == "before" and contents[-1] == "after"
    finally:
        await store.close()


async def test_lock_lines_and_lock_waits_do_not_hang_on_a_frozen_postgres(own_server, small_margin):
    url = await fresh_database(own_server)
    store = await open_store(config(url))
    mine = LockHolder(store.link, key_of("node", "mine"), "nplt-node:mine")
    other = LockHolder(store.link, key_of("node", "other"), "nplt-node:other")
    waiting = None
    try:
        await mine.open()
        await other.open()
        mine.wait_check_s = 0.2
        busy, free = key_of("session", "busy"), key_of("session", "free")
        assert await other.try_lock(busy)
        assert await mine.try_lock(free)        # the line of ``free`` is connected
        await mine.unlock(free)
        waiting = asyncio.create_task(mine.wait_lock(busy))
        probe = await store.link.pool.acquire()
        try:
            await poll(lambda: probe.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                              "AND NOT granted"), timeout=10, what="the wait is queued")
        finally:
            await store.link.pool.release(probe)
        with frozen(own_server):
            # a claim on a holder line: sent, never answered
            err, took = await timed(mine.try_lock(free))
            assert isinstance(err, StorageUnavailable) and "did not answer" in str(err), err
            assert took <= BOUND_S + SLACK_S, took
            # the turn waiting for its session's lock: its connection is found unanswered and dropped,
            # and queuing again fails under the retry policy
            err, took = await timed(waiting)
            assert isinstance(err, StorageUnavailable), err
            assert err.code == ErrorCode.STORAGE_UNAVAILABLE
            assert took <= mine.wait_check_s + BOUND_S + 2 * (1.0 + SLACK_S), took
        assert mine.lock_waiters == 0
    finally:
        if waiting is not None and not waiting.done():
            waiting.cancel()
            with contextlib.suppress(BaseException):
                await waiting
        await mine.close()
        await other.close()
        await store.close()


async def test_the_bound_is_per_call_unless_the_work_says_progress(pg_url, monkeypatch):
    """A call of short statements gets the bound in all; a work of several long statements (a
    document's rows) starts it again before each with ``progress()``."""
    monkeypatch.setattr(pg_link, "STATEMENT_TIMEOUT_MARGIN_S", 0.3)
    store = await open_store(StorageConfig(url=pg_url, pg_statement_timeout_ms=1200))
    try:
        assert store.link.call_timeout == pytest.approx(1.5)

        async def two_long(con, *, say_progress: bool):
            for _ in range(2):
                if say_progress:
                    pg_link.progress()
                await con.execute("SELECT pg_sleep(0.8)")      # each within the statement timeout (1.2 s), two not within 1.5 s
            return "done"
        assert await store.link.run(lambda con: two_long(con, say_progress=True), write=False) == "done"
        with pytest.raises(StorageUnavailable, match="did not answer"):
            await store.link.run(lambda con: two_long(con, say_progress=False), write=False)
        assert await store.link.run(lambda con: con.fetchval("SELECT 1"), write=False) == 1   # the pool is fine
    finally:
        await store.close()
