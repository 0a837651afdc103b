"""One turn: the user message being answered, what has been streamed so far, and the sink that fans
its events out (``Turn.state()`` is the TurnState of docs/protocol.md, used to reattach)."""
from __future__ import annotations

import asyncio
import itertools
import secrets
from typing import Any

from protocol.objects import ChatMessage as MessageObj
from protocol.objects import QueuedTurn, TurnState
from protocol.server_events import (AnswerDelta, Notice, ToolCallEvent, ToolResultEvent, TurnEvent,
                                    TurnStatus)
from server.agent.toolexec import CANCELLED_RESULT
from server.hub import Hub, Subscriber
from server.wire import call_obj, message_obj
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
        """Tool calls for a partial message; calls still running are marked as not finished (the same
        JSON error result the tool step stores when it is cancelled: ``toolexec.CANCELLED_RESULT``)."""
        out = []
        for call in self.calls.values():
            if call.status == "running":
                call.status, call.result = "error", CANCELLED_RESULT
            out.append(call)
        return out

    def user_message_obj(self) -> MessageObj:
        """The stored user message, or (queued, not stored yet) the same shape with ``id: null``."""
        if self.user_message is not None:
            return message_obj(self.user_message)
        return MessageObj(None, "user", self.text, self.sent_at, (), {"queued": True})

    def state(self, queued: tuple[QueuedTurn, ...] = ()) -> TurnState:
        return TurnState(self.turn_id, self.session_id, self.user_message_obj(), self.status, self.content,
                         tuple(call_obj(c) for c in self.calls.values()), self.started_at or self.sent_at,
                         queued)


class RunnerSink:
    """TurnSink implementation: every call updates the Turn and fans out one event, without awaiting."""

    __slots__ = ("turn", "hub", "sid", "tid", "_publish")

    def __init__(self, turn: Turn, hub: Hub) -> None:
        self.turn = turn
        self.hub = hub
        self.sid = turn.session_id
        self.tid = turn.turn_id
        self._publish = hub.publish_turn

    def publish(self, event: TurnEvent) -> None:
        """One turn event to the session and the sender (which gets it with its request's ``re``)."""
        t = self.turn
        self._publish(self.sid, event, t.origin, t.re)

    async def status(self, status: str, detail: str | None = None) -> None:
        self.turn.status = status
        self.publish(TurnStatus(self.sid, self.tid, status, detail))

    async def tool_call(self, call: ToolCall) -> None:
        self.turn.calls[call.id] = call
        self.publish(ToolCallEvent(self.sid, self.tid, call_obj(call, running=True)))

    async def tool_result(self, call: ToolCall) -> None:
        self.turn.calls[call.id] = call
        self.publish(ToolResultEvent(self.sid, self.tid, call_obj(call)))

    async def delta(self, text: str) -> None:
        if not text:
            return
        t = self.turn
        offset = t.length
        t.parts.append(text)
        t.length = offset + len(text)
        self._publish(self.sid, AnswerDelta(self.sid, self.tid, text, offset), t.origin, t.re)  # (hot: inlined)
        if len(t.parts) % YIELD_EVERY == 0:  # an agent that never awaits must not starve the loop
            await asyncio.sleep(0)

    async def notice(self, level: str, code: str, message: str) -> None:
        self.hub.publish_session(self.sid, Notice(level, code, message, self.sid))
