"""A node's liveness lock (storage/pg/lock_holder.py): taken again as soon as its connection breaks
(not when a session on that holder connection is next claimed), and a peer's ``wait_node_gone``
returns only once the node has no live connection left, not merely because its lock is free."""
from __future__ import annotations

import asyncio

import asyncpg

from storage.pg.lock_holder import key_of, node_connected
from testkit.server import poll

NODE_LOCK_HOLDER = """
SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a USING (pid)
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND a.application_name = $1
  AND l.classid::bigint = ($2::bigint >> 32) & 4294967295 AND l.objid::bigint = $2::bigint & 4294967295"""


async def _holder_pid(con: asyncpg.Connection, name: str) -> int | None:
    return await con.fetchval(NODE_LOCK_HOLDER, f"nplt-node:{name}", key_of("node", name))


async def test_the_node_lock_is_taken_again_as_soon_as_its_connection_breaks(make_holders, pg_url):
    _store, mine, _other = await make_holders(pg_retry_backoff_ms=10)
    probe = await asyncpg.connect(pg_url)
    try:
        first = await _holder_pid(probe, "mine")
        assert first is not None
        for _ in range(2):          # twice: the connection that took it again is kept as well
            held = await _holder_pid(probe, "mine")
            await probe.execute("SELECT pg_terminate_backend($1)", held)
            # nothing is claimed on the node meanwhile: the lock comes back by itself
            await poll(lambda: _taken_again(probe, held), 10, "the node lock taken again")
        assert mine.node_locks == 3
    finally:
        await probe.close()


async def _taken_again(probe: asyncpg.Connection, old_pid: int) -> bool:
    pid = await _holder_pid(probe, "mine")
    return pid is not None and pid != old_pid


async def _backend_waits_for_a_lock(probe: asyncpg.Connection, pid: int) -> bool:
    return bool(await probe.fetchval("SELECT cardinality(pg_blocking_pids($1)) > 0", pid))


async def test_a_node_counts_as_connected_until_only_stale_lock_waits_are_left(pg_url):
    name, key = "nplt-node:ghost", key_of("node", "ghost")
    probe = await asyncpg.connect(pg_url)
    ghosts: list[asyncpg.Connection] = []

    async def ghost() -> asyncpg.Connection:
        con = await asyncpg.connect(pg_url, server_settings={"application_name": name})
        ghosts.append(con)
        return con
    try:
        assert not await node_connected(probe, key, name)                 # no connection at all
        idle = await ghost()
        assert await node_connected(probe, key, name)                     # alive, even without its lock
        await idle.close()
        assert not await node_connected(probe, key, name)

        # a backend blocked on a session lock does not notice its client died: it does not count
        await probe.execute("SELECT pg_advisory_lock(42)")
        stale = await ghost()
        waiting = asyncio.create_task(stale.execute("SELECT pg_advisory_lock(42)"))
        await poll(lambda: _backend_waits_for_a_lock(probe, stale.get_server_pid()), 10, "blocked")
        assert not await node_connected(probe, key, name)

        # one waiting for the node's own liveness lock does: the node is taking it again
        await probe.execute("SELECT pg_advisory_lock($1)", key)
        retaking = await ghost()
        taking = asyncio.create_task(retaking.execute("SELECT pg_advisory_lock($1)", key))
        await poll(lambda: _backend_waits_for_a_lock(probe, retaking.get_server_pid()), 10, "blocked")
        assert await node_connected(probe, key, name)
        await probe.execute("SELECT pg_advisory_unlock_all()")
        await asyncio.wait_for(asyncio.gather(waiting, taking), 10)
    finally:
        for con in ghosts:
            con.terminate()
        await probe.close()


async def test_wait_node_gone_waits_while_the_node_has_a_connection_without_its_lock(make_holders, pg_url):
    _store, _mine, other = await make_holders()
    name, key = "nplt-node:ghost", key_of("node", "ghost")
    ghost = await asyncpg.connect(pg_url, server_settings={"application_name": name})
    probe = await asyncpg.connect(pg_url)
    watch = asyncio.create_task(other.wait_node_gone(key, name, 0.05))
    try:
        # the watcher had the free lock, saw the node still connected, and let the lock go again
        await poll(lambda: probe.fetchval(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name = 'nplt-node:other' "
            "AND state = 'idle' AND query LIKE '%pg_advisory_unlock%'"), 10, "the watcher checking")
        assert not watch.done()
        ghost.terminate()
        await asyncio.wait_for(watch, 10)
    finally:
        watch.cancel()
        ghost.terminate()
        await probe.close()
