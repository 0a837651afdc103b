"""THE v3 dispatch table (request type -> handler) and the Dispatcher that runs requests.

HELLO is run by the connection before any other request (it decides the user). PING's handler is
synchronous and answered inline with PONG (well-formed PINGs that arrive whole are answered by the
codec itself, ``protocol.Connection.receive_and_pong``, and never get here). A request type in
``INLINE`` first tries its synchronous happy path (no I/O, no waiting; e.g. a history page of a
loaded, idle session), answered at once without a task; when that gives None, or for any other
type, the request runs as a task, at most ``max_pending_requests`` per connection, answered by
exactly one RESPONSE or ERROR.
Errors: ``HandlerError`` as raised; storage failures by their code (``server.errors.failure_of``:
STORAGE_ERROR for an I/O failure, never NOT_FOUND); anything else is a bug, logged and answered INTERNAL.
"""
from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any, Awaitable, Callable

from protocol import ErrorCode, InvalidMessage, Message, MsgType
from protocol.messages import HistoryExport, HistoryPage, parse_request
from protocol.replies import Reply
from server.context import RequestContext
from server.errors import HandlerError, failure_of
from server.handlers import admin, chat, history, knowledge, memory, misc, redo, sessions
from server.handlers.hello import handle_hello
from server.v3_port import V3Port

log = logging.getLogger("nplt.dispatch")

Handler = Callable[[RequestContext, Any], Awaitable[Reply]]

# Enum member lookups cost ~100 ns each on Python 3.11: bind them once.
_PING, _PONG, _HELLO = MsgType.PING, MsgType.PONG, MsgType.HELLO

HANDLERS: dict[MsgType, Any] = {
    MsgType.HELLO: handle_hello,                 # run by the connection during the handshake
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
    MsgType.CLIENT_LIST: admin.client_list,
    MsgType.CLIENT_KILL: admin.client_kill,
    MsgType.SESSION_RESTORE: sessions.session_restore,
    MsgType.SESSION_PURGE: sessions.session_purge,
    MsgType.SESSION_PROMPT: sessions.session_prompt,
    MsgType.CHAT_REGENERATE: redo.chat_regenerate,
    MsgType.CHAT_EDIT: redo.chat_edit,
    MsgType.KB_UPLOAD_BEGIN: knowledge.upload_begin,
    MsgType.KB_UPLOAD_END: knowledge.upload_end,
    MsgType.KB_LIST: knowledge.kb_list,
    MsgType.KB_DELETE: knowledge.kb_delete,
    MsgType.KB_SEARCH: knowledge.kb_search,
    MsgType.KB_PASSAGE: knowledge.kb_passage,
    MsgType.KB_DOWNLOAD: knowledge.kb_download,
    MsgType.MEMORY_LIST: memory.memory_list,
    MsgType.MEMORY_FORGET: memory.memory_forget,
}


# request type -> synchronous happy path: the reply, or None to run the HANDLERS entry as a task
INLINE: dict[MsgType, Callable[[RequestContext, Any], Reply | None]] = {
    MsgType.HISTORY_REQUEST: history.history_page_now,
}


async def run_handler(handler: Handler, ctx: RequestContext, req: Any) -> tuple[Any, HandlerError | None]:
    """(typed reply, None) or (None, HandlerError): what the client is told, whatever the handler raised."""
    try:
        return await handler(ctx, req), None
    except Exception as exc:
        return None, _error_of(exc, req)


def _error_of(exc: Exception, req: Any) -> HandlerError:
    """What the client is told for an exception out of a handler (a bug: logged, INTERNAL)."""
    err = failure_of(exc)
    if err is None:
        log.exception("request %r (%s) failed", getattr(req, "id", None), type(req).__name__)
        err = HandlerError(ErrorCode.INTERNAL, "internal error")
    return err


class Dispatcher:
    """Validates and starts the requests of one v3 connection; ``pending`` maps request ids to tasks."""

    __slots__ = ("ctx", "port", "loop", "max_pending", "pending")

    def __init__(self, ctx: RequestContext, port: V3Port, loop: asyncio.AbstractEventLoop) -> None:
        self.ctx = ctx
        self.port = port
        self.loop = loop
        self.max_pending = ctx.limits.max_pending_requests
        self.pending: dict[Any, asyncio.Future] = {}

    def dispatch(self, msg: Message) -> asyncio.Task | None:
        """Validate one request and start it (never awaits); the task, when one was started."""
        port = self.port
        req = parse_request(msg)
        if type(req) is InvalidMessage:
            port.send_error(req.re, req.error.code, req.error.message)
            return None
        t = msg.type
        if t == _PING:  # (PINGs split across reads, or sent before the handshake finished)
            port.answer(_PONG, req.id, HANDLERS[_PING](self.ctx, req))
            return None
        if t == _HELLO:
            port.send_error(req.id, ErrorCode.INVALID_MESSAGE, "HELLO was already accepted")
            return None
        rid = req.id
        pending = self.pending
        if rid in pending:   # re null: the pending request with that id still gets its one reply
            port.send_error(None, ErrorCode.INVALID_MESSAGE, f"field 'id': {rid!r} is already used by a pending request")
            return None
        if len(pending) >= self.max_pending:
            port.send_error(rid, ErrorCode.TOO_MANY_PENDING,
                            f"more than {self.max_pending} requests in flight (max_pending_requests)")
            return None
        inline = INLINE.get(t)
        if inline is not None:
            try:
                reply = inline(self.ctx, req)
            except Exception as exc:
                err = _error_of(exc, req)
                port.send_error(rid, err.code, err.message)
                return None
            if reply is not None:
                port.respond(rid, reply, page=isinstance(req, HistoryPage))
                return None
        task = self.loop.create_task(self._run(HANDLERS[t], req))
        pending[rid] = task
        task.add_done_callback(partial(_done, pending, rid))
        return task

    async def _run(self, handler: Handler, req: Any) -> None:
        reply, err = await run_handler(handler, self.ctx, req)
        if err is not None:
            self.port.send_error(req.id, err.code, err.message)
        else:
            self.port.respond(req.id, reply, page=isinstance(req, HistoryPage),
                              shrink=not isinstance(req, HistoryExport))


def _done(pending: dict, rid: Any, task: asyncio.Task) -> None:
    if pending.get(rid) is task:
        del pending[rid]
