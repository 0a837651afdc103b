"""A fake NPLT client for TUI tests: typed replies from an in-memory store, events the test scripts.

It has the surface the TUI uses (connect, next_event, close and the request methods). Requests are
recorded in ``calls``; events are whatever the test ``push``es, typed exactly as the real client
delivers them. No socket and no server: a test states what the server says and checks the screen.
"""
from __future__ import annotations

from typing import Any

from client.errors import ClientError
from client.events import Connected, Event, EventQueue
from protocol import ErrorCode
from protocol.objects import AgentInfo, ChatMessage, ModelInfo, SearchHit, SessionInfo, TurnState
from protocol.replies import (ChatCancelReply, ChatSendReply, HelloReply, HistoryExportReply, HistoryPageReply,
                              HistorySearchReply, ModelListReply, ModelSwitchReply, SessionClearReply,
                              SessionDeleteReply, SessionListReply, SessionReply, SessionSwitchReply)

AGENT = AgentInfo("fake", True, "fake")


def stamp(n: int) -> str:
    return f"2026-11-22T10:{n // 60 % 60:02d}:{n % 60:02d}+00:00"


class FakeClient:
    def __init__(self, sessions: list[SessionInfo] | None = None,
                 messages: dict[str, list[ChatMessage]] | None = None, running: TurnState | None = None) -> None:
        self.sessions = {s.session_id: s for s in sessions or [SessionInfo("s1", "First", stamp(0), stamp(0))]}
        self.messages = {sid: list((messages or {}).get(sid, [])) for sid in self.sessions}
        self.running = running
        self.session_id: str | None = next(iter(self.sessions))
        self.hello: HelloReply | None = None
        self.state = "disconnected"
        self.calls: list[tuple[str, Any]] = []
        self.busy = False               # True: a chat send is queued behind a running turn
        self._queue = EventQueue(1000)
        self._turns = 0
        self._ids = 1000

    @property
    def connected(self) -> bool:
        return self.state == "connected"

    # -- what the test scripts --------------------------------------------------------------------
    async def push(self, *events: Event) -> None:
        for event in events:
            await self._queue.put(event)

    # -- the client surface ------------------------------------------------------------------------
    async def connect(self) -> HelloReply:
        sid = self.session_id or ""
        self.hello = HelloReply("fake/0", 3, "local", self.sessions[sid], running_turn=self.running,
                                limits={"max_page_size": 200}, agent=AGENT)
        self.state = "connected"
        await self._queue.put(Connected(self.hello))
        return self.hello

    async def close(self) -> None:
        self.state = "closed"
        self._queue.close()

    async def next_event(self, timeout: float | None = None) -> Event | None:
        return await self._queue.get(timeout)

    def _session(self, session_id: str | None) -> SessionInfo:
        sid = session_id or self.session_id or ""
        if sid not in self.sessions:
            raise ClientError(ErrorCode.NOT_FOUND, f"no session {sid}")
        return self.sessions[sid]

    async def session_list(self, before: str | None = None, limit: int | None = None) -> SessionListReply:
        self.calls.append(("session_list", before))
        return SessionListReply(tuple(sorted(self.sessions.values(), key=lambda s: s.updated_at, reverse=True)))

    async def history_page(self, session_id: str | None = None, before: int | None = None,
                           limit: int | None = None) -> HistoryPageReply:
        session = self._session(session_id)
        msgs = [m for m in self.messages[session.session_id] if before is None or (m.id or 0) < before]
        page = msgs[-(limit or 50):]
        return HistoryPageReply(session.session_id, tuple(page), len(page) < len(msgs),
                                page[0].id if page else None, len(self.messages[session.session_id]))

    async def session_switch(self, session_id: str) -> SessionSwitchReply:
        self.calls.append(("session_switch", session_id))
        session = self._session(session_id)
        self.session_id = session_id
        return SessionSwitchReply(session)

    async def session_new(self, title: str | None = None) -> SessionReply:
        self.calls.append(("session_new", title))
        sid = f"s{len(self.sessions) + 1}"
        self.sessions[sid] = SessionInfo(sid, title or "New chat", stamp(len(self.sessions)), stamp(99))
        self.messages[sid] = []
        self.session_id = sid
        return SessionReply(self.sessions[sid])

    async def session_rename(self, title: str, session_id: str | None = None) -> SessionReply:
        self.calls.append(("session_rename", title))
        session = self._session(session_id)
        self.sessions[session.session_id] = renamed = SessionInfo(
            session.session_id, title, session.created_at, session.updated_at, session.message_count)
        return SessionReply(renamed)

    async def session_delete(self, session_id: str) -> SessionDeleteReply:
        self.calls.append(("session_delete", session_id))
        self._session(session_id)
        del self.sessions[session_id]
        if not self.sessions:
            await self.session_new()
        if self.session_id == session_id or self.session_id not in self.sessions:
            self.session_id = next(iter(self.sessions))
        return SessionDeleteReply(session_id, self.sessions[self.session_id or ""])

    async def session_clear(self, session_id: str | None = None) -> SessionClearReply:
        session = self._session(session_id)
        cleared = len(self.messages[session.session_id])
        self.messages[session.session_id] = []
        return SessionClearReply(session, cleared)

    async def model_list(self, session_id: str | None = None) -> ModelListReply:
        return ModelListReply((ModelInfo("fake", True, True), ModelInfo("other")), "fake")

    async def model_switch(self, model: str, session_id: str | None = None) -> ModelSwitchReply:
        self.calls.append(("model_switch", model))
        return ModelSwitchReply(self.session_id or "", model)

    async def chat_send(self, text: str, session_id: str | None = None) -> ChatSendReply:
        self.calls.append(("chat_send", text))
        self._turns += 1
        sid = self.session_id or ""
        if self.busy:
            message = ChatMessage(None, "user", text, stamp(self._turns), metadata={"queued": True})
        else:
            self._ids += 1
            message = ChatMessage(self._ids, "user", text, stamp(self._turns))
        return ChatSendReply(f"t{self._turns}", sid, message, 1 if self.busy else 0)

    async def chat_cancel(self, session_id: str | None = None, turn_id: str | None = None) -> ChatCancelReply:
        self.calls.append(("chat_cancel", turn_id))
        return ChatCancelReply(turn_id or "")

    async def search(self, query: str, session_id: str | None = None, limit: int | None = None) -> HistorySearchReply:
        self.calls.append(("search", query))
        hits = [SearchHit(sid, self.sessions[sid].title, m.id or 0, m.role, m.content, m.timestamp, 1.0)
                for sid, msgs in self.messages.items() for m in msgs if query in m.content]
        return HistorySearchReply(tuple(hits))

    async def export(self, fmt: str, session_id: str | None = None) -> HistoryExportReply:
        session = self._session(session_id)
        text = "\n".join(m.content for m in self.messages[session.session_id])
        return HistoryExportReply(session.session_id, fmt, text)
