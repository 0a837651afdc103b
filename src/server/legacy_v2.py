"""Legacy NPLT v2 connections (docs/protocol.md §7): served as the original system did, minus its bugs.

Requests are handled one at a time, in order (v2 has no request ids), and each non-chat request is
answered with exactly ONE ``CHAT_TEXT`` (at most 65535 bytes of UTF-8: longer replies are cut, never
split). A turn streams AGENT_THOUGHT status JSON, the answer as CHAT_TEXT chunks (split at UTF-8
boundaries), then an empty CHAT_TEXT, the end marker. Nothing is ever written between a turn's
TURN_START and its end marker but that turn's own frames: after submitting a chat, the request
worker waits until the turn has ended (anything the client sends meanwhile is answered after the end
marker, in order; HEARTBEAT too, since its reply is a CHAT_TEXT that would read as answer text), and
notices (``session_moved``) go through the same queue. A chat queued behind other turns of the
session (a v3 client's) opens its answer at once: ``stream_start`` and a ``thinking`` status
"queued behind N turn(s)"; its TURN_START then sends no second ``stream_start``. ``HISTORY_REQUEST``
pages leave out superseded messages as default v3 pages do (``handlers.history.visible_page``). Nothing but v2 type
codes is ever sent: requests that cannot be served are answered in text or ignored. A v2 connection
sees the events of the turns it started itself (not those of v3 clients on the same session), and
has no token, so a server with users configured refuses v2 connections with an explanation.

The adapter is the connection's hub subscriber, like a v3 port: it translates the turn events of
its own turns into v2 frames and ignores the rest. Requests go through its own table
(``V2_HANDLERS``); it talks to the connection only through the small ``V2Host`` interface.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Protocol

import orjson

from protocol import Connection as Codec
from protocol import ErrorCode, InvalidMessage, Message, MsgType, ProtocolError, split_text_utf8
from protocol.textsplit import cut_text_utf8
from server import legacy_v2_files as files
from server import legacy_v2_sessions as sessions
from server.auth import LOCAL_USER
from server.config import LimitsConfig
from server.errors import HandlerError, failure_of
from server.handlers.history import visible_page
from protocol.server_events import (AnswerDelta, ServerEvent, ToolCallEvent, ToolResultEvent, TurnEnd, TurnError,
                                    TurnStart, TurnStatus)
from server.hub import Outgoing
from server.legacy_v2_history import (MAX_FRAME_TEXT, HistoryRequestError, error_document,
                                      history_document, parse_history_request)
from server.services import Services
from storage.models import SessionRecord

log = logging.getLogger("nplt.v2")

_STOP = object()


class V2Host(Protocol):
    """What the adapter needs of its connection."""

    codec: Codec
    limits: LimitsConfig
    conn_id: int

    @property
    def closing(self) -> bool: ...
    def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


class _Notice:
    """A text for the client that is not a reply (``session_moved``), queued behind the requests."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class LegacyV2:
    """The v2 side of one connection, and its hub subscriber."""

    max_reply_bytes = MAX_FRAME_TEXT
    needs_session = True       # every v2 command works on a current session

    def __init__(self, host: V2Host, services: Services) -> None:
        self.host = host
        self.services = services
        self.user_id: str | None = None
        self.session_id: str | None = None
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.worker: asyncio.Task | None = None
        self.streamed: set[str] = set()
        self.paused = False
        self.streaming = False                      # between a turn's TURN_START and its end marker
        self.idle = False       # the worker waits on an empty queue (the codec may answer heartbeats)
        self._turn_done: asyncio.Event | None = None  # set when the turn the worker waits for ends

    # -- plumbing ------------------------------------------------------------------------------------
    def start(self) -> None:
        self.worker = asyncio.get_running_loop().create_task(self._run())

    def on_events(self, events: list) -> None:
        for ev in events:
            self.queue.put_nowait(ev)
        if self.queue.qsize() > self.host.limits.max_pending_requests and not self.paused:
            self.paused = True
            self.host.pause_reading()

    def stop(self) -> None:
        """The client will send nothing more: the worker ends after what is queued (answers included)."""
        self.queue.put_nowait(_STOP)

    def abort(self) -> None:
        """The connection is gone: the worker ends now (a turn it waits for runs on without it), and
        its downloads stop (``legacy_v2_files.connection_closed``)."""
        self.queue.put_nowait(_STOP)
        files.connection_closed(self)
        if self._turn_done is not None:
            self._turn_done.set()

    # -- hub subscriber ------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self.host.closing

    def turn_event(self, out: Outgoing, mine: bool, re: Any) -> None:
        try:
            self.on_turn_event(out.event, mine)
        except Exception:   # one broken connection must not stop the turn or the others
            log.exception("v2 connection %s failed on a turn event; closing it", self.host.conn_id)
            self.host.close()

    def event(self, out: Outgoing) -> None:
        """Session events and notices have no v2 form: v2 clients learn changes from replies."""

    def hold_events(self) -> None:
        """(v3 only: no v2 reply waits for another node.)"""

    def session_moved(self, deleted_id: str, new_id: str) -> None:
        """Another connection deleted this connection's session and re-attached it to ``new_id``.

        The client is told in a CHAT_TEXT queued behind its pending requests, so it never lands
        inside a running answer.
        """
        self.on_events([_Notice(f"Session {deleted_id} was deleted; you are now in session {new_id}.")])

    # -- output --------------------------------------------------------------------------------------
    def _send(self, msg_type: MsgType, payload: bytes) -> None:
        """Frame and queue one frame; nothing once the connection is closing (its codec may be closed)."""
        host = self.host
        if host.closing or host.codec.closed:
            return
        host.write(host.codec.send(msg_type, payload))

    def _write_text(self, text: str) -> None:
        """CHAT_TEXT frames carrying ``text`` (an answer's chunks; nothing for empty text)."""
        for chunk in split_text_utf8(text, MAX_FRAME_TEXT):
            self._send(MsgType.CHAT_TEXT, chunk)

    def reply(self, text: str) -> None:
        """One CHAT_TEXT frame: ``text``, cut (marked "…") if its UTF-8 is over one frame."""
        data = (text or " ").encode()
        if len(data) > MAX_FRAME_TEXT:
            data = cut_text_utf8(text, MAX_FRAME_TEXT).encode()
        self._send(MsgType.CHAT_TEXT, data)

    def send_text(self, text: str) -> None:
        """A last word before the connection closes (shutdown): an open answer is ended first."""
        if self.streaming:
            self.send_end()
        self.reply(text)

    def send_end(self) -> None:
        self.streaming = False
        self._send(MsgType.CHAT_TEXT, b"")

    def thought(self, kind: str, content: Any) -> None:
        payload = orjson.dumps({"type": kind, "content": content})
        if len(payload) > MAX_FRAME_TEXT:
            payload = orjson.dumps({"type": kind, "content": str(content)[:4000] + "…"})
        self._send(MsgType.AGENT_THOUGHT, payload)

    async def _run(self) -> None:
        """The request worker. It never ends with an exception: a request that fails is answered with
        its error (or, on a connection already closing, dropped), and an unexpected failure outside a
        request is logged once and closes the connection."""
        try:
            await self._serve()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("v2 worker of connection %s failed; closing it", self.host.conn_id)
            self.host.close()

    async def _serve(self) -> None:
        try:
            welcomed = await self._welcome()
        except Exception as exc:
            if self.host.closing:
                return
            err = failure_of(exc)
            if err is None:
                raise
            self.reply(f"Error: {err.message}")
            self.host.close()
            return
        if not welcomed:
            return
        queue = self.queue
        while True:
            if queue.empty():
                self.idle = True
                try:
                    ev = await queue.get()
                finally:
                    self.idle = False
            else:
                ev = queue.get_nowait()
            if ev is _STOP or self.host.closing:
                return
            if self.paused and self.queue.qsize() <= self.host.limits.max_pending_requests // 2:
                self.paused = False
                self.host.resume_reading()
            try:
                await self._handle(ev)
            except Exception as exc:
                if self.host.closing:  # the client left meanwhile: nobody to tell
                    return
                err = failure_of(exc)
                if err is None:
                    log.exception("v2 request failed on connection %s", self.host.conn_id)
                    problem = "internal error"
                else:
                    problem = err.message
                if getattr(ev, "type", None) == MsgType.CHAT_TEXT:
                    self._chat_error(problem)
                else:
                    self.reply(f"Error: {problem}")

    async def _welcome(self) -> bool:
        svc = self.services
        if svc.auth.enabled:
            self.reply("This server requires authentication: connect with an NPLT v3 client and a token.")
            self.host.close()
            return False
        rec, _ = await svc.sessions.newest_or_new(LOCAL_USER)
        if self.host.closing:
            return False
        svc.hub.add_user(self, LOCAL_USER)
        svc.hub.attach(self, rec.session_id)
        self.reply(f"Welcome to NPLT Assistant ({svc.agent.name}). Session: {rec.session_id} "
                   f"({rec.message_count} messages). Type a message to chat.")
        return True

    async def current(self) -> tuple[SessionRecord, str]:
        """The connection's session and "" if it still exists; otherwise the connection is moved to
        the user's newest session (or a new one) and the second item says so."""
        svc = self.services
        old = self.session_id
        try:
            return await svc.sessions.owned(LOCAL_USER, old), ""
        except HandlerError as exc:
            if exc.code != ErrorCode.NOT_FOUND:
                raise
        rec, created = await svc.sessions.newest_or_new(LOCAL_USER)
        svc.hub.attach(self, rec.session_id)
        if created:
            await svc.sessions.publish_event("created", rec)
        return rec, (f"Session {old} was deleted; you are now in session {rec.session_id} "
                     f"({rec.message_count} messages).")

    # -- requests ------------------------------------------------------------------------------------
    async def _handle(self, ev: Message | InvalidMessage | _Notice) -> None:
        if isinstance(ev, _Notice):
            self.reply(ev.text)
            return
        if isinstance(ev, InvalidMessage):
            if ev.type == MsgType.CHAT_TEXT:
                self._chat_error(ev.error.message)
            return
        handler = V2_HANDLERS.get(ev.type)
        if handler is None:  # CLIENT_UDP_PORT (no UDP transfer), FILE_DATA, unknown and v3-only codes
            log.debug("v2 connection %s: ignored frame type 0x%02X", self.host.conn_id, int(ev.type))
            return
        await handler(self, ev)

    def _chat_error(self, problem: str) -> None:
        """A chat that starts no turn is answered like one: the error text, then the end marker."""
        self.reply(f"Error: {problem}")
        self.send_end()

    async def chat(self, ev: Message) -> None:
        try:
            text = ev.text
        except ProtocolError as exc:
            self._chat_error(exc.message)
            return
        if text == "HEARTBEAT":
            self.reply("HEARTBEAT")
            return
        cap = self.host.limits.max_text_chars
        if not text.strip():
            self._chat_error("empty message")
            return
        if len(text) > cap:
            self._chat_error(f"message too long ({len(text)} characters, at most {cap})")
            return
        try:
            rec, note = await self.current()
            if self.host.closing:   # the client left meanwhile: start no turn for nobody
                return
            if note:
                self._chat_error(f"{note} Your message was not sent; send it again.")
                return
            done = self._turn_done = asyncio.Event()
            _turn, ahead = await self.services.runner.submit(self, LOCAL_USER, rec.session_id, text)
            if ahead and not self.host.closing:
                # Queued behind other turns of the session (a v3 client's): the answer opens now, so the
                # client knows its message was taken and waits (nothing was awaited since the submit:
                # the turn cannot have started). Its TURN_START then opens nothing more.
                self.streaming = True
                self.thought("stream_start", "")
                self.thought("thinking", f"queued behind {ahead} turn{'' if ahead == 1 else 's'}")
        except Exception as exc:
            self._turn_done = None
            err = failure_of(exc)
            if err is None:
                raise
            self._chat_error(err.message)
            return
        try:
            if not self.host.closing:  # (once closed, abort() sets it: no await between)
                await done.wait()  # the next request is handled once this turn's end marker is out
        finally:
            self._turn_done = None

    async def history(self, ev: Message) -> None:
        """One CHAT_TEXT: the history document, or ``{"error": {"code", "message"}}``."""
        try:
            before, limit = parse_history_request(ev.body, self.host.limits.max_page_size)
            rec, note = await self.current()
            if note:
                raise HistoryRequestError(ErrorCode.NOT_FOUND, f"{note} Send the request again for its history.")
            # as a default v3 page: superseded messages left out, stretches of them paged past
            page = await visible_page(self.services.store, rec.session_id, before, limit)
        except HistoryRequestError as exc:
            self.reply(error_document(exc.code, exc.message))
            return
        except Exception as exc:
            err = failure_of(exc)
            if err is None:
                log.exception("v2 history request failed on connection %s", self.host.conn_id)
                err = HandlerError(ErrorCode.INTERNAL, "internal error")
            self.reply(error_document(err.code, err.message))
            return
        self.reply(history_document(rec.session_id, page))

    # -- turn events ---------------------------------------------------------------------------------
    def on_turn_event(self, event: ServerEvent, is_origin: bool) -> None:
        """Translate a typed turn event of a turn this connection started into v2 frames."""
        if not is_origin or self.host.closing:
            return
        match event:
            case AnswerDelta(turn_id=turn_id, text=text):
                self.streamed.add(turn_id)
                self._write_text(text)
            case TurnStart():
                if not self.streaming:     # (already open for a queued turn: ``chat``)
                    self.streaming = True
                    self.thought("stream_start", "")
            case TurnStatus(status=status, detail=detail):
                self.thought(status, detail or "")
            case ToolCallEvent(call=call):
                self.thought("tool_call", f"{call.tool_name} {orjson.dumps(call.arguments).decode()}")
            case ToolResultEvent(call=call):
                self.thought("tool_call", f"{call.tool_name}: {call.status} ({call.duration:.2f} s)")
            case TurnEnd(turn_id=turn_id, message=message):
                if message is None:   # a queued turn withdrawn before it started (delete, clear)
                    self._write_text("[cancelled before it started; nothing was stored]")
                elif turn_id not in self.streamed:
                    self._write_text(message.content)
                self._end_turn(turn_id)
            case TurnError(turn_id=turn_id, code=code, message=message):
                self._write_text(f"\n[error {code}] {message}")
                self._end_turn(turn_id)

    def _end_turn(self, turn_id: str) -> None:
        self.streamed.discard(turn_id)
        self.send_end()
        if self._turn_done is not None:
            self._turn_done.set()


V2Handler = Callable[[LegacyV2, Message], Awaitable[None]]

# THE v2 dispatch table: type code -> handler (the adapter, the request). Other codes are ignored.
V2_HANDLERS: dict[int, V2Handler] = {
    MsgType.CHAT_TEXT: LegacyV2.chat,
    MsgType.HISTORY_REQUEST: LegacyV2.history,
    MsgType.SESSION_LIST: sessions.session_list,
    MsgType.SESSION_NEW: sessions.session_new,
    MsgType.SESSION_SWITCH: sessions.session_switch,
    MsgType.SESSION_DELETE: sessions.session_delete,
    MsgType.CLEAR_REQUEST: sessions.clear,
    MsgType.MODEL_SWITCH: sessions.model_switch,
    MsgType.FILE_METADATA: files.file_metadata,
    MsgType.FILE_DATA: files.file_data,
    MsgType.CLIENT_UDP_PORT: files.client_udp_port,
}
