"""The session locks of a node's running turns outlive a broken connection (storage/pg/lock_holder.py):
taken back at once, on a holder line, whether they were held on a line or on a connection of their
own (``adopt``); one another node took meanwhile is not, and ``holds`` says so. And a watcher whose
own connection broke gives a node without a connection ``grace_s`` to come back."""
from __future__ import annotations

import asyncio

import asyncpg

from storage.pg.lock_holder import key_of
from testkit.server import poll

HOLDER_OF = """
SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a USING (pid)
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND a.datname = current_database()
  AND l.classid::bigint = ($1::bigint >> 32) & 4294967295 AND l.objid::bigint = $1::bigint & 4294967295"""


async def _holder_pid(probe: asyncpg.Connection, key: int) -> int | None:
    return await probe.fetchval(HOLDER_OF, key)


async def test_a_lock_held_on_a_connection_of_its_own_is_taken_back_on_a_line_when_it_breaks(make_holders, pg_url):
    _store, mine, other = await make_holders(pg_retry_backoff_ms=10)
    key = key_of("session", "contended")
    probe = await asyncpg.connect(pg_url)
    try:
        con = await mine.wait_lock(key)          # (uncontended here: granted at once)
        mine.adopt(key, con)
        own = await _holder_pid(probe, key)
        assert own == con.get_server_pid()
        assert await mine.holds(key) and not mine.was_retaken(key)
        assert await probe.fetchval("SELECT pg_terminate_backend($1)", own)

        async def on_a_line() -> bool:
            pid = await _holder_pid(probe, key)
            return pid is not None and pid != own
        await poll(on_a_line, 10, "the lock taken back")           # nothing asked for it: at once
        assert not await other.try_lock(key)
        assert await mine.holds(key) and mine.was_retaken(key) and key in mine.held
        await mine.let_go(key, con)
        assert await _holder_pid(probe, key) is None and not mine.held and not mine.was_retaken(key)
        assert await other.try_lock(key)
        await other.unlock(key)

        con = await mine.wait_lock(key)          # let go without a break: its connection closes
        mine.adopt(key, con)
        statements = mine.statements
        await mine.let_go(key, con)
        await poll(lambda: _free(probe, key), 10, "the lock let go")
        assert mine.statements == statements and not mine.held   # nothing to unlock on a line
    finally:
        await probe.close()


async def _free(probe: asyncpg.Connection, key: int) -> bool:
    return await _holder_pid(probe, key) is None


async def test_a_lock_another_node_took_meanwhile_is_not_taken_back(make_holders, pg_url):
    _store, mine, other = await make_holders(pg_retry_backoff_ms=10)
    key = key_of("session", "taken")
    probe = await asyncpg.connect(pg_url)
    waiting = None
    try:
        assert await mine.try_lock(key)
        held_by = await _holder_pid(probe, key)
        waiting = asyncio.create_task(other.wait_lock(key))       # another node's turn queued behind
        await poll(lambda: probe.fetchval(
            "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1 "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND classid::bigint = ($1::bigint >> 32) & 4294967295 "
            "AND objid::bigint = $1::bigint & 4294967295", key), 10, "queued")
        assert await probe.fetchval("SELECT pg_terminate_backend($1)", held_by)
        theirs = await asyncio.wait_for(waiting, 10)              # granted as the connection went

        async def lost() -> bool:                # (once this node has seen its connection close)
            return not await mine.holds(key)
        await poll(lost, 10, "the lock known lost")
        assert not await mine.holds(key) and key not in mine.held   # not ours any more, for good
        assert await _holder_pid(probe, key) == theirs.get_server_pid()
        statements = mine.statements
        await mine.unlock(key)                                     # the turn lets go: nothing to send
        assert mine.statements == statements
        await other.let_go(key, theirs)
    finally:
        if waiting is not None and waiting.done() and not waiting.cancelled() and waiting.exception() is None:
            waiting.result().terminate()
        await probe.close()


async def test_a_watcher_gives_a_node_without_a_connection_the_grace_it_is_given(make_holders):
    _store, _mine, other = await make_holders()
    name, key = "nplt-node:ghost", key_of("node", "ghost")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(other.wait_node_gone(key, name, 0.05), 10)       # no grace: at once
    assert loop.time() - started < 0.5
    started = loop.time()
    await asyncio.wait_for(other.wait_node_gone(key, name, 0.05, grace_s=0.8), 10)
    assert loop.time() - started >= 0.8
