"""This node's part in a cluster of server nodes sharing one PostgreSQL database (issue 17).

Built by ``services.build_services`` only when the store is PostgreSQL (the JSON backend has no
cluster component at all), started and closed by ``server.app.Server``. It owns:

- ``relay`` (``server.cluster_relay``): the hub's events go to the other nodes and theirs come into
  the local hub, so a client of any node follows a session wherever its turns run;
- ``turn_lock`` (``server.cluster_lock.ClusterTurnLock``): what the TurnRunner takes around each turn, so at most one turn
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
from server.cluster_lock import ClusterTurnLock
from server.cluster_state import RemoteTurnState
from server.hub import Hub
from server.errors import error_code
from server.wire import message_obj
from storage.errors import InvalidSessionId, NotFound, StorageClosed
from storage.models import now_iso
from storage.pg.lock_holder import LockHolder, key_of, node_connected

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
                           on_gap=self._on_gap, on_session_gone=self._on_session_gone)
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

    def _on_session_gone(self, user_id: str, session_id: str, kind: str) -> None:
        """Another node cleared, deleted or purged ``session_id``: the memory layer drops what this
        node holds of it (a summary being written is cancelled with its model call)."""
        forget = getattr(getattr(self.sessions, "memory", None), "forget_remote", None)
        if forget is not None:
            forget(session_id)

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
