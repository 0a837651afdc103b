"""One turn: the user message being answered, what has been streamed so far, and the sink that fans
its events out (``Turn.state()`` is the TurnState of docs/protocol.md, used to reattach)."""
from __future__ import annotations

import asyncio
import itertools
import secrets
from typing import Any

from protocol import MsgType
from server.hub import Event, Hub, Subscriber
from storage.models import ChatMessage, ToolCall, now_iso

_TURN_PREFIX = secrets.token_hex(4)   # unique per server run; the counter makes ids unique within it
_turn_counter = itertools.count(1)
YIELD_EVERY = 32  # deltas between forced yields to the event loop


class Turn:
    """One user message being answered; holds what has been streamed so far."""

    __slots__ = ("turn_id", "session_id", "user_id", "text", "sent_at", "user_message", "origin", "re",
                 "model", "status", "parts", "length", "calls", "started_at", "task", "cancel_reason")

    def __init__(self, session_id: str, user_id: str, text: str,
                 origin: Subscriber | None, re: Any) -> None:
        self.turn_id = f"t_{_TURN_PREFIX}{next(_turn_counter):x}"
        self.session_id = session_id
        self.user_id = user_id
        self.text = text
        self.sent_at = now_iso()
        self.user_message: ChatMessage | None = None   # set once stored
        self.origin = origin
        self.re = re
        self.model = ""
        self.status = "thinking"
        self.parts: list[str] = []
        self.length = 0
        self.calls: dict[str, ToolCall] = {}
        self.started_at: str | None = None
        self.task: asyncio.Task | None = None
        self.cancel_reason: str | None = None

    @property
    def content(self) -> str:
        if len(self.parts) > 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    def finished_calls(self) -> list[ToolCall]:
        """Tool calls for a partial message; calls still running are marked interrupted."""
        out = []
        for call in self.calls.values():
            if call.status == "running":
                call.status, call.result = "error", "interrupted"
            out.append(call)
        return out

    def user_message_dict(self) -> dict[str, Any]:
        """The stored user message, or (queued, not stored yet) the same shape with ``id: null``."""
        if self.user_message is not None:
            return self.user_message.to_dict()
        return {"id": None, "role": "user", "content": self.text, "timestamp": self.sent_at,
                "tool_calls": [], "metadata": {"queued": True}}

    def state(self) -> dict[str, Any]:
        return {"turn_id": self.turn_id, "session_id": self.session_id,
                "user_message": self.user_message_dict(), "status": self.status,
                "content": self.content, "tool_calls": [c.to_dict() for c in self.calls.values()],
                "started_at": self.started_at or self.sent_at}


class RunnerSink:
    """TurnSink implementation: every call updates the Turn and fans out one event, without awaiting."""

    __slots__ = ("turn", "hub", "base")

    def __init__(self, turn: Turn, hub: Hub) -> None:
        self.turn = turn
        self.hub = hub
        self.base = {"session_id": turn.session_id, "turn_id": turn.turn_id}

    def publish(self, msg_type: int, extra: dict[str, Any]) -> None:
        """One turn event (``extra`` plus the session and turn ids) to the session and the sender."""
        t = self.turn
        self.hub.publish_turn(t.session_id, Event(msg_type, {**self.base, **extra}), t.origin, t.re)

    async def status(self, status: str, detail: str | None = None) -> None:
        self.turn.status = status
        self.publish(MsgType.TURN_STATUS, {"status": status} if detail is None else
                      {"status": status, "detail": detail})

    async def tool_call(self, call: ToolCall) -> None:
        self.turn.calls[call.id] = call
        d = call.to_dict()
        d.update(result="", status="running", duration=0)
        self.publish(MsgType.TOOL_CALL, {"call": d})

    async def tool_result(self, call: ToolCall) -> None:
        self.turn.calls[call.id] = call
        self.publish(MsgType.TOOL_RESULT, {"call": call.to_dict()})

    async def delta(self, text: str) -> None:
        if not text:
            return
        t = self.turn
        offset = t.length
        t.parts.append(text)
        t.length = offset + len(text)
        self.publish(MsgType.ANSWER_DELTA, {"text": text, "offset": offset})
        if len(t.parts) % YIELD_EVERY == 0:  # an agent that never awaits must not starve the loop
            await asyncio.sleep(0)

    async def notice(self, level: str, code: str, message: str) -> None:
        self.hub.publish_session(self.turn.session_id, Event(MsgType.NOTICE, {
            "level": level, "code": code, "message": message, "session_id": self.turn.session_id}))
