"""Legacy NPLT v2 connections (docs/protocol.md §7): served as the original system did, minus its bugs.

Requests are handled one at a time, in order (v2 has no request ids). Answers are CHAT_TEXT text,
split at UTF-8 boundaries so no frame exceeds 65535 bytes; a turn streams AGENT_THOUGHT status JSON,
the answer as CHAT_TEXT chunks, then an empty CHAT_TEXT. Nothing but v2 type codes is ever sent:
requests that cannot be served are answered in text or ignored. A v2 connection sees the events of
the turns it started itself (not those of v3 clients on the same session), and has no token, so a
server with users configured refuses v2 connections with an explanation.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import orjson

from protocol import InvalidMessage, Message, MsgType, ProtocolError, split_text_utf8
from server.auth import LOCAL_USER
from server.errors import HandlerError
from storage.errors import StorageError

if TYPE_CHECKING:  # pragma: no cover
    from server.connection import ServerConnection

log = logging.getLogger("nplt.v2")

MAX_FRAME_TEXT = 65535
_STOP = object()


def _ref(payload: bytes, key: str) -> str:
    """``{"<key>": value}`` JSON, a JSON string, or the bare text."""
    text = payload.decode("utf-8", errors="replace").strip()
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    if isinstance(value, dict):
        value = value.get(key, "")
    return value.strip() if isinstance(value, str) else str(value)


class LegacyV2:
    """The v2 side of one ServerConnection."""

    def __init__(self, conn: ServerConnection) -> None:
        self.conn = conn
        self.server = conn.server
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.worker: asyncio.Task | None = None
        self.streamed: set[str] = set()
        self.paused = False

    # -- plumbing ------------------------------------------------------------------------------------
    def start(self) -> None:
        self.worker = self.conn.loop.create_task(self._run())

    def on_events(self, events: list) -> None:
        for ev in events:
            self.queue.put_nowait(ev)
        if self.queue.qsize() > self.conn.limits.max_pending_requests and not self.paused:
            self.paused = True
            self.conn.transport.pause_reading()

    def closed(self) -> None:
        self.queue.put_nowait(_STOP)

    def send_text(self, text: str) -> None:
        """CHAT_TEXT frames carrying ``text`` (nothing for empty text: that is the end marker)."""
        conn = self.conn
        for chunk in split_text_utf8(text, MAX_FRAME_TEXT):
            conn.write(conn.codec.send(MsgType.CHAT_TEXT, chunk))

    def send_end(self) -> None:
        self.conn.write(self.conn.codec.send(MsgType.CHAT_TEXT, b""))

    def thought(self, kind: str, content: Any) -> None:
        payload = orjson.dumps({"type": kind, "content": content})
        if len(payload) > MAX_FRAME_TEXT:
            payload = orjson.dumps({"type": kind, "content": str(content)[:4000] + "…"})
        self.conn.write(self.conn.codec.send(MsgType.AGENT_THOUGHT, payload))

    async def _run(self) -> None:
        try:
            if not await self._welcome():
                return
            while True:
                ev = await self.queue.get()
                if ev is _STOP or self.conn.closing:
                    return
                if self.paused and self.queue.qsize() <= self.conn.limits.max_pending_requests // 2:
                    self.paused = False
                    self.conn.transport.resume_reading()
                try:
                    await self._handle(ev)
                except (HandlerError, StorageError) as exc:
                    self.send_text(f"Error: {exc.message}")
                except Exception:
                    log.exception("v2 request failed on connection %s", self.conn.conn_id)
                    self.send_text("Error: internal error")
        except asyncio.CancelledError:
            raise

    async def _welcome(self) -> bool:
        srv = self.server
        if srv.auth.enabled:
            self.send_text("This server requires authentication: connect with an NPLT v3 client and a token.")
            self.conn.close()
            return False
        rec, _ = await srv.sessions.newest_or_new(LOCAL_USER)
        self.conn.user_id = LOCAL_USER
        if self.conn.closing:
            return False
        srv.hub.attach(self.conn, rec.session_id)
        self.send_text(f"Welcome to NPLT Assistant ({srv.agent.name}). Session: {rec.session_id} "
                       f"({rec.message_count} messages). Type a message to chat.")
        return True

    # -- requests ------------------------------------------------------------------------------------
    async def _handle(self, ev: Message | InvalidMessage) -> None:
        t = ev.type
        if isinstance(ev, InvalidMessage):
            if t == MsgType.CHAT_TEXT:
                self.send_text(f"Error: {ev.error.message}")
                self.send_end()
            return
        body: bytes = ev.body  # type: ignore[assignment]
        if t == MsgType.CHAT_TEXT:
            await self._chat(ev)
        elif t == MsgType.HISTORY_REQUEST:
            await self._history(body)
        elif t == MsgType.SESSION_LIST:
            await self._session_list()
        elif t == MsgType.SESSION_NEW:
            await self._session_new()
        elif t == MsgType.SESSION_SWITCH:
            await self._session_switch(_ref(body, "session_id"))
        elif t == MsgType.SESSION_DELETE:
            await self._session_delete(_ref(body, "session_id"))
        elif t == MsgType.CLEAR_REQUEST:
            await self._clear()
        elif t == MsgType.MODEL_SWITCH:
            await self._model_switch(_ref(body, "model"))
        elif t in (MsgType.FILE_METADATA, MsgType.DOWNLOAD_OFFER):
            self.send_text("File transfer is not supported by this server.")
        else:  # CLIENT_UDP_PORT (no UDP transfer), FILE_DATA, unknown and v3-only codes: ignored
            log.debug("v2 connection %s: ignored frame type 0x%02X", self.conn.conn_id, int(t))

    async def _chat(self, ev: Message) -> None:
        try:
            text = ev.text
        except ProtocolError as exc:
            self.send_text(f"Error: {exc.message}")
            self.send_end()
            return
        if text == "HEARTBEAT":
            self.send_text("HEARTBEAT")
            return
        cap = self.conn.limits.max_text_chars
        problem = None
        if not text.strip():
            problem = "empty message"
        elif len(text) > cap:
            problem = f"message too long ({len(text)} characters, at most {cap})"
        if problem is None:
            try:
                await self.server.runner.submit(self.conn, LOCAL_USER, self.conn.session_id, text)
                return
            except HandlerError as exc:
                problem = exc.message
        self.send_text(f"Error: {problem}")
        self.send_end()

    async def _history(self, payload: bytes) -> None:
        before, limit = None, 50
        if payload.strip():
            try:
                req = orjson.loads(payload)
                if not isinstance(req, dict):
                    raise ValueError("expected a JSON object")
                before, limit = req.get("before"), req.get("limit", 50)
                for name, v in (("before", before), ("limit", limit)):
                    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                        raise ValueError(f"field '{name}': expected a non-negative integer, got {v!r}")
            except (ValueError, orjson.JSONDecodeError) as exc:
                doc = {"error": {"code": "INVALID_MESSAGE", "message": f"HISTORY_REQUEST: {exc}"}}
                self.send_text(orjson.dumps(doc).decode())
                return
        limit = max(1, min(limit or 50, self.conn.limits.max_page_size))
        sid = self.conn.session_id
        page = await self.server.store.page(sid, before=before, limit=limit)
        self.send_text(history_document(sid, page))

    async def _session_list(self) -> None:
        recs = await self.server.sessions.list_all(LOCAL_USER)
        lines = [f"Sessions ({len(recs)}):"]
        for r in recs:
            mark = "*" if r.session_id == self.conn.session_id else " "
            lines.append(f"{mark} {r.session_id} | {r.title or '(untitled)'} | {r.message_count} messages | "
                         f"updated {r.updated_at[:19].replace('T', ' ')}")
        self.send_text("\n".join(lines))

    async def _session_new(self) -> None:
        rec = await self.server.sessions.create(LOCAL_USER)
        self.server.hub.attach(self.conn, rec.session_id)
        await self.server.sessions.publish_event("created", rec)
        self.send_text(f"New session: {rec.session_id}")

    async def _session_switch(self, ref: str) -> None:
        rec = await self.server.sessions.resolve(LOCAL_USER, ref)
        self.server.hub.attach(self.conn, rec.session_id)
        self.send_text(f"Switched to session {rec.session_id}: {rec.title or '(untitled)'} "
                       f"({rec.message_count} messages)")

    async def _session_delete(self, ref: str) -> None:
        srv = self.server
        rec = await srv.sessions.resolve(LOCAL_USER, ref)
        srv.runner.cancel_session(rec.session_id)
        deleted = await srv.store.delete(rec.session_id)
        srv.sessions.forget(rec.session_id)
        await srv.sessions.publish_event("deleted", deleted)
        text = f"Deleted session {rec.session_id}."
        if self.conn.session_id == rec.session_id:
            cur, created = await srv.sessions.newest_or_new(LOCAL_USER)
            srv.hub.attach(self.conn, cur.session_id)
            if created:
                await srv.sessions.publish_event("created", cur)
            text += f" Current session: {cur.session_id}"
        self.send_text(text)

    async def _clear(self) -> None:
        srv = self.server
        sid = self.conn.session_id
        n = await srv.store.clear(sid)
        srv.sessions.forget(sid)
        await srv.sessions.publish_updated(sid, "cleared")
        self.send_text(f"Cleared {n} messages from session {sid}.")

    async def _model_switch(self, name: str) -> None:
        srv = self.server
        offered = srv.agent.models()
        if name not in offered:
            self.send_text(f"Unknown model {name!r}. Available: {', '.join(offered)}")
            return
        rec = await srv.store.set_model(self.conn.session_id, name)
        await srv.sessions.publish_event("model", rec)
        self.send_text(f"Model switched to {name} for session {rec.session_id}.")

    # -- turn events ---------------------------------------------------------------------------------
    def on_turn_event(self, msg_type: int, body: dict[str, Any], is_origin: bool) -> None:
        """Translate a v3 turn event of a turn this connection started into v2 frames."""
        if not is_origin or self.conn.closing:
            return
        if msg_type == MsgType.ANSWER_DELTA:
            self.streamed.add(body["turn_id"])
            self.send_text(body["text"])
        elif msg_type == MsgType.TURN_START:
            self.thought("stream_start", "")
        elif msg_type == MsgType.TURN_STATUS:
            self.thought(body["status"], body.get("detail") or "")
        elif msg_type == MsgType.TOOL_CALL:
            call = body["call"]
            self.thought("tool_call", f"{call['tool_name']} {orjson.dumps(call['arguments']).decode()}")
        elif msg_type == MsgType.TOOL_RESULT:
            call = body["call"]
            self.thought("tool_call", f"{call['tool_name']}: {call['status']} ({call['duration']:.2f} s)")
        elif msg_type == MsgType.TURN_END:
            if body["turn_id"] not in self.streamed:
                self.send_text(body["message"]["content"])
            self.streamed.discard(body["turn_id"])
            self.send_end()
        elif msg_type == MsgType.TURN_ERROR:
            self.streamed.discard(body["turn_id"])
            self.send_text(f"\n[error {body['code']}] {body['message']}")
            self.send_end()


def history_document(session_id: str, page: Any) -> str:
    """The v2 history JSON text, shrunk (oldest messages dropped, then content cut) to fit one frame."""
    msgs = [{"id": m.id, "role": m.role, "content": m.content, "timestamp": m.timestamp,
             "tool_calls": [c.to_dict() for c in m.tool_calls], "metadata": m.metadata} for m in page.messages]
    has_more = page.has_more
    while True:
        doc = {"session_id": session_id, "message_count": page.total, "messages": msgs,
               "has_more": has_more, "next_before": msgs[0]["id"] if msgs else page.next_before}
        text = orjson.dumps(doc)
        if len(text) <= MAX_FRAME_TEXT:
            return text.decode()
        if len(msgs) > 1:
            msgs = msgs[1:]
            has_more = True
            continue
        m = msgs[0]  # one message alone is too big: cut its content, then drop the extras
        if m["content"]:
            over = len(text) - MAX_FRAME_TEXT + 200
            m["content"] = m["content"][: max(0, len(m["content"]) - over)]
            m["metadata"] = {**m["metadata"], "truncated": True}
        else:
            m["tool_calls"], m["metadata"] = [], {"truncated": True}
