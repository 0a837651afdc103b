"""storage.pg.leases: the pool's connections kept between calls, on a real PostgreSQL: handed out
again without the pool, at most ``size`` out, waiters served first come first served, a connection
in doubt given back to the pool, a connection PostgreSQL closed replaced."""
from __future__ import annotations

import asyncio

import asyncpg
import pytest

from storage.pg.leases import Leases
from storage.pg.link import PooledConnection
from testkit.server import poll


@pytest.fixture
async def pool(pg_url):
    p = await asyncpg.create_pool(pg_url, min_size=0, max_size=2, connection_class=PooledConnection)
    try:
        yield p
    finally:
        await p.close()


async def test_a_connection_given_back_is_handed_out_again_without_the_pool(pool):
    leases = Leases(pool, 2)
    con = await leases.take(5)
    assert await con.fetchval("SELECT 1") == 1 and leases.out == 1
    await leases.put_back(con, clean=True)
    assert await leases.take(5) is con and leases.out == 1
    await leases.put_back(con, clean=True)
    await leases.close()
    assert leases.out == 0


async def test_at_most_size_out_and_waiters_served_in_order(pool):
    leases = Leases(pool, 2)
    a, b = await leases.take(5), await leases.take(5)
    first = asyncio.create_task(leases.take(5))
    await poll(lambda: leases.waiting == 1)
    second = asyncio.create_task(leases.take(5))
    await poll(lambda: leases.waiting == 2)
    assert not first.done() and not second.done() and leases.out == 2
    with pytest.raises(TimeoutError):           # a third waiter gives up after its timeout
        await leases.take(0.05)
    assert leases.waiting == 2
    await leases.put_back(b, clean=True)
    assert await first is b and not second.done()
    await leases.put_back(a, clean=True)
    assert await second is a and leases.out == 2
    await leases.put_back(a, clean=True)
    await leases.put_back(b, clean=True)
    await leases.close()


async def one_out_and_a_waiter(pool) -> tuple[Leases, asyncpg.Connection, asyncio.Task]:
    """Leases of size 1: its connection taken, and a second call waiting for it."""
    leases = Leases(pool, 1)
    con = await leases.take(5)
    waiter = asyncio.create_task(leases.take(5))
    await poll(lambda: leases.waiting == 1)
    return leases, con, waiter


async def test_a_connection_in_doubt_goes_back_to_the_pool_and_its_slot_to_a_waiter(pool):
    leases, con, waiter = await one_out_and_a_waiter(pool)
    tr = con.transaction()
    await tr.start()                            # left in a transaction: not given to the waiter
    await leases.put_back(con, clean=True)
    fresh = await waiter
    assert fresh is not con and leases.out == 1
    assert await fresh.fetchval("SELECT 2") == 2 and not fresh.is_in_transaction()
    await leases.put_back(fresh, clean=False)   # a call that failed midway: back to the pool too
    assert leases.out == 0
    await leases.close()


async def test_an_idle_connection_closed_by_postgresql_is_replaced(pool, pg_url):
    leases = Leases(pool, 1)
    con = await leases.take(5)
    pid = con.get_server_pid()
    await leases.put_back(con, clean=True)
    admin = await asyncpg.connect(pg_url)
    try:
        await admin.execute("SELECT pg_terminate_backend($1)", pid)
        await poll(lambda: _closed(con))        # asyncpg notices the closed socket by itself
    finally:
        await admin.close()
    again = await leases.take(5)
    assert again.get_server_pid() != pid and await again.fetchval("SELECT 3") == 3 and leases.out == 1
    await leases.put_back(again, clean=True)
    await leases.close()


async def test_a_waiter_cancelled_as_it_is_served_passes_the_connection_on(pool):
    leases, con, waiter = await one_out_and_a_waiter(pool)
    await leases.put_back(con, clean=True)      # handed to the waiter ...
    waiter.cancel()                             # ... which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await leases.take(5) is con and leases.out == 1
    await leases.put_back(con, clean=True)
    await leases.close()


def _closed(con) -> bool:
    try:
        return con.is_closed()
    except asyncpg.InterfaceError:              # released to the pool by asyncpg when it closed
        return True
