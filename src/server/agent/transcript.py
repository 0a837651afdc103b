"""Stored chat messages -> the exact OpenAI chat sequence (used by the memory layer's context builder).

A stored assistant message carries every ToolCall of its turn. It expands, per step, into one
assistant message with ``tool_calls`` followed by one ``tool`` message per call with its result,
then the final assistant text. An assistant message is never separated from its tool results.
Text the model said in a step together with its tool calls goes back into that step's assistant
message when the stored metadata says where it is (``step_text``: ``[step, start, end]`` per step
that relayed text, offsets into the content, written by the OpenAI agent); a message without it
(older ones, partial answers, a content cut to fit or edited) keeps all its text in the final message.
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


def step_texts(m: ChatMessage, steps: set[int]) -> tuple[dict[int, str], str] | None:
    """(the text said in each of ``steps``, the rest: the final answer) of an assistant message, from
    its ``step_text`` metadata; None when it has none or it does not describe the content (the text
    outside the spans must be the separators between them only)."""
    spans = m.metadata.get("step_text")
    if not isinstance(spans, list) or not spans:
        return None
    content, pos = m.content, 0
    said: dict[int, str] = {}
    answer: list[str] = []
    gaps: list[str] = []
    for span in spans:
        if not (isinstance(span, list) and len(span) == 3 and all(type(x) is int for x in span)):
            return None
        step, start, end = span
        if not pos <= start <= end <= len(content) or step in said:
            return None
        gaps.append(content[pos:start])
        pos = end
        if step in steps:
            said[step] = content[start:end]
        else:
            answer.append(content[start:end])
    gaps.append(content[pos:])
    if "".join(gaps).strip():
        return None
    return said, "\n\n".join(answer)


def history_to_openai(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Expand stored user/assistant messages into OpenAI chat messages.

    user -> user; system -> system; assistant -> per step (assistant with tool_calls and the text
    said with them, tool results), then the final assistant content when it is not empty. Standalone
    ``tool`` messages are dropped: they cannot be valid without the assistant message that issued them.
    """
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role in ("user", "system"):
            out.append({"role": m.role, "content": m.content})
        elif m.role == "assistant":
            calls = sorted(m.tool_calls, key=lambda c: c.step)   # stable: keeps the order within a step
            split = step_texts(m, {c.step for c in calls}) if calls else None
            said, final = split if split is not None else ({}, m.content)
            for step, group in groupby(calls, key=lambda c: c.step):
                step_calls = list(group)
                out.append(assistant_tool_message(step_calls, said.get(step)))
                out.extend(tool_messages(step_calls))
            if final:
                out.append({"role": "assistant", "content": final})
    return out
