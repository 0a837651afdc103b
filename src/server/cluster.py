"""This node's part in a cluster of server nodes sharing one PostgreSQL database (issue 17).

Built by ``services.build_services`` only when the store is PostgreSQL (the JSON backend has no
cluster component at all), started and closed by ``server.app.Server``. It owns:

- ``relay`` (``server.cluster_relay``): the hub's events go to the other nodes and theirs come into
  the local hub, so a client of any node follows a session wherever its turns run;
- ``turn_lock`` (``ClusterTurnLock``): what the TurnRunner takes around each turn, so at most one turn
  per session runs at a time on all nodes, in the order the nodes asked (PostgreSQL's lock queue);
- the dead-node watch: every node holds a liveness lock on its lock connection; for each node whose
  turns it has seen start, a peer waits on that lock. A node that dies loses its connections, so its
  session locks and its liveness lock are released at once; the peers then close the turns it left
  running as interrupted (``server.agent.interrupted``). Whichever node takes the session's lock first
  does it; a turn that takes the lock later finds nothing left to close. Every turn also closes such a
  leftover before it stores its own user message, so history keeps reading question, answer.
  The liveness lock is also free while a live node reconnects (PostgreSQL restarted): so a turn is
  closed only once its session's lock can be taken, and a node with a turn whose session is still
  locked is watched again (``dead_node_retry_ms``) until every turn it left is closed; the watch also
  outlives a broken connection of its own, and after one gives the node ``reconnect_grace_ms`` to
  come back (a live node takes back its liveness lock and its running turns' session locks as soon as
  PostgreSQL lets it in: ``LockHolder``). A turn whose session lock another node took meanwhile is
  told so (``ClusterTurnLock.still_held``) and must not store its answer after that node's.
- lost TURN_ENDs: when the relay reports that events may have been lost (its listener reconnected, or
  another node could not send some), every other node's turn this node believes running
  (``remote_turns``) is checked against PostgreSQL (``recheck_remote_turns``): one whose answer is
  stored is over (its end is published here, from the stored answer); one without an answer whose
  node is connected but does not hold the session's lock is over too if that is still so after
  ``reconnect_grace_ms`` (it ended without storing one); otherwise it still runs, or its node is
  dead and the watch closes it.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

import asyncpg

from protocol.server_events import TurnEnd, TurnError
from server.agent.interrupted import interrupted_message
from server.cluster_cancel import RemoteCancel
from server.cluster_config import ClusterConfig
from server.cluster_relay import NODE_APP_PREFIX, Relay
from server.cluster_state import RemoteTurnState
from server.hub import Hub
from server.errors import error_code
from server.wire import message_obj
from storage.errors import InvalidSessionId, NotFound, StorageClosed
from storage.models import now_iso
from storage.pg.lock_holder import Claim, LockHolder, key_of, node_connected
from storage.pg.store import message_of

log = logging.getLogger("nplt.cluster")



_UNREAD: Any = object()      # repair(): the last message is not known yet

#: Whether a connection of a node (by application_name, $3) holds the advisory lock whose key's
#: halves are $1, $2 (pg_locks' classid, objid): the lock of a turn that node still runs.
LOCK_HELD_BY_SQL = """
SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
               WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                 AND l.classid::bigint = $1 AND l.objid::bigint = $2 AND a.application_name = $3)"""


class Cluster:
    """The cluster component the Services own when storage is PostgreSQL."""

    def __init__(self, store: Any, hub: Hub, sessions: Any, config: ClusterConfig | None = None) -> None:
        self.config = cfg = config or ClusterConfig()
        self.node_id = secrets.token_hex(6)
        self.store = store
        self.hub = hub
        self.sessions = sessions
        self.holder = LockHolder(store.link, key_of("node", self.node_id), NODE_APP_PREFIX + self.node_id)
        self.relay = Relay(self.node_id, store.link, store, hub, batch_ms=cfg.delta_batch_ms,
                           on_start=self._remote_start, on_end=self._remote_end,
                           on_control=self._on_control, on_deleted=self._on_deleted,
                           on_gap=self._on_gap)
        self.remote_cancel = RemoteCancel(self, cfg.remote_cancel_wait_ms)
        self.remote_state = RemoteTurnState(self, cfg.remote_state_wait_ms)
        self.turn_lock = ClusterTurnLock(self)
        self.remote_turns: dict[str, tuple[str, str, int]] = {}   # session -> (node, turn id, user msg id)
        # after a watch's connection broke, a node without a connection has this long to come back
        self.reconnect_grace_s = max(cfg.reconnect_grace_ms, 2 * store.link.config.pg_retry_backoff_ms) / 1000
        self.interrupted = 0                                      # turns this node closed as interrupted
        self._watchers: dict[str, asyncio.Task] = {}
        self._end_waiters: dict[str, asyncio.Event] = {}
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        await self.holder.open()             # (its application_name tells the other nodes this one is here)
        await self.relay.start(self.config.hello_wait_ms / 1000)
        self.hub.relay = self.relay
        log.info("cluster node %s", self.node_id)

    async def close(self) -> None:
        self.hub.relay = None
        await self.relay.close()
        await self.remote_cancel.close()
        for task in [*self._watchers.values(), *self._tasks]:
            task.cancel()
        await asyncio.gather(*self._watchers.values(), *self._tasks, return_exceptions=True)
        await self.holder.close()

    def _on_gap(self, node: str | None) -> None:
        """Events of ``node`` (None: of any node) may have been lost here (``Relay``): check the turns."""
        if self.remote_turns:
            self._spawn(self.recheck_remote_turns(node))

    def _on_deleted(self, user_id: str, session_id: str) -> None:
        self.remote_cancel.on_deleted(user_id, session_id)

    def _on_control(self, node: str, item: list[Any]) -> None:
        """A control item from another node, to the component whose request or answer it is."""
        if item[0] in ("g", "v"):
            self.remote_state.on_control(node, item)
        else:
            self.remote_cancel.on_control(node, item)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- other nodes' turns --------------------------------------------------------------------------
    def _remote_start(self, node: str, session_id: str, turn_id: str, user_message_id: int) -> None:
        self.remote_turns[session_id] = (node, turn_id, user_message_id)
        if node not in self._watchers:
            self._watchers[node] = asyncio.get_running_loop().create_task(self._watch(node))

    def _remote_end(self, session_id: str, turn_id: str) -> None:
        entry = self.remote_turns.get(session_id)
        if entry is not None and entry[1] == turn_id:
            self._forget_remote(session_id)

    def _forget_remote(self, session_id: str) -> tuple[str, str, int] | None:
        """The session's remote turn is over (ended, or closed here): wake whoever waits for it."""
        entry = self.remote_turns.pop(session_id, None)
        waiter = self._end_waiters.pop(session_id, None)
        if waiter is not None:
            waiter.set()
        return entry

    async def wait_remote_end(self, session_id: str, timeout_s: float) -> None:
        """Until the turn another node runs in ``session_id`` has ended here too (at most ``timeout_s``)."""
        if session_id not in self.remote_turns:
            return
        waiter = self._end_waiters.setdefault(session_id, asyncio.Event())
        try:
            await asyncio.wait_for(waiter.wait(), timeout_s)
        except asyncio.TimeoutError:          # its node died, or its TURN_END is late: repair decides
            pass

    async def after_remote_turn(self, session_id: str) -> None:
        """With the session's lock just taken: wait (at most ``remote_end_wait_ms`` in all) until this
        node has heard everything the other nodes sent before the lock was granted (``Relay.sync``: the
        lock can come before the notifications of the turn that held it) and until that turn has
        ended here too, so local clients never see two turns overlap."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.remote_end_wait_ms / 1000
        await self.relay.sync(self.config.remote_end_wait_ms / 1000)
        await self.wait_remote_end(session_id, max(0.0, deadline - loop.time()))

    async def recheck_remote_turns(self, node: str | None = None) -> int:
        """After events may have been lost (``_on_gap``): drop, from ``remote_turns``, the turns of
        ``node`` (None: of every node) that are over according to PostgreSQL, so that their sessions
        stop looking running here (SESSION_INFO, a SESSION_SWITCH's wait for the turn's state, a
        CHAT_CANCEL, a delete or clear, a turn's wait for their end), and end them for this node's
        clients (from the stored answer). A turn is over once a message after its user message is
        stored (its answer, or a later turn's). Checked ``2 x pg_retry_backoff_ms`` after the call: a
        node takes back the locks of its running turns within one ``pg_retry_backoff_ms`` of
        PostgreSQL letting it in (``LockHolder``; the nodes are assumed to share the setting). A turn
        with nothing stored after it whose node is connected but does not hold the session's lock
        (it ended without storing its answer, or its node is slow to take the lock back) is checked
        again after ``reconnect_grace_ms`` and dropped if that is still so; while its node holds the
        lock it runs, and a node with no connection is left to the dead-node watch. Returns how many
        were dropped."""
        await asyncio.sleep(2 * self.store.link.config.pg_retry_backoff_ms / 1000)
        dropped, unheld = await self._recheck(node, set(), final=False)
        if unheld:
            await asyncio.sleep(self.reconnect_grace_s)
            more, _ = await self._recheck(node, unheld, final=True)
            dropped += more
        return dropped

    async def _recheck(self, node: str | None, only: set[str], *, final: bool) -> tuple[int, set[str]]:
        """One pass of ``recheck_remote_turns`` (over the sessions ``only``, if any): (turns dropped,
        sessions whose turn looks over without an answer, dropped only when ``final``)."""
        dropped = 0
        unheld: set[str] = set()
        for session_id, entry in list(self.remote_turns.items()):
            if (node is not None and entry[0] != node) or (only and session_id not in only):
                continue
            try:
                state, stored = await self._remote_turn_state(session_id, entry)
            except StorageClosed:
                break
            except Exception as exc:        # PostgreSQL unreachable again: its next reconnect checks again
                log.warning("cluster: cannot check the turn of %s on node %s (%s)", session_id, entry[0], exc)
                continue
            if state == "unheld" and not final:
                unheld.add(session_id)
                continue
            if state == "running" or self.remote_turns.get(session_id) != entry:
                continue
            dropped += 1
            log.info("cluster: turn %s of %s on node %s is over, its end was lost here", entry[1], session_id, entry[0])
            self._forget_remote(session_id)
            if stored is not None:
                self.relay.closed_here(entry[1])       # (its own end, if it comes after all, is not shown)
                self.hub.publish_turn(session_id, _end_of(session_id, entry[1], stored))
            self._spawn(self.sessions.publish_updated(session_id))
        return dropped, unheld

    async def _remote_turn_state(self, session_id: str, entry: tuple[str, str, int]) -> tuple[str, Any]:
        """Whether the turn ``entry`` of another node in ``session_id`` is ``"over"`` (a message after
        its user message is stored, or the session is gone), ``"running"`` (its node holds the
        session's lock, or has no connection: dead or reconnecting, the watch decides) or
        ``"unheld"`` (its node is connected and does not hold the lock); and its stored answer, if any."""
        node, _turn_id, user_message_id = entry
        try:
            after = await self.store.messages(session_id, after_id=user_message_id)
        except (NotFound, InvalidSessionId):
            return "over", None
        stored = next((m for m in after if not m.metadata.get("superseded")), None)
        if stored is not None:          # its answer, or (it ended without one) a later turn's message
            return "over", stored if stored.role == "assistant" else None
        key = key_of("session", session_id)
        app = NODE_APP_PREFIX + node

        async def check(con: asyncpg.Connection) -> bool:
            if await con.fetchval(LOCK_HELD_BY_SQL, (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF, app):
                return False
            return await node_connected(con, key_of("node", node), app)
        return ("unheld" if await self.store.link.run(check, write=False) else "running"), None

    async def _watch(self, node: str) -> None:
        """Until ``node`` is gone and every turn it left running here is closed (module doc): its
        liveness lock being free is not enough, as it is free too while the node reconnects; a turn
        whose session is still locked is tried again after ``dead_node_retry_ms``. After this watch's
        own connection broke (PostgreSQL restarted: every node is reconnecting, at its own pace), the
        node is not taken for dead before ``reconnect_grace_ms``."""
        retry_s = self.config.dead_node_retry_ms / 1000
        left: list[str] = []
        broke = False
        try:
            while True:
                try:
                    await self.holder.wait_node_gone(key_of("node", node), NODE_APP_PREFIX + node, retry_s,
                                                     self.reconnect_grace_s if broke else 0.0)
                except StorageClosed:
                    return
                except Exception as exc:        # PostgreSQL unreachable or restarted: watch again
                    log.warning("cluster: cannot watch node %s yet (%s)", node, exc)
                    broke = True
                    await asyncio.sleep(retry_s)
                    continue
                broke = False
                left = [sid for sid, entry in self.remote_turns.items() if entry[0] == node]
                done = await asyncio.gather(*(self.close_interrupted(sid) for sid in left))
                if all(done):
                    break
                log.info("cluster: node %s let go of its liveness lock, but %d of its sessions are still "
                         "locked (it may be reconnecting): watching it again", node, len(done) - sum(done))
                await asyncio.sleep(retry_s)
        finally:
            if self._watchers.get(node) is asyncio.current_task():
                del self._watchers[node]
        self.relay.forget_peer(node)
        (log.warning if left else log.info)("cluster: node %s is gone, %d of its turns were left running",
                                            node, len(left))

    async def close_interrupted(self, session_id: str) -> bool:
        """Close the turn a dead node left running in ``session_id``: True once that is done (here, or
        by another node: nothing left to close). False while the session is locked (its node may be
        alive and reconnecting; or another node is closing it, or runs a turn, which closes it first:
        its TURN_END then ends the watch of this turn) or PostgreSQL cannot be reached."""
        if session_id not in self.remote_turns:
            return True
        key = key_of("session", session_id)
        try:
            if not await self.holder.try_lock(key):
                return session_id not in self.remote_turns
        except Exception as exc:
            log.warning("cluster: cannot close the interrupted turn of %s yet (%s)", session_id, exc)
            return False
        try:
            await self.repair(session_id)
            return True
        except Exception as exc:
            log.warning("cluster: cannot close the interrupted turn of %s yet (%s)", session_id, exc)
            return False
        finally:
            await self.holder.unlock(key)

    async def repair(self, session_id: str, last: Any = _UNREAD) -> None:
        """With the session's lock held: if its last message (``last``: as read when the lock was
        taken, else read now) is an unanswered user message (a turn cut short by a dead node), store
        the message closing it as interrupted and announce it. (Always read: a node can die before
        the notification of its turn's start went out.)"""
        if last is _UNREAD:
            try:
                page = await self.store.page(session_id, limit=1)
            except (NotFound, InvalidSessionId):
                self._forget_remote(session_id)
                return
            last = page.messages[-1] if page.messages else None
        entry = self._forget_remote(session_id)
        if last is None or last.role != "user":
            return
        closing = interrupted_message(last, detected_at=now_iso())
        msg = await self.store.append(session_id, "assistant", closing.content, metadata=closing.metadata)
        self.interrupted += 1
        log.warning("cluster: turn of message %d in %s closed as interrupted", last.id, session_id)
        if entry is not None and entry[2] == last.id:
            self.relay.closed_here(entry[1])       # (what its node still sends of it is not shown here)
            self.hub.publish_turn(session_id, TurnEnd(session_id, entry[1], message_obj(msg), {}, "interrupted", {}))
        self._spawn(self.sessions.publish_updated(session_id))


def _end_of(session_id: str, turn_id: str, answer: Any) -> TurnEnd | TurnError:
    """The end of another node's turn whose own end was lost here, from its stored answer: TURN_ERROR
    for a failed turn (its stored partial answer), else TURN_END."""
    meta = answer.metadata
    if meta.get("finish_reason") == "error":
        return TurnError(session_id, turn_id, error_code(str(meta.get("error") or "INTERNAL")),
                         str(meta.get("error_message") or ""), message_obj(answer))
    return TurnEnd(session_id, turn_id, message_obj(answer), meta.get("usage") or {},
                   str(meta.get("finish_reason") or "stop"), meta.get("context") or {})


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

    def __init__(self, cluster: Cluster) -> None:
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
        stayed up (the common case)."""
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
