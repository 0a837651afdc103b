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
from protocol import MsgType
from protocol.kb import KbDocument, KbHit, KbListReply, KbPassageReply
from protocol.objects import AgentInfo, ChatMessage, MemoryItem, ModelInfo, SearchHit, SessionInfo, TurnState
from protocol.replies import (ChatCancelReply, ChatRedoReply, ChatSendReply, HelloReply, HistoryExportReply,
                              HistoryPageReply, HistorySearchReply, MemoryForgetReply, MemoryListReply, ModelListReply,
                              ModelSwitchReply, SessionClearReply, SessionDeleteReply, SessionListReply,
                              SessionPromptReply, SessionReply, SessionSwitchReply)

AGENT = AgentInfo("fake", True, "fake")


def stamp(n: int) -> str:
    return f"2026-11-22T10:{n // 60 % 60:02d}:{n % 60:02d}+00:00"


class FakeClient:
    def __init__(self, sessions: list[SessionInfo] | None = None,
                 messages: dict[str, list[ChatMessage]] | None = None, running: TurnState | None = None) -> None:
        self.sessions = {s.session_id: s for s in sessions or [SessionInfo("s1", "First", stamp(0), stamp(0))]}
        self.messages = {sid: list((messages or {}).get(sid, [])) for sid in self.sessions}
        self.running = running
        self.memory: list[MemoryItem] = []      # long-term memory items (MEMORY_LIST)
        self.session_id: str | None = next(iter(self.sessions))
        self.hello: HelloReply | None = None
        self.state = "disconnected"
        self.calls: list[tuple[str, Any]] = []
        self.busy = False               # True: a chat send is queued behind a running turn
        self._queue = EventQueue(1000)
        self._turns = 0
        self._ids = 1000
        self.trash: dict[str, SessionInfo] = {}     # deleted sessions (restorable until purged)
        self.prompts: dict[str, str] = {}           # session id -> its own system prompt
        self.superseded: set[int] = set()           # message ids replaced by a regenerate or an edit
        self.passages: dict[str, KbHit] = {}        # knowledge-base passages by chunk id
        self.documents: list[KbDocument] = []       # knowledge-base documents
        self.limits: dict[str, Any] = {"max_page_size": 200}   # the HELLO's limits

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
                                limits=dict(self.limits), agent=AGENT)
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

    async def session_list(self, before: str | None = None, limit: int | None = None,
                           deleted: bool | None = None) -> SessionListReply:
        self.calls.append(("session_list", before) if not deleted else ("session_list_deleted", before))
        source = self.trash if deleted else self.sessions
        return SessionListReply(tuple(sorted(source.values(), key=lambda s: s.updated_at, reverse=True)))

    async def request(self, msg_type: MsgType, body: dict[str, Any] | None = None,
                      timeout: float | None = None) -> Any:
        """The raw requests the TUI sends without a typed method (knowledge base passages)."""
        self.calls.append((msg_type.name, body))
        if msg_type == MsgType.KB_PASSAGE:
            chunk = (body or {}).get("chunk_id", "")
            if chunk not in self.passages:
                raise ClientError(ErrorCode.NOT_FOUND, f"no passage {chunk}")
            return KbPassageReply(self.passages[chunk])
        if msg_type == MsgType.KB_LIST:
            return KbListReply(tuple(self.documents))
        raise ClientError(ErrorCode.UNKNOWN_TYPE, f"the fake client does not answer {msg_type.name}")

    async def session_restore(self, session_id: str) -> SessionReply:
        self.calls.append(("session_restore", session_id))
        if session_id not in self.trash:
            raise ClientError(ErrorCode.NOT_FOUND, f"no session {session_id}")
        self.sessions[session_id] = self.trash.pop(session_id)
        return SessionReply(self.sessions[session_id])

    async def session_purge(self, session_id: str) -> SessionDeleteReply:
        self.calls.append(("session_purge", session_id))
        if session_id in self.sessions:
            await self.session_delete(session_id)
        if self.trash.pop(session_id, None) is None:
            raise ClientError(ErrorCode.NOT_FOUND, f"no session {session_id}")
        self.messages.pop(session_id, None)
        return SessionDeleteReply(session_id, self.sessions[self.session_id or ""])

    async def session_prompt(self, system_prompt: str | None = None,
                             session_id: str | None = None) -> SessionPromptReply:
        self.calls.append(("session_prompt", system_prompt))
        session = self._session(session_id)
        if system_prompt is not None:
            if system_prompt:
                self.prompts[session.session_id] = system_prompt
            else:
                self.prompts.pop(session.session_id, None)
        return SessionPromptReply(session, self.prompts.get(session.session_id))

    async def history_page(self, session_id: str | None = None, before: int | None = None,
                           limit: int | None = None) -> HistoryPageReply:
        session = self._session(session_id)
        msgs = [m for m in self.messages[session.session_id]
                if (before is None or (m.id or 0) < before) and m.id not in self.superseded]
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
        self.trash[session_id] = self.sessions.pop(session_id)
        if not self.sessions:
            await self.session_new()
        if self.session_id == session_id or self.session_id not in self.sessions:
            self.session_id = next(iter(self.sessions))
        return SessionDeleteReply(session_id, self.sessions[self.session_id or ""])

    async def session_clear(self, session_id: str | None = None, purge: bool = False) -> SessionClearReply:
        self.calls.append(("session_clear", purge))
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

    async def _redo(self, session_id: str | None, after: int, text: str | None) -> ChatRedoReply:
        """Supersede the messages from id ``after`` on (the user message too when ``text`` replaces it)."""
        sid = self._session(session_id).session_id
        msgs = self.messages[sid]
        gone = tuple(m.id for m in msgs if m.id is not None and m.id >= after and m.id not in self.superseded)
        self.superseded.update(gone)
        self._turns += 1
        if text is None:
            user = next(m for m in msgs if m.id == after - 1)
        else:
            self._ids += 1
            user = ChatMessage(self._ids, "user", text, stamp(self._turns), metadata={"edited_from": after})
            msgs.append(user)
        return ChatRedoReply(f"t{self._turns}", sid, user, gone)

    async def chat_regenerate(self, session_id: str | None = None) -> ChatRedoReply:
        self.calls.append(("chat_regenerate", session_id))
        msgs = [m for m in self.messages[self._session(session_id).session_id] if m.id not in self.superseded]
        last_user = next((m for m in reversed(msgs) if m.role == "user"), None)
        if last_user is None or last_user.id is None:
            raise ClientError(ErrorCode.INVALID_MESSAGE, "no user message to answer again")
        return await self._redo(session_id, last_user.id + 1, None)

    async def chat_edit(self, message_id: int, text: str, session_id: str | None = None) -> ChatRedoReply:
        self.calls.append(("chat_edit", (message_id, text)))
        msgs = self.messages[self._session(session_id).session_id]
        if not any(m.id == message_id and m.role == "user" and m.id not in self.superseded for m in msgs):
            raise ClientError(ErrorCode.NOT_FOUND, f"no user message {message_id}")
        return await self._redo(session_id, message_id, text)

    async def chat_cancel(self, session_id: str | None = None, turn_id: str | None = None) -> ChatCancelReply:
        self.calls.append(("chat_cancel", turn_id))
        return ChatCancelReply(turn_id or "")

    async def search(self, query: str, session_id: str | None = None, limit: int | None = None) -> HistorySearchReply:
        self.calls.append(("search", query))
        hits = [SearchHit(sid, self.sessions[sid].title, m.id or 0, m.role, m.content, m.timestamp, 1.0)
                for sid, msgs in self.messages.items() for m in msgs if query in m.content]
        return HistorySearchReply(tuple(hits))

    async def memory_list(self) -> MemoryListReply:
        self.calls.append(("memory_list", None))
        return MemoryListReply(True, tuple(self.memory))

    async def memory_forget(self, item_id: str) -> MemoryForgetReply:
        self.calls.append(("memory_forget", item_id))
        if not any(i.id == item_id for i in self.memory):
            raise ClientError(ErrorCode.NOT_FOUND, f"no memory item {item_id!r}")
        self.memory = [i for i in self.memory if i.id != item_id]
        return MemoryForgetReply(item_id)

    async def export(self, fmt: str, session_id: str | None = None) -> HistoryExportReply:
        session = self._session(session_id)
        text = "\n".join(m.content for m in self.messages[session.session_id])
        return HistoryExportReply(session.session_id, fmt, text)
