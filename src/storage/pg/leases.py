"""Pooled connections kept between calls (``PgLink``): a call takes an idle connection and gives it
back without going through asyncpg's pool.

Taking a connection from asyncpg's pool and releasing it costs about 40 us of CPU a statement (a
queue, the holder's checks, a shielded task for the release, the reset), as much as the statement
itself, and a turn makes six. ``Leases`` keeps the connections it took from the pool (at most
``size``, the pool's own maximum, so the pool never runs out under it) and hands an idle one out at
once. A call that finds none idle takes a new one from the pool while fewer than ``size`` are out,
else waits, first come first served, for one to be given back. A connection that may not be in a
clean state (the call was cancelled mid-statement, its connection broke, a transaction is still
open) goes back to the pool instead (``drop``), which closes or resets it and replaces broken ones;
an idle connection that PostgreSQL closed meanwhile (a restart) is dropped when next taken (asyncpg
has already given its slot back to the pool then). Connections kept here stay open while the node runs (the
pool's closing of connections idle for 60 s does not apply to them): at most ``pg_pool_size``.
"""
from __future__ import annotations

import asyncio
from collections import deque

import asyncpg


class Leases:
    """The connections ``PgLink`` holds out of its asyncpg pool (see the module docstring)."""

    def __init__(self, pool: asyncpg.Pool, size: int) -> None:
        self.pool = pool
        self.size = size
        self.out = 0                                  # taken from the pool: idle here or in use
        self._idle: list[asyncpg.Connection] = []
        self._waiters: deque[asyncio.Future] = deque()   # result: a connection, or None for a free slot

    @property
    def waiting(self) -> int:
        """Calls waiting for a connection to come back."""
        return sum(not f.done() for f in self._waiters)

    async def take(self, timeout: float) -> asyncpg.Connection:
        """A connection for one call, within ``timeout`` seconds (TimeoutError otherwise)."""
        con = await self._idle_one()         # the usual case, without arming a timer
        if con is not None:
            return con
        async with asyncio.timeout(timeout):
            while True:
                con = await self._idle_one()
                if con is not None:
                    return con
                if self.out < self.size:
                    self.out += 1
                    try:
                        return await self.pool.acquire()
                    except BaseException:
                        self.out -= 1
                        self._pass_slot()
                        raise
                con = await self._wait()
                if con is not None:
                    return con                        # (None: a slot came free; take from the pool)

    async def _idle_one(self) -> asyncpg.Connection | None:
        """An idle connection still open, or None (closed ones met on the way are dropped)."""
        while self._idle:
            con = self._idle.pop()
            if not _closed(con):
                return con
            await self.drop(con)
        return None

    async def _wait(self) -> asyncpg.Connection | None:
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            return await fut
        except BaseException:
            if fut.done() and not fut.cancelled():    # handed over just as this call gave up: pass it on
                got = fut.result()
                if got is None:
                    self._pass_slot()
                else:
                    self.give(got)
            raise

    def give(self, con: asyncpg.Connection) -> None:
        """Back, clean, after a call: to the first waiter, else idle."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(con)
                return
        self._idle.append(con)

    async def drop(self, con: asyncpg.Connection) -> None:
        """Back to the pool (a connection in an unknown state, closed or broken: the pool resets,
        closes or replaces it); its slot goes to the first waiter."""
        self.out -= 1
        try:
            await self.pool.release(con)
        except (OSError, asyncpg.InterfaceError, asyncpg.PostgresError, asyncio.TimeoutError):
            pass                                       # (a connection that died while being released)
        finally:
            self._pass_slot()

    async def put_back(self, con: asyncpg.Connection, clean: bool) -> None:
        """After a call: ``give`` the connection if the call left it ``clean`` (ended normally, or
        with an error of PostgreSQL's own) and it is still open, with no transaction and no
        cancellation in progress; else ``drop`` it."""
        if clean and not _closed(con) and not con.is_in_transaction() and not _cancelling(con):
            self.give(con)
        else:
            await self.drop(con)

    def _pass_slot(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    async def close(self) -> None:
        """Give every idle connection back to the pool (before the pool closes); waiters get a
        closed-link error from their caller's retry loop."""
        idle, self._idle = self._idle, []
        for con in idle:
            await self.drop(con)
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(asyncpg.InterfaceError("the connection pool is closing"))


def _closed(con: asyncpg.Connection) -> bool:
    """Whether the connection is closed. (When a pooled connection closes, asyncpg hands its slot
    back to the pool at once and detaches the proxy: asking it anything then raises InterfaceError.
    ``drop`` of such a connection only gives its slot back here.)"""
    try:
        return con.is_closed()
    except asyncpg.InterfaceError:
        return True


def _cancelling(con: asyncpg.Connection) -> bool:
    """Whether a cancelled statement is still being cancelled on the connection (asyncpg's pool
    waits for that before it hands the connection out again; so does ``drop``)."""
    protocol = getattr(con, "_protocol", None)
    return bool(protocol is not None and protocol._is_cancelling())
