"""The agent interface the turn pipeline drives: TurnSink (events out), TurnRequest, TurnResult, Agent.

``Agent.tool_schema_tokens(user_id)``: what every request of the turn carries besides its messages
(the tool schemas), reserved from the prompt budget before the context is built (docs/memory.md).

See docs/architecture.md. An agent reports everything it does through the sink; the turn runner turns
each call into protocol events and, on cancellation, builds the partial answer from what it received.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from protocol import ErrorCode
from storage.models import ChatMessage, ToolCall


@dataclass(slots=True)
class BuiltContext:
    """The prompt for one turn: OpenAI-style chat messages (system prompt first, new message last)."""
    messages: list[dict[str, Any]]
    metadata: dict[str, Any] = field(default_factory=dict)


class TurnSink(Protocol):
    async def status(self, status: str, detail: str | None = None) -> None: ...
    async def tool_call(self, call: ToolCall) -> None: ...
    async def tool_result(self, call: ToolCall) -> None: ...
    async def delta(self, text: str) -> None: ...
    async def notice(self, level: str, code: str, message: str) -> None: ...


@dataclass(slots=True)
class TurnRequest:
    session_id: str
    user_id: str
    model: str
    turn_id: str
    user_message: ChatMessage
    context: BuiltContext


@dataclass(slots=True)
class TurnResult:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = "stop"
    metadata: dict[str, Any] = field(default_factory=dict)


class AgentError(Exception):
    """A turn failed for a reason the user should see (``code``: the protocol ERROR code, e.g. LLM_ERROR).

    ``attempts``: how many times the failing model call was tried (1 when it was not retried).
    """

    def __init__(self, code: ErrorCode, message: str, attempts: int = 1) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)   # a string that is not a protocol code is a bug: ValueError here
        self.message = message
        self.attempts = attempts


class IncompleteAnswer(AgentError):
    """A completion the endpoint did not finish (``Agent.complete``): ``finish_reason`` ``length`` (cut
    at max_tokens) or ``content_filter`` (withheld). Code LLM_ERROR; ``content`` is the text it sent,
    which is no answer (a summary cut mid-sentence must not be stored as the summary)."""

    def __init__(self, finish_reason: str, content: str, message: str, attempts: int = 1) -> None:
        super().__init__(ErrorCode.LLM_ERROR, message, attempts)
        self.finish_reason = finish_reason
        self.content = content


@runtime_checkable
class Agent(Protocol):
    name: str
    offline: bool
    default_model: str

    def models(self) -> list[str]: ...
    async def run_turn(self, req: TurnRequest, sink: TurnSink) -> TurnResult: ...
    # tokens every model request of ``user_id``'s turn carries besides its messages (the tool schemas)
    async def tool_schema_tokens(self, user_id: str) -> int: ...
    # one completion without tools; raises AgentError (IncompleteAnswer: cut by length, content filter)
    async def complete(self, messages: list[dict[str, Any]], model: str | None = None) -> str: ...
    async def aclose(self) -> None: ...


async def tool_schema_tokens(agent: Any, user_id: str) -> int:
    """The tokens ``agent`` adds to each request of ``user_id``'s turn outside the messages (the
    ``tools`` schemas it offers), which the prompt budget reserves; 0 for an agent that sends none
    or does not say (the offline agent, test fakes)."""
    count = getattr(agent, "tool_schema_tokens", None)
    return max(0, int(await count(user_id))) if count is not None else 0
