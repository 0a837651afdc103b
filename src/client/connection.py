"""The NPLT v3 client library: ``Client``, every request of docs/protocol.md §5 as an async method.

A ``Client`` owns one ``client.link.Link`` (the connection: HELLO, replies matched to requests,
server events through a bounded queue, reconnects) and turns each request into a method that
returns the request's typed reply (``protocol.replies``) and raises ``ClientError`` on an ERROR
reply. Optional arguments left as None are not sent, so the server's defaults apply. Session
requests keep the link's session current, so a reconnect re-attaches to it.

Use ``async with Client(...) as c`` or ``await c.connect()`` / ``await c.close()``; ``c.events()``
yields the server's events and the link's state changes (``client.events``).
"""
from __future__ import annotations

from typing import Any, AsyncIterator, TypeVar

from protocol import MsgType
from protocol.replies import (ChatCancelReply, ChatRedoReply, ChatSendReply, ClientKillReply, ClientListReply,
                              HelloReply, HistoryExportReply, HistoryPageReply, HistorySearchReply,
                              MemoryForgetReply, MemoryListReply, ModelListReply, ModelSwitchReply, Pong, Reply,
                              SessionClearReply, SessionDeleteReply, SessionListReply, SessionPromptReply,
                              SessionReply, SessionSwitchReply, StatsReply)

from client.events import Event
from client.link import Backoff, Link

__all__ = ["Backoff", "Client"]   # Backoff: the reconnect policy, passed as ``backoff=``

R = TypeVar("R", bound=Reply)


def _body(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


class Client:
    """An NPLT v3 client (see the module docstring). The keyword arguments configure its ``link``
    (``Link``: ``token``, ``tls``, ``client_name``, ``session_id``, ``reconnect``, ``backoff``,
    ``request_timeout``, ``connect_timeout``, ``event_queue_size``, ``max_message_size``, ``liveness_timeout``)."""

    def __init__(self, host: str, port: int, **link_options: Any) -> None:
        self.link = Link(host, port, **link_options)

    # -- the link -------------------------------------------------------------------------------------
    @property
    def session_id(self) -> str | None:
        """The connection's current session (from HELLO and session replies)."""
        return self.link.session_id

    @property
    def hello(self) -> HelloReply | None:
        """The last HELLO reply (None before the first)."""
        return self.link.hello

    @property
    def state(self) -> str:
        """"disconnected", "connecting", "connected", "reconnecting" or "closed"."""
        return self.link.state

    @property
    def connected(self) -> bool:
        return self.link.connected

    @property
    def reconnect_enabled(self) -> bool:
        return self.link.reconnect_enabled

    @property
    def taps(self) -> dict[int, Any]:
        """Message type -> a callback taking that message instead of the event queue (``Link.taps``)."""
        return self.link.taps

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> HelloReply:
        """Open the connection and complete HELLO; returns the HELLO reply. Raises ClientError."""
        return await self.link.connect()

    async def close(self) -> None:
        """Close the connection for good; pending requests fail with CLOSED and ``events()`` ends."""
        await self.link.close()

    def events(self) -> AsyncIterator[Event]:
        """Server events and state changes, in order, until the client is closed or gives up."""
        return self.link.events()

    async def next_event(self, timeout: float | None = None) -> Event | None:
        """The next event (None once closed); raises TimeoutError after ``timeout`` seconds."""
        return await self.link.next_event(timeout)

    async def wait_connected(self, timeout: float) -> None:
        """Return once connected (after a reconnect, say); ClientError TIMEOUT or CLOSED otherwise."""
        await self.link.wait_connected(timeout)

    async def request(self, msg_type: MsgType, body: dict[str, Any] | None = None,
                      timeout: float | None = None) -> Reply:
        """Send one request and wait for its typed reply; an ERROR reply raises ClientError."""
        return await self.link.request(msg_type, body, timeout)

    async def send_data(self, msg_type: MsgType, handle: int, offset: int, data: bytes) -> None:
        """Send ``data`` as binary data frames (docs/protocol.md §5.8)."""
        await self.link.send_data(msg_type, handle, offset, data)

    async def _call(self, kind: type[R], msg_type: MsgType, body: dict[str, Any],
                    timeout: float | None = None) -> R:
        reply = await self.link.request(msg_type, body, timeout)
        assert isinstance(reply, kind), f"{msg_type.name} answered by {type(reply).__name__}"
        return reply

    # -- sessions (5.2) -------------------------------------------------------------------------------
    async def session_new(self, title: str | None = None, system_prompt: str | None = None) -> SessionReply:
        """A new session (without a title the user's empty one is reused); the connection switches to it."""
        reply = await self._call(SessionReply, MsgType.SESSION_NEW, _body(title=title, system_prompt=system_prompt))
        self.link.track_session(reply.session)
        return reply

    async def session_list(self, before: str | None = None, limit: int | None = None,
                           deleted: bool | None = None) -> SessionListReply:
        """The live sessions, or with ``deleted`` the trash."""
        return await self._call(SessionListReply, MsgType.SESSION_LIST,
                                _body(before=before, limit=limit, deleted=deleted or None))

    async def session_restore(self, session_id: str) -> SessionReply:
        """A deleted session back out of the trash."""
        return await self._call(SessionReply, MsgType.SESSION_RESTORE, {"session_id": session_id})

    async def session_purge(self, session_id: str) -> SessionDeleteReply:
        """Remove a session for good (a live one is deleted first)."""
        reply = await self._call(SessionDeleteReply, MsgType.SESSION_PURGE, {"session_id": session_id})
        self.link.track_session(reply.current)
        return reply

    async def session_switch(self, session_id: str) -> SessionSwitchReply:
        reply = await self._call(SessionSwitchReply, MsgType.SESSION_SWITCH, {"session_id": session_id})
        self.link.track_session(reply.session)
        return reply

    async def session_rename(self, title: str, session_id: str | None = None) -> SessionReply:
        return await self._call(SessionReply, MsgType.SESSION_RENAME, _body(title=title, session_id=session_id))

    async def session_delete(self, session_id: str) -> SessionDeleteReply:
        reply = await self._call(SessionDeleteReply, MsgType.SESSION_DELETE, {"session_id": session_id})
        self.link.track_session(reply.current)
        return reply

    async def session_clear(self, session_id: str | None = None, purge: bool = False) -> SessionClearReply:
        """Hide every message; with ``purge`` the hidden messages are removed from storage for good."""
        return await self._call(SessionClearReply, MsgType.CLEAR_REQUEST,
                                _body(session_id=session_id, purge=purge or None))

    async def session_prompt(self, system_prompt: str | None = None,
                             session_id: str | None = None) -> SessionPromptReply:
        """Read (None), set, or reset (\"\") the session's own system prompt."""
        return await self._call(SessionPromptReply, MsgType.SESSION_PROMPT,
                                _body(session_id=session_id, system_prompt=system_prompt))

    async def session_info(self, session_id: str | None = None) -> SessionReply:
        return await self._call(SessionReply, MsgType.SESSION_INFO, _body(session_id=session_id))

    # -- history (5.3) --------------------------------------------------------------------------------
    async def history_page(self, session_id: str | None = None, before: int | None = None,
                           limit: int | None = None) -> HistoryPageReply:
        return await self._call(HistoryPageReply, MsgType.HISTORY_REQUEST,
                                _body(session_id=session_id, before=before, limit=limit))

    async def search(self, query: str, session_id: str | None = None, limit: int | None = None) -> HistorySearchReply:
        return await self._call(HistorySearchReply, MsgType.HISTORY_SEARCH,
                                _body(query=query, session_id=session_id, limit=limit))

    async def export(self, fmt: str, session_id: str | None = None) -> HistoryExportReply:
        return await self._call(HistoryExportReply, MsgType.HISTORY_EXPORT, _body(format=fmt, session_id=session_id))

    # -- chat (5.4) -----------------------------------------------------------------------------------
    async def chat_send(self, text: str, session_id: str | None = None,
                        new_session: bool = False) -> ChatSendReply:
        """Send a user message to ``session_id`` (default: the connection's session). With
        ``new_session``, or when the connection has no session yet, the message starts one (the
        user's empty session is reused) and the connection switches to it."""
        reply = await self._call(ChatSendReply, MsgType.CHAT_TEXT,
                                 _body(text=text, session_id=session_id, new_session=new_session or None))
        if session_id is None:
            self.link.session_id = reply.session_id
        return reply

    async def chat_regenerate(self, session_id: str | None = None) -> ChatRedoReply:
        """Answer the last user message again (the old answer is superseded)."""
        return await self._call(ChatRedoReply, MsgType.CHAT_REGENERATE, _body(session_id=session_id))

    async def chat_edit(self, message_id: int, text: str, session_id: str | None = None) -> ChatRedoReply:
        """Replace user message ``message_id`` with ``text`` and answer it (it and what follows are superseded)."""
        return await self._call(ChatRedoReply, MsgType.CHAT_EDIT,
                                _body(message_id=message_id, text=text, session_id=session_id))

    async def chat_cancel(self, session_id: str | None = None, turn_id: str | None = None) -> ChatCancelReply:
        return await self._call(ChatCancelReply, MsgType.CHAT_CANCEL, _body(session_id=session_id, turn_id=turn_id))

    # -- models, stats (5.6, 5.7) --------------------------------------------------------------------
    async def model_list(self, session_id: str | None = None) -> ModelListReply:
        return await self._call(ModelListReply, MsgType.MODEL_LIST, _body(session_id=session_id))

    async def model_switch(self, model: str, session_id: str | None = None) -> ModelSwitchReply:
        return await self._call(ModelSwitchReply, MsgType.MODEL_SWITCH, _body(model=model, session_id=session_id))

    # -- long-term memory (5.10) -----------------------------------------------------------------------
    async def memory_list(self) -> MemoryListReply:
        return await self._call(MemoryListReply, MsgType.MEMORY_LIST, {})

    async def memory_forget(self, item_id: str) -> MemoryForgetReply:
        return await self._call(MemoryForgetReply, MsgType.MEMORY_FORGET, {"item_id": item_id})

    async def stats(self) -> StatsReply:
        return await self._call(StatsReply, MsgType.STATS, {})

    # -- clients (5.9, admins only) -------------------------------------------------------------------
    async def client_list(self) -> ClientListReply:
        return await self._call(ClientListReply, MsgType.CLIENT_LIST, {})

    async def client_kill(self, client_id: int | None = None, user: str | None = None,
                          peer: str | None = None) -> ClientKillReply:
        return await self._call(ClientKillReply, MsgType.CLIENT_KILL, _body(client_id=client_id, user=user, peer=peer))

    # -- heartbeat (5.5) ------------------------------------------------------------------------------
    async def ping(self, timeout: float | None = None) -> Pong:
        """Send PING and wait for the PONG."""
        return await self._call(Pong, MsgType.PING, {}, timeout)
