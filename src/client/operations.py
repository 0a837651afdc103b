"""Every request of docs/protocol.md §5 as an async method (mixed into ``client.connection.Client``).

Each method returns the RESPONSE body (a dict, ``re`` included) and raises ``ClientError`` on an ERROR
reply. Optional arguments left as None are not sent, so the server's defaults apply.
"""
from __future__ import annotations

from typing import Any

from protocol import MsgType


def _body(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


class Operations:
    """Typed wrappers around ``request``; tracks the connection's current session id."""

    _session_id: str | None

    async def request(self, msg_type: MsgType, body: dict[str, Any] | None = None,
                      timeout: float | None = None) -> dict[str, Any]:  # pragma: no cover - provided by Client
        raise NotImplementedError

    def _track_session(self, session: dict[str, Any] | None) -> None:
        if session and session.get("session_id"):
            self._session_id = session["session_id"]

    # -- sessions (5.2) -------------------------------------------------------------------------------
    async def session_new(self, title: str | None = None) -> dict[str, Any]:
        reply = await self.request(MsgType.SESSION_NEW, _body(title=title))
        self._track_session(reply.get("session"))
        return reply

    async def session_list(self, before: str | None = None, limit: int | None = None) -> dict[str, Any]:
        return await self.request(MsgType.SESSION_LIST, _body(before=before, limit=limit))

    async def session_switch(self, session_id: str) -> dict[str, Any]:
        reply = await self.request(MsgType.SESSION_SWITCH, {"session_id": session_id})
        self._track_session(reply.get("session"))
        return reply

    async def session_rename(self, title: str, session_id: str | None = None) -> dict[str, Any]:
        return await self.request(MsgType.SESSION_RENAME, _body(title=title, session_id=session_id))

    async def session_delete(self, session_id: str) -> dict[str, Any]:
        reply = await self.request(MsgType.SESSION_DELETE, {"session_id": session_id})
        self._track_session(reply.get("current"))
        return reply

    async def session_clear(self, session_id: str | None = None) -> dict[str, Any]:
        return await self.request(MsgType.CLEAR_REQUEST, _body(session_id=session_id))

    async def session_info(self, session_id: str | None = None) -> dict[str, Any]:
        return await self.request(MsgType.SESSION_INFO, _body(session_id=session_id))

    # -- history (5.3) --------------------------------------------------------------------------------
    async def history_page(self, session_id: str | None = None, before: int | None = None,
                           limit: int | None = None) -> dict[str, Any]:
        return await self.request(MsgType.HISTORY_REQUEST, _body(session_id=session_id, before=before, limit=limit))

    async def search(self, query: str, session_id: str | None = None, limit: int | None = None) -> dict[str, Any]:
        return await self.request(MsgType.HISTORY_SEARCH, _body(query=query, session_id=session_id, limit=limit))

    async def export(self, fmt: str, session_id: str | None = None) -> dict[str, Any]:
        return await self.request(MsgType.HISTORY_EXPORT, _body(format=fmt, session_id=session_id))

    # -- chat (5.4) -----------------------------------------------------------------------------------
    async def chat_send(self, text: str, session_id: str | None = None) -> dict[str, Any]:
        return await self.request(MsgType.CHAT_TEXT, _body(text=text, session_id=session_id))

    async def chat_cancel(self, session_id: str | None = None, turn_id: str | None = None) -> dict[str, Any]:
        return await self.request(MsgType.CHAT_CANCEL, _body(session_id=session_id, turn_id=turn_id))

    # -- models, stats (5.6, 5.7) --------------------------------------------------------------------
    async def model_list(self, session_id: str | None = None) -> dict[str, Any]:
        return await self.request(MsgType.MODEL_LIST, _body(session_id=session_id))

    async def model_switch(self, model: str, session_id: str | None = None) -> dict[str, Any]:
        return await self.request(MsgType.MODEL_SWITCH, _body(model=model, session_id=session_id))

    async def stats(self) -> dict[str, Any]:
        return await self.request(MsgType.STATS, {})

    # -- heartbeat (5.5) ------------------------------------------------------------------------------
    async def ping(self, timeout: float | None = None) -> dict[str, Any]:
        """Send PING and wait for the PONG (``{"re", "time"}``)."""
        return await self.request(MsgType.PING, {}, timeout=timeout)
