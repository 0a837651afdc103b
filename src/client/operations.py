"""Every request of docs/protocol.md §5 as an async method (``client.connection.Client`` inherits them).

Each method returns the request's typed reply (``protocol.replies``) and raises ``ClientError`` on an
ERROR reply. Optional arguments left as None are not sent, so the server's defaults apply.
"""
from __future__ import annotations

from typing import Any, TypeVar

from protocol import MsgType
from protocol.objects import SessionInfo
from protocol.replies import (ChatCancelReply, ChatRedoReply, ChatSendReply, ClientKillReply, ClientListReply,
                              HistoryExportReply, HistoryPageReply, HistorySearchReply, MemoryForgetReply,
                              MemoryListReply, ModelListReply, ModelSwitchReply, Pong, Reply, SessionClearReply,
                              SessionDeleteReply, SessionListReply, SessionPromptReply, SessionReply,
                              SessionSwitchReply, StatsReply)

R = TypeVar("R", bound=Reply)


def _body(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


class Operations:
    """Typed wrappers around ``request``; tracks the connection's current session id."""

    _session_id: str | None

    async def request(self, msg_type: MsgType, body: dict[str, Any] | None = None,
                      timeout: float | None = None) -> Reply:  # pragma: no cover - provided by Client
        raise NotImplementedError

    async def _call(self, kind: type[R], msg_type: MsgType, body: dict[str, Any],
                    timeout: float | None = None) -> R:
        reply = await self.request(msg_type, body, timeout)
        assert isinstance(reply, kind), f"{msg_type.name} answered by {type(reply).__name__}"
        return reply

    def _track_session(self, session: SessionInfo | None) -> None:
        if session is not None and session.session_id:
            self._session_id = session.session_id

    # -- sessions (5.2) -------------------------------------------------------------------------------
    async def session_new(self, title: str | None = None, system_prompt: str | None = None) -> SessionReply:
        """A new session (without a title the user's empty one is reused); the connection switches to it."""
        reply = await self._call(SessionReply, MsgType.SESSION_NEW, _body(title=title, system_prompt=system_prompt))
        self._track_session(reply.session)
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
        self._track_session(reply.current)
        return reply

    async def session_switch(self, session_id: str) -> SessionSwitchReply:
        reply = await self._call(SessionSwitchReply, MsgType.SESSION_SWITCH, {"session_id": session_id})
        self._track_session(reply.session)
        return reply

    async def session_rename(self, title: str, session_id: str | None = None) -> SessionReply:
        return await self._call(SessionReply, MsgType.SESSION_RENAME, _body(title=title, session_id=session_id))

    async def session_delete(self, session_id: str) -> SessionDeleteReply:
        reply = await self._call(SessionDeleteReply, MsgType.SESSION_DELETE, {"session_id": session_id})
        self._track_session(reply.current)
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
            self._session_id = reply.session_id
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
