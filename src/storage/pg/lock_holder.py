"""Advisory locks for many sessions on few connections: what several server nodes need to run one
turn per session at a time (issue 17).

``LockHolder`` keeps a few dedicated connections (``pg_lock_connections``, its lines): the first holds
the node's liveness lock for its whole life, and each holds, taken with ``pg_try_advisory_lock``, the
locks of the sessions whose keys fall on it and whose turns run uncontended on this node: no
connection per running turn. A line runs one statement at a time, so the claims and releases of
sessions on different lines do not queue behind each other, and those that wait while one runs go
together in its next statement (``nplt_lock_ops``, migration 0011). A contended session is waited for
on a connection of its own (``wait_lock``), queued by PostgreSQL in arrival order; closing that
connection releases it. A node that dies loses its connections, so PostgreSQL releases all its locks
at once, and ``wait_node_gone`` (a peer waiting on the dead node's liveness lock) returns once no
connection of that node is left: its lock is also free, for a moment, while a live node reconnects.

When a line's connection breaks (a PostgreSQL restart, say), the locks it held are gone with it: the
line is opened again and its locks taken back at once (``_keep_locks``, one attempt every
``pg_retry_backoff_ms``; not when the line is next used), the liveness lock and the session locks of
the turns still running, so a peer cannot take them; so are the locks of running turns held on
connections of their own (``adopt``). A session lock another node took meanwhile is not taken back:
``holds`` then says so, and ``was_retaken`` tells a lock that was taken back (another node may have
taken it and let it go meanwhile). A claim waiting on a connection of its own whose connection
breaks connects and queues again (``wait_lock``), under the retry policy.

Bounds. The holder lines' statements are bounded client-side like the pool's calls
(``PgLink.call_timeout``, asyncpg's ``command_timeout``): past it the line's connection is dropped and
the claim or release fails with StorageUnavailable. Lock waits are not bounded (a turn may take
minutes), but every ``WAIT_CHECK_S`` while some wait, the backends of the waiting connections
(``wait_lock``, ``wait_node_gone``) are looked up through the pool: a wait whose backend is gone, or
all of them when PostgreSQL does not answer that within the bound, has its connection dropped, and
queues again under the retry policy (then StorageUnavailable), instead of waiting forever on a server
that is frozen or cut off. A node opens at most ``max_waiters`` connections for contended session
locks (``wait_lock``; waiting, or held by the turn they were granted to): past it a turn that would
need one more is refused with ``LockWaitersFull`` (QUEUE_FULL), so that queued turns cannot use up
PostgreSQL's ``max_connections``.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from dataclasses import dataclass
from collections.abc import Awaitable, Callable, Iterator
from typing import NamedTuple, TypeVar

import asyncpg

from protocol import ErrorCode

from ..errors import NotFound, StorageClosed, StorageError
from .link import CONNECTION_ERRORS, PgLink, Unsent, is_connection_error

T = TypeVar("T")

log = logging.getLogger("storage")

#: The most connections a node opens for contended session locks (``wait_lock``: one per turn waiting
#: for its session, kept by that turn once granted) when the storage config has no
#: ``pg_max_lock_waiters``; past it a turn is refused QUEUE_FULL (``LockWaitersFull``). 16: a node then
#: opens at most pg_pool_size + pg_lock_connections + 3 (listeners) + 16 + one per peer watched: 34 with
#: the defaults and two nodes, 68 for both, within PostgreSQL's default max_connections (100).
MAX_LOCK_WAITERS = 16
#: Seconds between two checks of the connections waiting for a lock (module docstring, "Bounds").
WAIT_CHECK_S = 10.0


class LockWaitersFull(StorageError):
    """This node already has ``max_waiters`` connections waiting for (or holding) contended session
    locks: the turn is refused rather than opening one more PostgreSQL connection."""

    code = ErrorCode.QUEUE_FULL


def _settle(op: _Op, value: Claim | None) -> None:
    if not op.done.done():
        op.done.set_result(value)


NODE_CONNECTED_SQL = """
SELECT EXISTS (SELECT 1 FROM pg_stat_activity a
               WHERE a.application_name = $1 AND a.pid <> pg_backend_pid()
                 AND (cardinality(pg_blocking_pids(a.pid)) = 0
                      OR EXISTS (SELECT 1 FROM pg_locks l
                                 WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.objsubid = 1
                                   AND l.classid::bigint = $2 AND l.objid::bigint = $3)))"""


async def node_connected(con: asyncpg.Connection, node_key: int, application_name: str) -> bool:
    """Whether the node whose connections are named ``application_name`` still has one that is alive:
    one not blocked on a lock, or one holding or waiting for the node's own liveness lock
    (``node_key``; it is taking it again). A backend blocked on another lock does not count: it does
    not notice that its client died (it would be granted the lock, in its turn, before it noticed)."""
    halves = ((node_key >> 32) & 0xFFFFFFFF, node_key & 0xFFFFFFFF)    # pg_locks' classid, objid
    return bool(await con.fetchval(NODE_CONNECTED_SQL, application_name, *halves))


async def _take_back(con: asyncpg.Connection, keys: set[int]) -> set[int]:
    """Those of ``keys`` taken on ``con`` now (``pg_try_advisory_lock``: not those another node holds)."""
    if not keys:
        return set()
    rows = await con.fetch("SELECT k FROM unnest($1::bigint[]) AS k WHERE pg_try_advisory_lock(k)", sorted(keys))
    return {row["k"] for row in rows}


def key_of(kind: str, name: str) -> int:
    """The signed 64-bit advisory lock key of ``kind``:``name``."""
    digest = hashlib.blake2b(f"nplt-{kind}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _last(row: asyncpg.Record) -> tuple[int, bytes] | None:
    """The last visible message a claim read (id, stored body), if any."""
    return (row["last_id"], row["last_body"]) if row["last_id"] is not None else None


class Claim(NamedTuple):
    """What ``LockHolder.claim_owned`` found: whether the lock was taken, the last visible message
    (id, stored body; only when taken) and the session's model and title."""
    got: bool
    last: tuple[int, bytes] | None
    model: str | None
    title: str


@dataclass(slots=True, eq=False)
class _Op:
    """A claim (``nplt_claim_owned``) or, with no session, a release of ``key``, waiting for its line."""
    key: int
    session_id: str | None
    user_id: str | None
    done: asyncio.Future


class _Line:
    """One holder connection, the session keys held on it, its one-statement-at-a-time mutex, and the
    claims and releases waiting to go in its next statement."""

    __slots__ = ("con", "held", "doubt", "mutex", "ops", "draining")

    def __init__(self) -> None:
        self.con: asyncpg.Connection | None = None
        self.held: set[int] = set()
        self.doubt: set[int] = set()     # keys of this node's turns whose connection broke: to take back here
        self.mutex = asyncio.Lock()
        self.ops: list[_Op] = []
        self.draining = False


class LockHolder:
    """The connections holding the node lock and the uncontended session locks (see module doc)."""

    def __init__(self, link: PgLink, node_key: int, application_name: str, *,
                 max_waiters: int | None = None) -> None:
        self.link = link
        self.node_key = node_key
        self.application_name = application_name
        self._lines = [_Line() for _ in range(link.config.pg_lock_connections)]   # [0] holds the node lock
        self._cleanups: set[asyncio.Task] = set()
        self._broken = asyncio.Event()         # set when a connection holding locks of this node closes
        self._keeper: asyncio.Task | None = None
        self._adopted: dict[int, tuple[asyncpg.Connection, Callable[[object], None]]] = {}   # ``adopt``
        self.retaken: set[int] = set()   # session keys taken back after their connection broke (``was_retaken``)
        self.statements = 0      # nplt_lock_ops statements sent (a figure for tests and benchmarks)
        self.node_locks = 0      # times the node lock was taken (again, after its connection broke)
        self.max_waiters: int = (max_waiters if max_waiters is not None
                                 else getattr(link.config, "pg_max_lock_waiters", MAX_LOCK_WAITERS))
        self.wait_check_s = WAIT_CHECK_S
        self._lock_cons: set[asyncpg.Connection] = set()   # wait_lock's connections (open: waiting or granted)
        self._connecting = 0                               # ... and those being opened
        self._waiting: dict[asyncpg.Connection, int] = {}  # connections in a lock wait -> backend pid
        self._checker: asyncio.Task | None = None          # checks them (``_check_waits``)

    @property
    def held(self) -> set[int]:
        """The session keys held on the holder connections."""
        return set().union(*(line.held for line in self._lines))

    def _line(self, key: int) -> _Line:
        return self._lines[key % len(self._lines)]

    async def _connect(self, *, wait: bool = False) -> asyncpg.Connection:
        args = self.link.connect_args()
        args["server_settings"] = {**args["server_settings"], "application_name": self.application_name}
        if wait:
            args["server_settings"]["statement_timeout"] = "0"      # a turn may take minutes
        else:
            args["command_timeout"] = self.link.call_timeout       # a line's statements: bounded
        return await asyncpg.connect(**args)

    async def open(self) -> None:
        """Connect the first line and take the node lock on it (the other lines connect when used),
        and keep the node's locks: whenever a connection holding some closes, it is opened again and
        they are taken back (``_keep_locks``)."""
        line = self._lines[0]
        async with line.mutex:
            await self.link.retrying(lambda: self._restore(line), "take the node lock")
        if self._keeper is None:
            self._keeper = asyncio.get_running_loop().create_task(self._keep_locks(), name="pg-node-locks")

    def _needs(self, line: _Line) -> bool:
        """Whether ``line`` has locks to take back: the node lock (the first line) or session locks,
        whose connection closed."""
        broken = line.con is None or line.con.is_closed()
        return bool(line.doubt) or (broken and (bool(line.held) or line is self._lines[0]))

    async def _restore(self, line: _Line) -> asyncpg.Connection:
        """With ``line.mutex`` held, one attempt: the line's connection, opened again if it closed,
        holding again the locks it held (the node lock on the first line) and those of ``line.doubt``.
        A session lock another node holds now is not taken back (``holds`` then says False); one taken
        back is noted in ``retaken``. The session locks are taken before the node lock, which a peer
        checking on this node may hold for a moment."""
        con = line.con
        if con is not None and not con.is_closed():
            if line.doubt:
                self._took_back(line, await _take_back(con, line.doubt))
            return con
        line.doubt |= line.held               # the locks went with the old connection
        line.held.clear()
        con = await self._connect()
        try:
            got = await _take_back(con, line.doubt)
            if line is self._lines[0]:
                await con.execute("SELECT pg_advisory_lock($1)", self.node_key)
        except BaseException:
            con.terminate()
            raise

        def lost(_con: object) -> None:
            if line.con is con:
                self._broken.set()
        con.add_termination_listener(lost)
        line.con = con
        self._took_back(line, got)
        if line is self._lines[0]:
            self.node_locks += 1
        return con

    def _took_back(self, line: _Line, got: set[int]) -> None:
        lost = line.doubt - got
        line.held |= got
        self.retaken |= got
        line.doubt.clear()
        if lost:
            log.warning("storage: %d session locks of running turns were taken by another node while their "
                        "connection was down", len(lost))

    async def _keep_locks(self) -> None:
        """Take the node's locks back as soon as a connection holding some is lost and PostgreSQL lets
        this node in (one attempt every ``pg_retry_backoff_ms``, not the retry policy's growing waits):
        the peers watching this node must not find it without a connection while it lives
        (``wait_node_gone``), nor take the session of a turn it still runs."""
        pause = self.link.config.pg_retry_backoff_ms / 1000
        while True:
            await self._broken.wait()
            self._broken.clear()
            failed = 0
            while not self.link.closed:
                try:
                    for line in self._lines:
                        if self._needs(line):
                            async with line.mutex:
                                if self._needs(line):
                                    await self._restore(line)
                    break
                except Exception as exc:      # PostgreSQL unreachable, starting, or full
                    if not failed:
                        log.warning("storage: lock connection lost, taking the node's locks back (%s)", exc)
                    failed += 1
                await asyncio.sleep(pause)
            if failed:
                log.info("storage: the node's locks taken back after %d failed attempts", failed)

    async def _holder(self, line: _Line) -> asyncpg.Connection:
        if line.con is None or line.con.is_closed() or line.doubt:
            return await self._restore(line)
        return line.con

    def adopt(self, key: int, con: asyncpg.Connection) -> None:
        """``key`` is held on ``con``, a connection of its own (``wait_lock``), by a running turn: if
        that connection closes, the lock is taken back on its line, as the lines' own locks are.
        ``let_go`` releases it. Adopting it again changes nothing."""
        held = self._adopted.get(key)
        if held is not None and held[0] is con:
            return

        def lost(_con: object) -> None:
            if self._adopted.get(key) is entry:
                del self._adopted[key]
                self._line(key).doubt.add(key)
                self._broken.set()
        entry = (con, lost)
        self._adopted[key] = entry
        con.add_termination_listener(lost)
        if con.is_closed():                   # (listeners are not called any more)
            lost(con)

    async def let_go(self, key: int, con: asyncpg.Connection) -> None:
        """Release ``key``, held on ``con`` (``wait_lock``; ``adopt``ed or not), or on its line if it
        was taken back there after ``con`` closed."""
        entry = self._adopted.get(key)
        if entry is not None and entry[0] is con:
            del self._adopted[key]
            con.remove_termination_listener(entry[1])
        con.terminate()
        line = self._line(key)
        if key in line.held or key in line.doubt:
            await self.unlock(key)

    async def holds(self, key: int) -> bool:
        """Whether this node holds ``key`` now (the lock of one of its running turns). If its
        connection closed, the lock is taken back first (under the retry policy: StorageUnavailable
        while PostgreSQL cannot be reached); False if another node took it meanwhile. No round trip
        while its connection is up."""
        entry = self._adopted.get(key)
        if entry is not None:
            if not entry[0].is_closed():
                return True
            entry[1](entry[0])                 # (its termination listener may not have run yet)
        line = self._line(key)
        if key not in line.held and key not in line.doubt:
            return False
        if key in line.held and not self._needs(line):
            return True
        async with line.mutex:
            if self._needs(line) and (key in line.held or key in line.doubt):
                await self.link.retrying(lambda: self._restore(line), "take a session lock back")
            return key in line.held

    def was_retaken(self, key: int) -> bool:
        """Whether ``key`` was taken back after its connection closed, since it was claimed: another
        node may have taken it and let it go meanwhile."""
        return key in self.retaken

    async def try_lock(self, key: int) -> bool:
        """Take ``key`` on the holder connection if nobody holds it (nor waits for it)."""
        async def fetch(con: asyncpg.Connection) -> tuple[bool, None]:
            return bool(await con.fetchval("SELECT pg_try_advisory_lock($1)", key)), None
        got, _ = await self._take(key, fetch)
        return got

    async def try_claim(self, key: int, session_id: str) -> tuple[bool, tuple[int, bytes] | None]:
        """``try_lock`` and, when taken, the session's last visible message (id, stored body), in one
        round trip (``nplt_try_claim``, migration 0005)."""
        async def fetch(con: asyncpg.Connection) -> tuple[bool, tuple[int, bytes] | None]:
            row = await con.fetchrow("SELECT * FROM nplt_try_claim($1, $2)", key, session_id)
            if row is None:                       # no such session: the lock was taken all the same
                return True, None
            return bool(row["got"]), _last(row)
        return await self._take(key, fetch)

    async def claim_owned(self, key: int, session_id: str, user_id: str) -> Claim | None:
        """``try_claim`` of a live session of ``user_id``, checked in the same round trip
        (``nplt_claim_owned``, migration 0008): NotFound, with nothing locked, for a session that
        does not exist, is deleted or is another user's. None when this node holds ``key`` already
        (nothing was asked: the caller checks the session itself). Claims and releases waiting for
        the same line go in one statement (``_drain``)."""
        return await self._queue(key, session_id, user_id)

    async def unlock(self, key: int) -> None:
        """Release ``key`` if this node holds it (with claims and releases waiting for its line)."""
        await self._queue(key, None, None)

    async def _queue(self, key: int, session_id: str | None, user_id: str | None) -> Claim | None:
        line = self._line(key)
        loop = asyncio.get_running_loop()
        op = _Op(key, session_id, user_id, loop.create_future())
        line.ops.append(op)
        if not line.draining:
            line.draining = True
            task = loop.create_task(self._drain(line))
            self._cleanups.add(task)
            task.add_done_callback(self._cleanups.discard)
        if session_id is None:
            await asyncio.shield(op.done)     # a release is made even if its caller gives up
            return None
        return await op.done                  # a claim withdrawn before it is sent is not made

    async def _drain(self, line: _Line) -> None:
        """Send the line's waiting claims and releases, in the order they were asked, one statement
        at a time; a key asked about twice waits for the next statement."""
        try:
            while line.ops:
                async with line.mutex:
                    keys: set[int] = set()
                    batch: list[_Op] = []
                    for op in line.ops:
                        if op.key in keys:
                            break
                        keys.add(op.key)
                        batch.append(op)
                    del line.ops[:len(batch)]
                    await self._send(line, batch)
        finally:
            line.draining = False

    async def _send(self, line: _Line, batch: list[_Op]) -> None:
        send: list[_Op] = []
        for op in batch:
            if op.session_id is None:
                if op.key in line.held and line.con is not None and not line.con.is_closed():
                    send.append(op)
                else:
                    _settle(op, None)            # not held, or released with its connection
                line.held.discard(op.key)
                line.doubt.discard(op.key)       # (not to be taken back)
                self.retaken.discard(op.key)
            elif op.done.done():
                continue                         # withdrawn
            elif op.key in line.held or op.key in line.doubt:
                _settle(op, None)
            else:
                send.append(op)

        async def once() -> list[asyncpg.Record]:
            if not send:
                return []
            con = await self._holder(line)
            self.statements += 1
            try:
                return await con.fetch("SELECT * FROM nplt_lock_ops($1::bigint[], $2::text[], $3::text[])",
                                       [op.key for op in send], [op.session_id for op in send],
                                       [op.user_id for op in send])
            except CONNECTION_ERRORS as exc:
                if not is_connection_error(exc):
                    raise
                con.terminate()                  # its locks are gone: releases are done, claims retried
                for op in [op for op in send if op.session_id is None]:
                    send.remove(op)
                    _settle(op, None)
                if isinstance(exc, asyncio.TimeoutError):     # sent, no answer: not retried
                    raise self.link.no_answer(write=False) from None
                raise Unsent() from exc
        try:
            rows = await self.link.retrying(once, "take a session lock")
        except Exception as exc:
            for op in send:
                if not op.done.done():
                    op.done.set_exception(exc)
            return
        except BaseException:                    # (the loop is going away)
            for op in send:
                op.done.cancel()
            raise
        found = {row["k"]: row for row in rows}
        for i, op in enumerate(send, 1):
            if op.session_id is None:
                _settle(op, None)
                continue
            row = found.get(i)
            if row is None:
                if not op.done.done():
                    op.done.set_exception(NotFound(f"session {op.session_id} not found"))
                continue
            if row["got"]:
                line.held.add(op.key)
                self.retaken.discard(op.key)
                if op.done.done():               # withdrawn while it was being taken: let it go
                    line.ops.append(_Op(op.key, None, None, asyncio.get_running_loop().create_future()))
                    continue
            _settle(op, Claim(bool(row["got"]), _last(row), row["model"], row["title"].decode()))

    async def _take(self, key: int, fetch: Callable[[asyncpg.Connection], Awaitable[tuple[bool, T]]]
                    ) -> tuple[bool, T | None]:
        """Run ``fetch`` (which tries to take ``key``) on the holder connection, retried while no
        connection can be had; a key already held is never taken twice (advisory locks are re-entrant)."""
        line = self._line(key)
        async with line.mutex:
            if key in line.held:
                return False, None
            async def once() -> tuple[bool, T]:
                con = await self._holder(line)
                try:
                    return await fetch(con)
                except CONNECTION_ERRORS as exc:
                    if not is_connection_error(exc):
                        raise
                    con.terminate()             # its locks are gone: the next call reconnects
                    if isinstance(exc, asyncio.TimeoutError):     # sent, no answer: not retried
                        raise self.link.no_answer(write=False) from None
                    raise Unsent() from exc
            got = await self.link.retrying(once, "take a session lock")
            if got[0]:
                line.held.add(key)
                self.retaken.discard(key)
            return got

    async def wait_lock(self, key: int) -> asyncpg.Connection:
        """Wait (arrival order) for ``key`` on a connection of its own; close it to release the lock.
        Cancel the awaiting task to give up (the connection is closed).

        A wait whose connection breaks (PostgreSQL restarted: its queue is gone) connects again and
        queues again, under the retry policy (``pg_retry_attempts``, ``pg_retry_backoff_ms``; then
        StorageUnavailable). The running turn that held the lock must keep it: this node's own is
        taken back first, and another node's is given ``2 x pg_retry_backoff_ms`` once PostgreSQL
        lets this one in (a live node takes its locks back within one ``pg_retry_backoff_ms``,
        ``_keep_locks``; the nodes are assumed to share the setting), so a waiting turn does not
        take the session from it.

        LockWaitersFull (QUEUE_FULL) when this node has ``max_waiters`` such connections open already."""
        broke = False
        grace_s = 2 * self.link.config.pg_retry_backoff_ms / 1000

        async def once() -> asyncpg.Connection:
            nonlocal broke
            if broke:
                await self._take_back_own(key)
            self.room_for_waiter()
            self._connecting += 1
            try:
                con = await self._connect_waiter()
            finally:
                self._connecting -= 1
            self._lock_cons.add(con)
            con.add_termination_listener(lambda c: self._lock_cons.discard(c))
            pid = con.get_server_pid()
            try:
                if broke:
                    await asyncio.sleep(grace_s)
                with self._watched(con, pid):
                    await con.execute("SELECT pg_advisory_lock($1)", key)
            except BaseException as exc:
                self._abandon(con, pid)
                if not is_connection_error(exc):
                    raise
                broke = True
                log.warning("storage: the wait for a session lock lost its connection (%s): queuing again", exc)
                raise Unsent() from exc
            return con
        return await self.link.retrying(once, "wait for a session lock")

    @property
    def lock_waiters(self) -> int:
        """Connections open (or being opened) for contended session locks (``wait_lock``)."""
        for con in [con for con in self._lock_cons if con.is_closed()]:   # (listeners run a moment later)
            self._lock_cons.discard(con)
        return len(self._lock_cons) + self._connecting

    def room_for_waiter(self) -> None:
        """LockWaitersFull (QUEUE_FULL) if ``wait_lock`` would be refused now (``max_waiters`` reached)."""
        if self.lock_waiters >= self.max_waiters:
            raise LockWaitersFull(
                f"this node already has {self.lock_waiters} turns waiting for or holding a busy session's "
                f"lock, each on a PostgreSQL connection of its own (pg_max_lock_waiters = {self.max_waiters}): "
                "try again when one has ended")

    @contextlib.contextmanager
    def _watched(self, con: asyncpg.Connection, pid: int) -> Iterator[None]:
        """``con`` (backend ``pid``) is in a lock wait: checked every ``wait_check_s`` (``_check_waits``)."""
        self._waiting[con] = pid
        if self._checker is None or self._checker.done():
            self._checker = asyncio.get_running_loop().create_task(self._check_waits(), name="pg-lock-waits")
        try:
            yield
        finally:
            self._waiting.pop(con, None)

    async def _check_waits(self) -> None:
        """While connections wait for a lock: every ``wait_check_s``, look their backends up through
        the pool (bounded by ``PgLink.call_timeout``, under the retry policy) and drop the connections
        whose backend is gone, or all of them when PostgreSQL cannot be reached or does not answer:
        their waits then queue again under the retry policy (``wait_lock``) or fail (``wait_node_gone``),
        rather than wait forever on a server that stopped answering."""
        while self._waiting and not self.link.closed:
            await asyncio.sleep(self.wait_check_s)
            waiting = dict(self._waiting)
            if not waiting:
                continue
            try:
                rows = await self.link.run(lambda c: c.fetch(
                    "SELECT pid FROM pg_stat_activity WHERE pid = ANY($1::int[])", sorted(set(waiting.values()))),
                    write=False)
                alive = {row["pid"] for row in rows}
            except StorageClosed:
                return
            except StorageError as exc:          # unreachable, or no answer within the bound
                log.warning("storage: cannot check the %d connections waiting for a lock (%s): dropping them",
                            len(waiting), exc)
                alive = set()
            for con, pid in waiting.items():
                if pid not in alive and self._waiting.get(con) == pid:
                    log.warning("storage: the backend of a connection waiting for a lock (pid %s) is gone or "
                                "PostgreSQL does not answer: dropping it", pid)
                    con.terminate()

    async def _take_back_own(self, key: int) -> None:
        """If this node held ``key`` (a running turn's lock) on a connection that closed, take it back
        now, before a waiting turn of this node queues for it again (``wait_lock``)."""
        entry = self._adopted.get(key)
        if entry is not None and entry[0].is_closed():
            entry[1](entry[0])                 # (its termination listener may not have run yet)
        line = self._line(key)
        if key in line.doubt or (key in line.held and self._needs(line)):
            async with line.mutex:
                if self._needs(line) and (key in line.held or key in line.doubt):
                    await self._restore(line)

    def _abandon(self, con: asyncpg.Connection, pid: int) -> None:
        """Close a connection whose backend (``pid``) may still wait for a lock. A backend blocked on
        a lock does not notice its client is gone (it would be granted the lock, in its turn, before
        it noticed), so it is also ended from a pooled connection."""
        con.terminate()

        async def end_backend() -> None:
            try:
                await self.link.run(lambda c: c.execute("SELECT pg_terminate_backend($1)", pid), write=False)
            except (StorageError, asyncpg.PostgresError, *CONNECTION_ERRORS) as exc:
                # PostgreSQL gone or the pool closed: the backend went with it
                log.info("storage: lock waiter backend %s not ended (%s)", pid, exc)
        task = asyncio.get_running_loop().create_task(end_backend())
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _connect_waiter(self) -> asyncpg.Connection:
        return await self._connect(wait=True)

    async def wait_node_gone(self, node_key: int, application_name: str, retry_s: float,
                             grace_s: float = 0.0) -> None:
        """Return when the node holding ``node_key`` has no connection left (it died or stopped): its
        lock is free and none of its connections (named ``application_name``) is alive
        (``node_connected``). A live node's lock is free too while it reconnects (PostgreSQL
        restarted), and a dead node's backends take a moment to exit after letting go of its lock:
        while one is left, the lock is let go and waited for again after ``retry_s``. ``grace_s``
        (the caller's connection broke: PostgreSQL may have restarted, and every node is
        reconnecting): a node without a connection is not taken for gone before ``grace_s`` after
        this call connected, so that a live node has the time to come back."""
        con = await self.link.retrying(self._connect_waiter, "watch a node")
        pid = con.get_server_pid()
        loop = asyncio.get_running_loop()
        trusted = loop.time() + grace_s
        waited = False
        try:
            with self._watched(con, pid):
                while True:
                    await con.execute("SELECT pg_advisory_lock($1)", node_key)
                    if not await node_connected(con, node_key, application_name):
                        if loop.time() >= trusted:
                            break
                        if not waited:
                            log.info("storage: %s has no connection since this node's own connection broke: "
                                     "it has %.1f s to reconnect", application_name, trusted - loop.time())
                            waited = True
                    await con.execute("SELECT pg_advisory_unlock($1)", node_key)
                    await asyncio.sleep(retry_s)
        except BaseException:
            self._abandon(con, pid)
            raise
        con.terminate()

    async def close(self) -> None:
        """Close the holder connections (before the pool: abandoned waiters are ended through it)."""
        if self._keeper is not None:
            self._keeper.cancel()
            try:
                await self._keeper
            except asyncio.CancelledError:
                pass
            self._keeper = None
        if self._checker is not None:
            self._checker.cancel()
            try:
                await self._checker
            except asyncio.CancelledError:
                pass
            self._checker = None
        if self._cleanups:
            await asyncio.wait(list(self._cleanups), timeout=self.link.config.pg_connect_timeout_s)
        self._adopted.clear()
        for line in reversed(self._lines):     # the node lock last
            async with line.mutex:
                con, line.con = line.con, None
                line.held.clear()
                line.doubt.clear()
                if con is not None and not con.is_closed():
                    try:
                        await asyncio.wait_for(con.close(), self.link.config.pg_connect_timeout_s)
                    except (asyncio.TimeoutError, *CONNECTION_ERRORS):
                        con.terminate()
