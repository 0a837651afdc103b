"""V3Port: how the server talks to one v3 client: the send port of a request context and the
connection's hub subscriber.

It encodes typed replies and events (``server.wire``), frames (the connection's codec) and queues (its ``OutputBuffer``);
it never sees the connection itself. A reply over ``max_message_size`` is shrunk to fit
(``server.fit``), or refused with an ERROR when it must not be cut (an export).
"""
from __future__ import annotations

import logging
from typing import Any

import orjson

from protocol import Connection as Codec
from protocol import ErrorCode, MsgType, ProtocolError
from protocol.replies import ErrorReply, Reply
from server.fit import shrink_reply
from server.hub import Outgoing
from server.output import OutputBuffer
from server.wire import encode_event, encode_reply

log = logging.getLogger("nplt.conn")

_MAX_PAYLOAD = 65535
_ERROR, _RESPONSE = int(MsgType.ERROR), int(MsgType.RESPONSE)


class V3Port:
    """Send port and hub subscriber of one v3 connection."""

    __slots__ = ("codec", "output", "limit", "name", "user_id", "session_id", "_held")
    needs_session = False      # a v3 client may be without a session (HELLO never creates one)

    def __init__(self, codec: Codec, output: OutputBuffer, max_message_size: int, name: str) -> None:
        self.codec = codec
        self.output = output
        self.limit = max_message_size
        self.name = name
        self.user_id: str | None = None
        self.session_id: str | None = None
        self._held: list[tuple[int, bytes]] | None = None   # events waiting for the next reply (hold_events)

    @property
    def closed(self) -> bool:
        return self.output.stopped or self.codec.closed

    # -- sending ----------------------------------------------------------------------------------
    def send(self, msg_type: int, body: dict[str, Any]) -> None:
        """Encode and queue one message (fragmented if large). Raises ProtocolError if too large."""
        if self.closed:
            return
        self.output.write(self.codec.send(msg_type, body))

    def send_payload(self, msg_type: int, payload: bytes) -> None:
        """Queue an already JSON-encoded body (shared between connections by the hub)."""
        if self.output.stopped or self.codec.closed:   # (self.closed, inlined: once per event)
            return
        try:
            if len(payload) <= _MAX_PAYLOAD:
                data = self.codec.send_raw(msg_type, payload)
            else:
                data = self.codec.send(msg_type, payload)
        except ProtocolError as exc:
            log.warning("connection %s: event %s dropped: %s", self.name, msg_type, exc.message)
            return
        self.output.write(data)

    def send_frames(self, frames: Any) -> None:
        """Queue frames already encoded by the codec (binary data frames, ``protocol.binary``)."""
        for frame in frames:
            if self.closed:
                return
            self.output.write(frame)

    def when_drained(self, callback: Any) -> None:
        """``callback()`` once the next reply (queued right after this call) has left the server, or
        the connection is gone (``OutputBuffer.when_drained``)."""
        self.output.when_drained(callback)

    async def writable(self) -> None:
        """Wait while the client does not read (the transport is over its high-water mark)."""
        await self.output.wait_writable()

    def send_error(self, re: Any, code: ErrorCode, message: str, fatal: bool = False) -> None:
        self.send(_ERROR, encode_reply(re, ErrorReply(code, message, fatal)))
        self._release()

    def answer(self, msg_type: int, rid: Any, reply: Reply) -> None:
        """A reply that always fits (PONG)."""
        self.send(msg_type, encode_reply(rid, reply))

    def respond(self, rid: Any, reply: Reply, *, page: bool = False, shrink: bool = True) -> None:
        """RESPONSE ``reply`` to request ``rid``; a body over max_message_size is shrunk to fit
        (``page``: a history page, whose oldest messages go first) or, with ``shrink`` false,
        refused with an ERROR. Events held meanwhile (``hold_events``) follow it."""
        self._respond(rid, reply, page, shrink)
        self._release()

    def _respond(self, rid: Any, reply: Reply, page: bool, shrink: bool) -> None:
        body = encode_reply(rid, reply)
        try:
            self.send(_RESPONSE, body)
            return
        except ProtocolError as exc:
            if exc.code != ErrorCode.MESSAGE_TOO_LARGE or not shrink:
                self.send_error(rid, exc.code, f"reply not sent: {exc.message}")
                return
        if page:                         # pre-encoded messages (orjson.Fragment) become plain objects
            body = orjson.loads(orjson.dumps(body))
        body = shrink_reply(body, self.limit, page=page)
        try:
            self.send(_RESPONSE, body)
        except ProtocolError as exc:
            self.send_error(rid, exc.code, f"reply not sent: {exc.message}")

    # -- hub subscriber ---------------------------------------------------------------------------
    def turn_event(self, out: Outgoing, mine: bool, re: Any) -> None:
        payload = encode_event(out.event, re, self.limit) if mine and re is not None else out.shared(self.limit)
        if self._held is not None:
            self._held.append((out.type, payload))
        else:
            self.send_payload(out.type, payload)

    def event(self, out: Outgoing) -> None:
        if self._held is not None:
            self._held.append((out.type, out.shared(self.limit)))
        else:
            self.send_payload(out.type, out.shared(self.limit))

    def hold_events(self) -> None:
        """Hold events (not framed yet) until the next reply or error has been sent: a reply that
        waits for another node (``server.cluster_state``) goes out before the events that arrived
        meanwhile, as a reply built at once would. Requests of a connection run one at a time, so
        the next reply is that request's."""
        if self._held is None:
            self._held = []

    def _release(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            for msg_type, payload in held:
                self.send_payload(msg_type, payload)

    def session_moved(self, deleted_id: str, new_id: str) -> None:
        """A v3 client learns it from SESSION_EVENT ``deleted`` (and its next HELLO or switch)."""
