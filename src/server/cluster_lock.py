"""The cluster's turn lock (``ClusterTurnLock``): what the TurnRunner takes around each turn, so at most one
turn per session runs at a time on all nodes, in the order the nodes asked (PostgreSQL's lock queue).

A turn's claim (``Hold``) is granted at once or waits in PostgreSQL's queue; this node's waiting claims
of a session (``Claims``) hand each granted connection to the claim that asked first. The lock is
owned by ``server.cluster.Cluster`` (``cluster.turn_lock``), whose remote-turn registry, repair and
relay it uses: before a turn runs, what the previous holder left (a dead node's turn) is closed.
"""
from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from storage.errors import InvalidSessionId, NotFound
from storage.pg.lock_holder import Claim, LockHolder, key_of
from storage.pg.store import message_of

_background: set[asyncio.Task] = set()      # releases of withdrawn claims in progress


class Hold:
    """One turn's claim on its session: granted at once (``ready``) or waiting in PostgreSQL's queue
    (``queue``: this node's waiting claims of the session, which hands it a granted connection)."""

    __slots__ = ("_release", "_granted", "_queue", "_session_id", "_releasing", "_holder")

    def __init__(self, session_id: str, releasing: dict[str, asyncio.Event], release: Any,
                 queue: Claims | None = None, holder: LockHolder | None = None) -> None:
        self._session_id = session_id
        self._releasing = releasing      # session -> set once this node's hold on it is released
        self._release = release          # async () -> None: unlock (holder connection), or flush events
        self._queue = queue
        self._holder = holder            # (a contended lock: its connection is adopted while the turn runs)
        # a contended lock: the connection holding it, once granted (its result), or the error
        self._granted: asyncio.Future | None = None
        if queue is not None:
            self._granted = asyncio.get_running_loop().create_future()
            self._granted.add_done_callback(_retrieved)

    @property
    def ready(self) -> bool:
        granted = self._granted
        return granted is None or (granted.done() and not granted.cancelled() and granted.exception() is None)

    async def wait(self) -> None:
        """Until the lock is granted (cancel the awaiting task to stop waiting, then ``release`` or
        ``cancel`` to give the claim up; errors are StorageErrors)."""
        if self._granted is not None:
            con = await asyncio.shield(self._granted)
            if self._holder is not None:   # taken back on a holder line if its connection breaks
                self._holder.adopt(key_of("session", self._session_id), con)

    def cancel(self) -> None:
        """Give the claim up without waiting (a withdrawn turn): stop waiting, or let the lock go."""
        if not self.ready:
            self._withdraw()
        else:
            _background.add(t := asyncio.get_running_loop().create_task(self.release()))
            t.add_done_callback(_background.discard)

    def _withdraw(self) -> None:
        assert self._queue is not None and self._granted is not None
        self._queue.withdraw(self)
        self._granted.cancel()           # (a lock granted meanwhile went to the next claim, or was let go)

    async def release(self) -> None:
        if not self.ready:
            self._withdraw()             # never granted: nothing to release
            return
        done = self._releasing[self._session_id] = asyncio.Event()
        try:
            await self._release()         # this turn's last events first, then the lock
            if self._granted is not None:            # (a contended lock goes with its connection)
                con = self._granted.result()
                if self._holder is None:
                    con.terminate()
                else:
                    await self._holder.let_go(key_of("session", self._session_id), con)
        finally:
            done.set()
            if self._releasing.get(self._session_id) is done:
                del self._releasing[self._session_id]


def _retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()               # (an error of a claim given up is not reported as unretrieved)


class Claims:
    """This node's claims of one session waiting in PostgreSQL's queue, in the order they were asked.
    Each has a connection of its own waiting for the lock, but those reach PostgreSQL in whatever
    order they connect: so the lock granted on any of them goes to the claim asked first (a claim
    asked later would otherwise hold the session while the one before it, which its turn waits
    behind on this node, waits for it). A claim given up stops the connection asked last."""

    def __init__(self, claims: dict[str, Claims], session_id: str) -> None:
        self._all = claims
        self.session_id = session_id
        self.holds: list[Hold] = []                 # waiting for a connection, first asked first
        self.waits: list[asyncio.Task] = []          # the connections' waits (result: the connection)

    def add(self, hold: Hold, wait: asyncio.Task) -> None:
        self.holds.append(hold)
        self.waits.append(wait)
        wait.add_done_callback(self._granted)

    def _granted(self, wait: asyncio.Task) -> None:
        error = None if wait.cancelled() else wait.exception()
        if wait not in self.waits:                   # stopped by a claim given up
            if not wait.cancelled() and error is None:
                wait.result().terminate()            # (granted all the same: let it go)
        else:
            self.waits.remove(wait)
            hold = self.holds.pop(0)                 # (one claim waiting for each wait)
            assert hold._granted is not None
            if wait.cancelled():                     # (the loop is going away)
                hold._granted.cancel()
            elif error is not None:
                hold._granted.set_exception(error)
            else:
                hold._granted.set_result(wait.result())
        self._forget_if_empty()

    def withdraw(self, hold: Hold) -> None:
        """``hold`` gives its claim up: one wait is stopped, the one asked last that is not over."""
        if hold in self.holds:
            self.holds.remove(hold)
            pending = [i for i, w in enumerate(self.waits) if not w.done()]
            self.waits.pop(pending[-1] if pending else -1).cancel()
        self._forget_if_empty()

    def _forget_if_empty(self) -> None:
        if not self.holds and not self.waits and self._all.get(self.session_id) is self:
            del self._all[self.session_id]


class ClusterTurnLock:
    """The TurnRunner's lock (``turns.TurnLock``): one turn per session across the nodes."""

    def __init__(self, cluster: Any) -> None:      # server.cluster.Cluster
        self.cluster = cluster
        self.holder = cluster.holder
        self.releasing: dict[str, asyncio.Event] = {}   # holds of this node being released
        self.claims: dict[str, Claims] = {}             # this node's claims waiting in PostgreSQL's queue

    async def try_hold(self, session_id: str) -> Hold | None:
        """The session's lock if it is free now or within ``ending_turn_wait_ms`` (nothing left to
        close: repaired first), else None. Another node publishes its turn's TURN_END before it lets
        go of the lock (its events first, then the lock), so a client that saw TURN_END and sends a
        regenerate or edit at once may find the lock still held for a moment: the claim then waits
        in PostgreSQL's queue (arrival order: a turn queued before it still comes first) that long."""
        key = await self._after_release(session_id)
        got, last = await self.holder.try_claim(key, session_id)      # lock + last message: one round trip
        if got:
            return await self._held(session_id, key, last)
        hold = self.request(session_id)
        try:
            await asyncio.wait_for(hold.wait(), self.cluster.config.ending_turn_wait_ms / 1000)
        except asyncio.TimeoutError:
            hold.cancel()                # (granted meanwhile: let go)
            return None
        except BaseException:
            hold.cancel()
            raise
        return hold

    async def claim_owned(self, session_id: str, user_id: str) -> tuple[Hold | None, Claim | None]:
        """``try_hold`` of a live session of ``user_id``, checked in the same round trip (NotFound
        otherwise, nothing locked), and the session's model and title (``Claim``; None when this
        node holds the lock already: nothing was read)."""
        key = await self._after_release(session_id)
        claim = await self.holder.claim_owned(key, session_id, user_id)
        if claim is None or not claim.got:
            return None, claim
        return await self._held(session_id, key, claim.last), claim

    async def _after_release(self, session_id: str) -> int:
        """The session's lock key, once this node's previous turn there has let go of it (a waiter
        from another node still comes first)."""
        releasing = self.releasing.get(session_id)
        if releasing is not None:
            await releasing.wait()
        return key_of("session", session_id)

    async def _held(self, session_id: str, key: int, last: tuple[int, bytes] | None) -> Hold:
        """The Hold of a lock just taken, once what the previous holder left is closed (repaired)."""
        try:
            await self.cluster.after_remote_turn(session_id)
            await self.cluster.repair(session_id, None if last is None else message_of(*last))
        except BaseException:
            await self.holder.unlock(key)
            raise
        return Hold(session_id, self.releasing, self._unlocker(key))

    def _unlocker(self, key: int) -> Any:
        async def release() -> None:
            await self.cluster.relay.flush()     # this turn's last events first, then the next turn
            await self.holder.unlock(key)
        return release

    async def still_held(self, session_id: str, user_message_id: int) -> bool:
        """Whether the turn this node runs in ``session_id``, answering ``user_message_id``, still has
        the session to itself, so that its answer may be stored: its lock is held (taken back first if
        its connection broke: StorageUnavailable while PostgreSQL cannot be reached) and, if it had to
        be taken back, nothing was stored after that message meanwhile (another node closing the
        turn as interrupted, or running one of its own). No round trip while the lock's connection
        stayed up (the common case): so a node that stalled (SIGSTOP, a GC pause) while PostgreSQL
        dropped that connection, and has not processed the closed socket yet, is told True. The
        answer's append is fenced for that (``TurnRunner._store_assistant``: ``fence``, checked by
        PostgreSQL in the append's statement), so this is only the early, cheap half of the check."""
        key = key_of("session", session_id)
        if not await self.holder.holds(key):
            return False
        if not self.holder.was_retaken(key):
            return True
        try:
            after = await self.cluster.store.messages(session_id, after_id=user_message_id)
        except (NotFound, InvalidSessionId):
            return True                      # (the session is gone: storing the answer says so)
        return all(m.metadata.get("superseded") for m in after)   # (a regenerated turn's old answers)

    def running_elsewhere(self, session_id: str) -> bool:
        """Whether a turn of the session is known to run on another node (from its TURN_START, until
        its TURN_END or its node's death): the TurnRunner counts it as the session's running turn."""
        return session_id in self.cluster.remote_turns

    def request(self, session_id: str) -> Hold:
        """Queue for the session's lock now (arrival order); ``Hold.wait`` until it is granted.
        LockWaitersFull (QUEUE_FULL) at once, nothing queued, when this node has
        ``pg_max_lock_waiters`` connections for contended locks already: the CHAT_SEND (or
        regenerate, edit, delete, clear) that asked is refused, rather than a turn failing later."""
        self.holder.room_for_waiter()
        claims = self.claims.get(session_id)
        if claims is None:
            claims = self.claims[session_id] = Claims(self.claims, session_id)
        hold = Hold(session_id, self.releasing, self.cluster.relay.flush, claims, self.holder)
        claims.add(hold, asyncio.get_running_loop().create_task(self._acquire(session_id)))
        return hold

    async def _acquire(self, session_id: str) -> asyncpg.Connection:
        con = await self.holder.wait_lock(key_of("session", session_id))
        try:
            await self.cluster.after_remote_turn(session_id)
            await self.cluster.repair(session_id)
        except BaseException:
            con.terminate()
            raise
        return con
