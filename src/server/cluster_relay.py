"""Turn and session events between nodes (issue 17): this node's hub events go out through
PostgreSQL NOTIFY, other nodes' events come back into the local hub.

Out: the hub calls ``turn`` / ``user`` / ``session`` for every event it publishes locally (cheap: the
event is queued). A sender task wakes, waits ``batch_ms`` so deltas of the same turn coalesce into
one, and sends everything queued in one round trip: notifications of at most 7900 bytes, each a list
of compact items, numbered per node (PostgreSQL drops duplicate payloads within a transaction).
Large payloads go by reference: TURN_START and TURN_END / TURN_ERROR name the stored message by id
(the listener reads the row); any other item over ``MAX_ITEM_BYTES`` is spilled to
``nplt_cluster_events`` (with its session's id) and the notification carries its id and the item's
head (its kind, session or user, turn: what a listener needs to know whether it wants the row).
Spilled rows are deleted after ``SPILL_KEEP_S`` by a cleanup every ``SPILL_CLEANUP_S`` on every node,
and at once, by the node that did it, when their session is purged, deleted or cleared.

In: items are handled one at a time in delivery order (events of one turn stay in order). Rows are
read only when a local subscriber is attached to the session (a spilled turn state only on the node
that asked for it). ``on_start(node, session, turn, message id)`` and ``on_end(session, turn)``
report other nodes' turns (for the dead-node watch). The events of a turn this node runs, or closed
as interrupted (``closed_here``: its node was taken for dead), that come from another node (it
closed this node's turn; or the turn's node was alive after all) are not shown to local clients,
which have that turn's end already or will have it from this node: a client sees one end a turn.

Peers: events are sent only while another node is known to listen (``peers``), so a node alone on its
database makes no NOTIFY at all. At start a node reads the nodes connected to the database (their lock
connections' ``application_name``, ``nplt-node:<id>``), says hello to them and waits (at most
``hello_wait_s``) until each has answered, so they relay to it before it serves clients; a node is
also known as a peer from any notification it sends, and forgotten when it says goodbye at close or
its death is seen (``Cluster``).

Lost events. A notification sent while a node's listener was reconnecting is lost for that node, and
a batch this node could not send (PostgreSQL unreachable past the retry policy) is lost for all: so
``on_gap(node)`` is called after this node's listener reconnected (``node`` None: anything may have
been missed), and, on the other nodes, with this node's id once it can send again after a batch was
lost (a ``"k"`` control item, tried every ``LOST_RESEND_S`` until it goes out). ``Cluster`` then checks
the other nodes' turns it believes running against PostgreSQL (a turn whose TURN_END was lost would
otherwise look running forever).

Control items (``control``): requests between nodes that are not hub events (``server.cluster_cancel``:
cancel a turn, the answer to that). They travel in the same queue, so in order with the events, and
are handed to ``on_control(node, item)`` on the other nodes. A SESSION_EVENT ``deleted`` from another
node is also reported to ``on_deleted(user, session)`` (this node's clients of it are moved).

Every SESSION_EVENT ``cleared``, ``deleted`` or ``purged`` from another node (``FORGET_SPILLED_KINDS``)
is reported to ``on_session_gone(user, session, kind)``, whether or not a client of the user is
attached here (the memory layer cancels a summary this node is writing for it, with its model call,
and drops its caches of the session: ``MemoryManager.forget_remote``). When such an event is spilled,
its head carries its kind and session, so the report needs no row (the node that sent it deletes the
session's spilled rows at once).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import orjson

from protocol.server_events import (AnswerDelta, ServerEvent, SessionEvent, TurnEnd, TurnError,
                                    TurnStart, decode_event)
from server.errors import error_code
from server.hub import Hub
from server.wire import message_obj
from storage.errors import StorageError
from storage.pg.link import PgLink
from storage.pg.notify import MAX_PAYLOAD_BYTES, Listener
from storage.pg.relay import forget_spilled, notify_many, read_spilled, spill

log = logging.getLogger("nplt.cluster")

CHANNEL = "nplt_cluster"
MAX_ITEM_BYTES = 7000            # an item over this is spilled to the table
MAX_DELTA_CHARS = 2000           # coalesced delta text per item (3 bytes a character at worst)
SPILL_CLEANUP_S = 60.0           # spilled rows older than storage.pg.relay.SPILL_KEEP_S are deleted this often
FORGET_SPILLED_KINDS = ("deleted", "cleared", "purged")   # SESSION_EVENTs after which a session's rows go
CLOSED_TURNS_KEPT = 1000          # turns closed here as interrupted whose late events are dropped (``closed_here``)
CONTROL_KINDS = ("c", "r", "g", "v", "h", "a", "b", "k")   # cancel request, its answer (server.cluster_cancel);
                                            # turn state request, its answer (server.cluster_state);
                                            # hello, its answer, goodbye (peers); events of mine were lost
LOST_RESEND_S = 1.0              # after a batch could not be sent, the "k" item is tried this often until it goes out
NODE_APP_PREFIX = "nplt-node:"              # application_name of a node's lock connections
SYNC_CHANNEL_PREFIX = "nplt_sync_"          # + node id: the channel of a node's barriers (``Relay.sync``)


class Relay:
    """The hub's relay (``Hub.relay``) and the listener of other nodes' events."""

    def __init__(self, node_id: str, link: PgLink, store: Any, hub: Hub, *, batch_ms: float,
                 on_start: Callable[[str, str, str, int], None], on_end: Callable[[str, str], None],
                 on_control: Callable[[str, list[Any]], None] | None = None,
                 on_deleted: Callable[[str, str], None] | None = None,
                 on_gap: Callable[[str | None], None] | None = None,
                 on_session_gone: Callable[[str, str, str], None] | None = None) -> None:
        self.node_id = node_id
        self.link = link
        self.store = store
        self.hub = hub
        self.batch_s = batch_ms / 1000
        self.on_start = on_start
        self.on_end = on_end
        self.on_control = on_control
        self.on_deleted = on_deleted
        self.on_gap = on_gap
        self.on_session_gone = on_session_gone   # (user, session, kind): see the module doc
        self.lost = False                 # a batch could not be sent: the peers are told ("k") when one can
        self.resend_s = LOST_RESEND_S
        self.peers: set[str] = set()      # other nodes listening: events are sent only if there is one
        self._unanswered: set[str] = set()  # peers whose answer to this node's hello is awaited
        self._answered = asyncio.Event()
        self.sent = 0                     # notifications sent
        self.received = 0                 # items from other nodes
        self._queue: list[list[Any]] = []
        self._open_delta: dict[str, list[Any]] = {}   # turn id -> its delta item still in the queue
        self._local_turns: set[str] = set()          # turns of this node, started and not ended, told to peers
        self._closed_turns: dict[str, None] = {}     # other nodes' turns closed here (``closed_here``), oldest first
        self._wake = asyncio.Event()
        self._sending = asyncio.Lock()
        self._seq = 0
        self._prefix = orjson.dumps(node_id).decode()
        self._sender: asyncio.Task | None = None
        self._cleaner: asyncio.Task | None = None
        self._forget: set[str] = set()    # sessions whose spilled rows are to be deleted now
        self._clean_now = asyncio.Event()
        self.sync_channel = SYNC_CHANNEL_PREFIX + node_id   # this node's barriers (``sync``)
        self._syncs: dict[int, asyncio.Future[None]] = {}   # barriers sent, not back yet: token -> waiters
        self._next_barrier: asyncio.Future[None] | None = None   # the waiters of the barrier not sent yet
        self._barrier_task: asyncio.Task | None = None
        self.barriers = 0                 # barriers sent, the last one's token (one serves every caller waiting)
        self.listener = Listener(link, [CHANNEL, self.sync_channel], self._on_notification, self._listener_gap)

    async def start(self, hello_wait_s: float = 1.0) -> None:
        await self.listener.start()
        self._sender = asyncio.get_running_loop().create_task(self._send_loop(), name="cluster-sender")
        self._cleaner = asyncio.get_running_loop().create_task(self._clean_loop(), name="cluster-spill-cleanup")
        rows = await self.link.run(lambda con: con.fetch(
            "SELECT DISTINCT substr(application_name, $1) AS id FROM pg_stat_activity "
            "WHERE starts_with(application_name, $2)", len(NODE_APP_PREFIX) + 1, NODE_APP_PREFIX), write=False)
        others = {r["id"] for r in rows} - {self.node_id}
        if not others:
            return
        self.peers |= others
        self._unanswered = set(others)
        self.control(["h"])
        try:
            async with asyncio.timeout(hello_wait_s):
                await self._answered.wait()
        except TimeoutError:            # a node starting at the same time, or one just gone
            log.info("cluster: no hello answer from %s", ", ".join(sorted(self._unanswered)))

    async def close(self) -> None:
        if self._sender is not None:
            if self.peers:
                self.control(["b"])
            await self.flush()
            self._sender.cancel()
            try:
                await self._sender
            except asyncio.CancelledError:
                pass
        if self._barrier_task is not None:
            self._barrier_task.cancel()
        if self._cleaner is not None:
            self._cleaner.cancel()
            try:
                await self._cleaner
            except asyncio.CancelledError:
                pass
        await self.listener.close()

    async def flush(self) -> None:
        """Send what is queued now, after what is being sent (batches go out in order). Called before a
        session's lock is released, so the next node's turn follows this one's TURN_END."""
        async with self._sending:
            items, self._queue = self._queue, []
            self._open_delta.clear()
            queued = len(items)
            if self.lost:
                if self.peers:
                    items.append(["k"])   # after what goes out with it: the peers check what they missed
                else:
                    self.lost = False     # (nobody to tell)
            if items:
                try:
                    await self._send(items)
                    self.lost = False
                except Exception as exc:
                    self.lost = True      # (the send loop tries again every resend_s)
                    if queued:
                        log.warning("cluster: %d events not sent to the other nodes (%s)", queued, exc)

    async def sync(self, timeout_s: float) -> bool:
        """Until every notification committed before this call has been handled here (at most
        ``timeout_s``); False if that was not confirmed in time. A barrier: a notification on this
        node's own channel, committed after this call, comes back after all those committed before it
        (PostgreSQL delivers them in commit order, and the listener handles them one at a time).
        Called with a session's lock just taken: what the previous holder sent before it let go (it
        flushes first) has then reached the local hub, and ``Cluster.remote_turns`` knows whether its
        turn has ended. Without peers there is nothing to wait for.

        The callers waiting while a barrier is being sent share the next one (``_send_barriers``):
        under load a node sends a barrier per round trip, not per turn."""
        if not self.peers:
            return True
        loop = asyncio.get_running_loop()
        done = self._next_barrier
        if done is None:
            done = self._next_barrier = loop.create_future()
        if self._barrier_task is None:
            self._barrier_task = loop.create_task(self._send_barriers())
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(done)
        except TimeoutError:        # the listener is reconnecting (what it missed is lost anyway)
            log.info("cluster: barrier not back within %.0f ms", timeout_s * 1000)
            return False
        return done.result()

    async def _send_barriers(self) -> None:
        """Send barriers while callers wait for one, one statement at a time: each barrier is sent
        after every caller it serves had asked for it (so after their locks were granted)."""
        try:
            while self._next_barrier is not None:
                done, self._next_barrier = self._next_barrier, None
                self.barriers += 1
                token = self.barriers
                self._syncs[token] = done
                try:
                    await self.link.run(lambda con: notify_many(con, self.sync_channel, [str(token)]), write=True)
                except StorageError as exc:  # PostgreSQL unreachable: the turn's own statements will say so
                    log.warning("cluster: barrier not sent (%s)", exc)
                    self._syncs.pop(token, None)
                    done.set_result(False)
        finally:
            self._barrier_task = None

    # -- out (called by the hub, on the event loop's hot path) --------------------------------------
    def turn(self, session_id: str, event: ServerEvent) -> None:
        if not self.peers:
            if self._local_turns and type(event) is not AnswerDelta:
                self._local_turns.discard(event.turn_id)     # (the peers went while it ran)
            return
        if type(event) is AnswerDelta:
            item = self._open_delta.get(event.turn_id)
            if item is not None and item[4] + item[5] == event.offset and item[5] + len(event.text) <= MAX_DELTA_CHARS:
                item[3].append(event.text)
                item[5] += len(event.text)
                return
            item = ["d", session_id, event.turn_id, [event.text], event.offset, len(event.text)]
            self._open_delta[event.turn_id] = item
            self._queue.append(item)
        else:
            self._open_delta.pop(event.turn_id, None)      # later deltas must follow this event
            self._queue.append(["t", session_id, event])
            tp = type(event)
            if tp is TurnStart:
                self._local_turns.add(event.turn_id)
            elif tp is TurnEnd or tp is TurnError:
                self._local_turns.discard(event.turn_id)
        self._wake.set()

    def closed_here(self, turn_id: str) -> None:
        """Another node's turn ``turn_id`` was closed here as interrupted (its node was taken for dead):
        what that node still sends of it is not shown to local clients, which had its end."""
        self._closed_turns[turn_id] = None
        if len(self._closed_turns) > CLOSED_TURNS_KEPT:
            del self._closed_turns[next(iter(self._closed_turns))]

    def _ended_here(self, turn_id: str) -> bool:
        """Whether another node's event of ``turn_id`` is not for local clients: the turn runs here (the
        other node closed it: this node ends it itself), or was closed here."""
        return turn_id in self._local_turns or turn_id in self._closed_turns

    def user(self, user_id: str, event: ServerEvent) -> None:
        if type(event) is SessionEvent and event.kind in FORGET_SPILLED_KINDS:
            self._forget.add(event.session_id)      # (whether or not other nodes listen now)
            self._clean_now.set()
        if self.peers:
            self._queue.append(["u", user_id, event])
            self._wake.set()

    def session(self, session_id: str, event: ServerEvent) -> None:
        if self.peers:
            self._queue.append(["p", session_id, event])
            self._wake.set()

    def control(self, item: list[Any]) -> None:
        """Queue a control item (its first element one of ``CONTROL_KINDS``) for the other nodes."""
        assert item[0] in CONTROL_KINDS
        if self.peers:
            self._queue.append(item)
            self._wake.set()

    async def _send_loop(self) -> None:
        while True:
            if self.lost:                 # a batch was lost: tell the peers as soon as a send goes out
                try:
                    async with asyncio.timeout(self.resend_s):
                        await self._wake.wait()
                except TimeoutError:
                    pass
            else:
                await self._wake.wait()
            if self.batch_s:
                await asyncio.sleep(self.batch_s)         # the batching interval (deltas coalesce)
            self._wake.clear()
            await self.flush()

    async def _clean_loop(self) -> None:
        """Delete the spilled rows that are old (every ``SPILL_CLEANUP_S``, whether or not this node
        spills: a node that stopped or died leaves its rows too) and, at once, those of the sessions
        purged, deleted or cleared on this node."""
        while True:
            try:
                async with asyncio.timeout(SPILL_CLEANUP_S):
                    await self._clean_now.wait()
            except TimeoutError:
                pass
            self._clean_now.clear()
            sessions, self._forget = self._forget, set()
            try:
                await self.link.run(lambda con: forget_spilled(con, sorted(sessions)), write=True)
            except Exception as exc:        # PostgreSQL unreachable: next time
                log.warning("cluster: spilled events not cleaned up (%s)", exc)
                self._forget |= sessions

    async def _send(self, items: list[list[Any]]) -> None:
        encoded = [_encode(item) for item in items]
        big = [i for i, raw in enumerate(encoded) if len(raw) > MAX_ITEM_BYTES]

        async def work(con: Any) -> None:
            if not big:                     # one statement, committed by itself: one round trip
                await notify_many(con, CHANNEL, self._pack(encoded))
                return
            async with con.transaction():   # the spilled rows and their notifications together
                ids = await spill(con, [encoded[i] for i in big], [_session_of(items[i]) for i in big])
                for i, spilled in zip(big, ids):
                    encoded[i] = orjson.dumps(["x", spilled, _head(items[i])])
                await notify_many(con, CHANNEL, self._pack(encoded))
        await self.link.run(work, write=True)

    def _pack(self, encoded: list[bytes]) -> list[str]:
        payloads: list[str] = []
        batch: list[bytes] = []
        size = 0
        for raw in encoded:
            if batch and size + len(raw) + 1 > MAX_PAYLOAD_BYTES - 64:
                payloads.append(self._payload(batch))
                batch, size = [], 0
            batch.append(raw)
            size += len(raw) + 1
        if batch:
            payloads.append(self._payload(batch))
        self.sent += len(payloads)
        return payloads

    def _payload(self, batch: list[bytes]) -> str:
        self._seq += 1
        return f'{{"n":{self._prefix},"q":{self._seq},"e":[{b",".join(batch).decode()}]}}'

    # -- in -------------------------------------------------------------------------------------------
    def _listener_gap(self) -> None:
        """The listener reconnected: what other nodes sent meanwhile is lost for this node."""
        log.info("cluster: the event listener reconnected; notifications sent meanwhile are lost here")
        if self.on_gap is not None:
            self.on_gap(None)

    async def _on_notification(self, channel: str, payload: Any) -> None:
        if channel == self.sync_channel:    # a barrier of this node's (``sync``): all before it is handled
            if type(payload) is int:        # (an earlier one still awaited was lost: this one covers it)
                for token in [t for t in self._syncs if t <= payload]:
                    done = self._syncs.pop(token)
                    if not done.done():
                        done.set_result(True)
            return
        if type(payload) is not dict:
            return
        node = payload.get("n")
        if node == self.node_id or not isinstance(node, str) or not isinstance(payload.get("e"), list):
            return
        self.peers.add(node)
        for item in payload["e"]:           # turns known as started at once (the taker of a session
            if item[0] == "s":                  # waits for their TURN_END, see Cluster.after_remote_turn)
                self.on_start(node, item[1], item[2], item[3])
        for item in payload["e"]:
            try:
                await self._deliver(node, item)
            except Exception:
                log.exception("cluster: an event from node %s could not be delivered", node)

    async def _deliver(self, node: str, item: list[Any]) -> None:
        self.received += 1
        kind = item[0]
        spilled = kind == "x"
        gone_told = False
        if spilled:
            head = item[2] if len(item) > 2 else None
            if isinstance(head, list) and len(head) >= 4 and head[0] == "u" and head[2] in FORGET_SPILLED_KINDS:
                self._session_gone(head[1], head[3], head[2])     # (from the head: the row may be gone)
                gone_told = True
            if isinstance(head, list) and head and not self._wanted(head):
                if head[0] == "t" and head[3] in (TurnEnd.TYPE, TurnError.TYPE):
                    self.on_end(head[1], head[2])
                return                      # nobody here follows it: the row is not read
            body = await read_spilled(self.link, item[1])
            if body is None:
                return
            item = orjson.loads(body)
            kind = item[0]
        hub = self.hub
        if kind in ("h", "a", "b", "k"):
            self._peer_item(node, item)
            return
        if kind in CONTROL_KINDS:
            if self.on_control is not None:
                self.on_control(node, item)
            return
        if kind == "u":
            if not gone_told:
                self._report_gone(item)
            if hub.user_subscribers(item[1]):
                event = decode_event(item[2], item[3])
                hub.publish_user(item[1], event, remote=True)
                if type(event) is SessionEvent and event.kind == "deleted" and self.on_deleted is not None:
                    self.on_deleted(item[1], event.session_id)
            return
        if kind == "p":
            hub.publish_session(item[1], decode_event(item[2], item[3]), remote=True)
            return
        sid, tid = item[1], item[2]
        if kind == "s" and spilled:
            self.on_start(node, sid, tid, item[3])
        try:
            # (else nobody here follows the session, or the turn's end is this node's: nothing to read)
            if hub.session_subscribers(sid) and not self._ended_here(tid):
                await self._publish_turn(kind, sid, tid, item)
        finally:
            if kind in ("e", "f") or (kind == "t" and item[3] in (TurnEnd.TYPE, TurnError.TYPE)):
                self.on_end(sid, tid)           # after its TURN_END went out here

    def _report_gone(self, item: list[Any]) -> None:
        """A user event ["u", user, type, fields] that is a SESSION_EVENT cleared, deleted or purged:
        to ``on_session_gone``."""
        fields = item[3] if len(item) > 3 else None
        if item[2] == SessionEvent.TYPE and isinstance(fields, dict) and fields.get("kind") in FORGET_SPILLED_KINDS:
            session = fields.get("session")
            sid = session.get("session_id") if isinstance(session, dict) else None
            if isinstance(sid, str):
                self._session_gone(item[1], sid, fields["kind"])

    def _session_gone(self, user_id: str, session_id: str, kind: str) -> None:
        if self.on_session_gone is None:
            return
        try:
            self.on_session_gone(user_id, session_id, kind)
        except Exception:
            log.exception("cluster: the %s of session %s on another node could not be applied here", kind, session_id)

    def _wanted(self, head: list[Any]) -> bool:
        """Whether this node has a use for a spilled item whose head (``_head``) is ``head``."""
        kind = head[0]
        if kind in ("d", "t", "p"):
            return bool(self.hub.session_subscribers(head[1]))
        if kind == "u":
            return bool(self.hub.user_subscribers(head[1]))
        if kind == "v":
            return head[2] == self.node_id
        return True

    def _peer_item(self, node: str, item: list[Any]) -> None:
        if item[0] == "h":                       # (the sender is a peer now: see _on_notification)
            self.control(["a", node])
        elif item[0] == "a" and len(item) > 1 and item[1] == self.node_id:
            self._unanswered.discard(node)
            if not self._unanswered:
                self._answered.set()
        elif item[0] == "b":
            self.forget_peer(node)
        elif item[0] == "k":                     # events of that node's were lost for every node
            log.info("cluster: node %s could not send some events", node)
            if self.on_gap is not None:
                self.on_gap(node)

    def forget_peer(self, node: str) -> None:
        """``node`` left (goodbye, or its death was seen): no more events for it."""
        self.peers.discard(node)
        self._unanswered.discard(node)
        if not self._unanswered:
            self._answered.set()

    async def _publish_turn(self, kind: str, sid: str, tid: str, item: list[Any]) -> None:
        hub = self.hub
        if kind == "d":
            event: ServerEvent = AnswerDelta(sid, tid, item[3], item[4])
        elif kind == "s":
            msg = await self._message(sid, item[3])
            if msg is None:
                return
            event = TurnStart(sid, tid, msg, item[4])
        elif kind == "e":
            msg = await self._message(sid, item[3])
            if msg is None:
                return
            event = TurnEnd(sid, tid, msg, item[4], item[5], item[6])
        elif kind == "f":
            event = TurnError(sid, tid, error_code(item[3]), item[4],
                              None if item[5] is None else await self._message(sid, item[5]))
        else:
            event = decode_event(item[3], item[4])
        hub.publish_turn(sid, event, remote=True)

    async def _message(self, session_id: str, message_id: int) -> Any:
        """The stored message, as the protocol object (None if it is gone: cleared or purged)."""
        page = await self.store.page(session_id, before=message_id + 1, limit=1)
        if page.messages and page.messages[-1].id == message_id:
            return message_obj(page.messages[-1])
        log.info("cluster: message %d of %s is gone; its event is dropped", message_id, session_id)
        return None


def _session_of(item: list[Any]) -> str | None:
    """The session a queued item belongs to (stored with it when it is spilled), if any."""
    kind = item[0]
    if kind in ("d", "t", "p"):
        return item[1]
    if kind == "u":
        return getattr(item[2], "session_id", None)
    if kind == "v" and isinstance(item[3], dict):
        return item[3].get("session_id")
    return None


def _head(item: list[Any]) -> list[Any] | None:
    """What a listener needs of a spilled item to know whether it reads the row (``Relay._wanted``)
    and, for a turn's end it does not read, which turn ended; None: every node reads it."""
    kind = item[0]
    if kind == "d":
        return ["d", item[1], item[2]]
    if kind == "t":       # (a turn's start is read everywhere: it starts the watch of its node)
        return None if type(item[2]) is TurnStart else ["t", item[1], item[2].turn_id, item[2].TYPE]
    if kind == "u" and type(item[2]) is SessionEvent and item[2].kind in FORGET_SPILLED_KINDS:
        return ["u", item[1], item[2].kind, item[2].session_id]   # (on_session_gone needs no row)
    if kind in ("p", "u"):
        return [kind, item[1]]
    if kind == "v":
        return ["v", item[1], item[2]]
    return None


def _encode(item: list[Any]) -> bytes:
    """One queued item as the compact JSON list the other nodes read."""
    kind = item[0]
    if kind in CONTROL_KINDS:
        return orjson.dumps(item)
    if kind == "d":
        return orjson.dumps(["d", item[1], item[2], "".join(item[3]), item[4]])
    event = item[2]
    if kind != "t":
        return orjson.dumps([kind, item[1], event.TYPE, event.encode()])
    sid = item[1]
    tp = type(event)
    if tp is TurnStart and event.user_message.id is not None:
        return orjson.dumps(["s", sid, event.turn_id, event.user_message.id, event.model])
    if tp is TurnEnd and event.message is not None and event.message.id is not None:
        return orjson.dumps(["e", sid, event.turn_id, event.message.id, event.usage, event.finish_reason,
                             event.context])
    if tp is TurnError:
        partial = event.partial_message
        if partial is None or partial.id is not None:
            return orjson.dumps(["f", sid, event.turn_id, str(event.code), event.message,
                                 None if partial is None else partial.id])
    return orjson.dumps(["t", sid, event.turn_id, tp.TYPE, event.encode()])
