"""THE dispatch table: v3 request type -> handler, and the code that runs a request.

HELLO is handled by the connection before any other request (it decides the user). PING's handler
is synchronous and answered inline with PONG (well-formed PINGs that arrive whole are answered by the
codec itself, ``protocol.Connection.receive_and_pong``, and never get here); every other request runs
as a task, at most ``max_pending_requests`` per connection, answered by exactly one RESPONSE or ERROR.
"""
from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from protocol import ErrorCode, InvalidMessage, Message, MsgType, ProtocolError
from protocol.messages import HistoryExport, HistoryPage, parse_request
from server.errors import HandlerError
from server.fit import shrink_reply
from server.handlers import chat, history, misc, sessions
from server.handlers.hello import handle_hello
from storage.errors import StorageError

if TYPE_CHECKING:  # pragma: no cover
    from server.connection import ServerConnection

log = logging.getLogger("nplt.dispatch")

Handler = Callable[..., Awaitable[dict[str, Any]]]

# Enum member lookups cost ~100 ns each on Python 3.11: bind them once.
_PING, _PONG, _HELLO, _RESPONSE = MsgType.PING, MsgType.PONG, MsgType.HELLO, MsgType.RESPONSE

HANDLERS: dict[MsgType, Any] = {
    MsgType.HELLO: handle_hello,                 # called by the connection during the handshake
    MsgType.PING: misc.ping,                     # synchronous, answered inline with PONG
    MsgType.SESSION_LIST: sessions.session_list,
    MsgType.SESSION_NEW: sessions.session_new,
    MsgType.SESSION_SWITCH: sessions.session_switch,
    MsgType.SESSION_RENAME: sessions.session_rename,
    MsgType.SESSION_DELETE: sessions.session_delete,
    MsgType.CLEAR_REQUEST: sessions.session_clear,
    MsgType.SESSION_INFO: sessions.session_info,
    MsgType.HISTORY_REQUEST: history.history_page,
    MsgType.HISTORY_SEARCH: history.history_search,
    MsgType.HISTORY_EXPORT: history.history_export,
    MsgType.CHAT_TEXT: chat.chat_send,
    MsgType.CHAT_CANCEL: chat.chat_cancel,
    MsgType.MODEL_LIST: misc.model_list,
    MsgType.MODEL_SWITCH: misc.model_switch,
    MsgType.STATS: misc.stats,
}


def dispatch(conn: ServerConnection, msg: Message) -> None:
    """Validate one request and start it (never awaits)."""
    req = parse_request(msg)
    if type(req) is InvalidMessage:
        conn.send_error(req.re, req.error.code, req.error.message)
        return
    t = msg.type
    if t == _PING:  # (PINGs split across reads, or sent before the handshake finished)
        conn.send_msg(_PONG, {"re": req.id, **HANDLERS[_PING](conn, req)})
        return
    if t == _HELLO:
        conn.send_error(req.id, ErrorCode.INVALID_MESSAGE, "HELLO was already accepted")
        return
    rid = req.id
    pending = conn.pending
    if rid in pending:
        conn.send_error(rid, ErrorCode.INVALID_MESSAGE, f"field 'id': {rid!r} is already used by a pending request")
        return
    if len(pending) >= conn.limits.max_pending_requests:
        conn.send_error(rid, ErrorCode.TOO_MANY_PENDING,
                        f"more than {conn.limits.max_pending_requests} requests in flight (max_pending_requests)")
        return
    task = conn.loop.create_task(_run(conn, HANDLERS[t], req))
    pending[rid] = task
    task.add_done_callback(partial(_done, pending, rid))


def _done(pending: dict, rid: Any, task: asyncio.Task) -> None:
    if pending.get(rid) is task:
        del pending[rid]


async def _run(conn: ServerConnection, handler: Handler, req: Any) -> None:
    rid = req.id
    try:
        body = await handler(conn, req)
    except HandlerError as exc:
        conn.send_error(rid, exc.code, exc.message)
        return
    except StorageError as exc:  # storage codes are protocol codes (NOT_FOUND, INVALID_MESSAGE, ...)
        conn.send_error(rid, exc.code, exc.message)
        return
    except Exception:
        log.exception("request %r (%s) failed on connection %s", rid, type(req).__name__, conn.conn_id)
        conn.send_error(rid, ErrorCode.INTERNAL, "internal error")
        return
    send_response(conn, rid, body, page=isinstance(req, HistoryPage), shrink=not isinstance(req, HistoryExport))


def send_response(conn: ServerConnection, rid: Any, body: dict[str, Any], *, page: bool = False,
                  shrink: bool = True) -> None:
    """RESPONSE ``body`` to request ``rid``; a body over max_message_size is shrunk to fit
    (``server.fit``; ``page``: a history page) or, with ``shrink`` false, refused with an ERROR."""
    try:
        conn.send_msg(_RESPONSE, {"re": rid, **body})
        return
    except ProtocolError as exc:
        if exc.code != ErrorCode.MESSAGE_TOO_LARGE or not shrink:
            conn.send_error(rid, exc.code, f"reply not sent: {exc.message}")
            return
    body = shrink_reply(body, conn.limits.max_message_size, page=page)
    try:
        conn.send_msg(_RESPONSE, {"re": rid, **body})
    except ProtocolError as exc:
        conn.send_error(rid, exc.code, f"reply not sent: {exc.message}")
