"""Stored chat messages -> the exact OpenAI chat sequence (used by the memory layer's context builder).

A stored assistant message carries every ToolCall of its turn. It expands, per step, into one
assistant message with ``tool_calls`` followed by one ``tool`` message per call with its result,
then the final assistant text. An assistant message is never separated from its tool results.
"""
from __future__ import annotations

from itertools import groupby
from typing import Any

import orjson

from server.tools.schema import RAW_ARGUMENTS
from storage.models import ChatMessage, ToolCall

UNFINISHED_RESULT = '{"error":"the tool call did not finish (the turn was interrupted)"}'


def arguments_text(call: ToolCall) -> str:
    """The JSON arguments string as the model sent it (raw text kept when it was not valid JSON)."""
    args = call.arguments
    if len(args) == 1 and isinstance(args.get(RAW_ARGUMENTS), str):
        return args[RAW_ARGUMENTS]
    return orjson.dumps(args).decode()


def assistant_tool_message(calls: list[ToolCall], content: str | None = None) -> dict[str, Any]:
    """The assistant message that issues ``calls``."""
    return {"role": "assistant", "content": content or None,
            "tool_calls": [{"id": c.id, "type": "function",
                            "function": {"name": c.tool_name, "arguments": arguments_text(c)}} for c in calls]}


def tool_messages(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """One ``tool`` message per call, in the order of the calls."""
    return [{"role": "tool", "tool_call_id": c.id, "content": c.result or UNFINISHED_RESULT} for c in calls]


def history_to_openai(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Expand stored user/assistant messages into OpenAI chat messages.

    user -> user; system -> system; assistant -> per step (assistant with tool_calls, tool results),
    then the final assistant content when it is not empty. Standalone ``tool`` messages are dropped:
    they cannot be valid without the assistant message that issued them.
    """
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role in ("user", "system"):
            out.append({"role": m.role, "content": m.content})
        elif m.role == "assistant":
            calls = sorted(m.tool_calls, key=lambda c: c.step)   # stable: keeps the order within a step
            for _, group in groupby(calls, key=lambda c: c.step):
                step_calls = list(group)
                out.append(assistant_tool_message(step_calls))
                out.extend(tool_messages(step_calls))
            if m.content:
                out.append({"role": "assistant", "content": m.content})
    return out
