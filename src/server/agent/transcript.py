"""Stored chat messages -> the exact OpenAI chat sequence (used by the memory layer's context builder).

A stored assistant message carries every ToolCall of its turn. It expands, per step, into one
assistant message with ``tool_calls`` followed by one ``tool`` message per call with its result,
then the final assistant text. An assistant message is never separated from its tool results.
Text the model said in a step together with its tool calls goes back into that step's assistant
message when the stored metadata says where it is (``step_text``: ``[step, start, end]`` per step
that relayed text, offsets into the content, written by the OpenAI agent); a message without it
(older ones, partial answers, a content cut to fit or edited) keeps all its text in the final message.

Replayed ``search_knowledge`` results are checked again when a prompt is built: the passages of a
document the caller can no longer read (deleted, or of a group they are no longer in) are replaced
by a stub (``UNREADABLE_TEXT``), so a deleted document's text never reaches the model again
(``forget_unreadable``, run by the recall step ``readable_history`` wraps). It runs on the built
context, not in ``history_to_openai``: the memory layer expands each stored message once and keeps
it (``server.memory.view``), so a check made there would be stale once a document goes.
"""
from __future__ import annotations

import re
from itertools import groupby
from typing import Any, Awaitable, Callable

import orjson

from server.tools.schema import RAW_ARGUMENTS
from storage.models import ChatMessage, ToolCall

UNFINISHED_RESULT = '{"error":"the tool call did not finish (the turn was interrupted)"}'
#: the bare result older servers stored for a call a cancel stopped (not JSON): replayed as UNFINISHED_RESULT
LEGACY_INTERRUPTED_RESULT = "interrupted"
#: the key under which ``wire_arguments`` sends arguments that are not a JSON object
INVALID_ARGUMENTS_KEY = "invalid_arguments"
#: how much of such arguments is sent back to the model (the rest is cut, ending in ``…``)
MAX_INVALID_ARGUMENTS_CHARS = 2000


def wire_arguments(text: str) -> str:
    """``tool_calls[].function.arguments`` as sent to the model: always the text of a JSON object.

    Arguments that are one already go as they are (the model's own text). Anything else (cut at
    max_tokens, ``{metric: cpu``, a JSON array, a string) goes as ``{"invalid_arguments": "<the raw
    text, cut to MAX_INVALID_ARGUMENTS_CHARS>"}``; empty arguments as ``{}``. Strict servers (vLLM)
    JSON-parse every historical call's arguments and answer 400 to a request holding one that is not
    JSON, which failed every later turn of the session while the call was in its window. The stored
    call keeps the raw text, and the paired tool result already says what was wrong with it.
    """
    stripped = text.strip()
    if not stripped:
        return "{}"
    if stripped[0] == "{":
        try:
            if isinstance(orjson.loads(stripped), dict):
                return text
        except orjson.JSONDecodeError:
            pass
    if len(text) > MAX_INVALID_ARGUMENTS_CHARS:
        text = text[:MAX_INVALID_ARGUMENTS_CHARS - 1] + "…"
    return orjson.dumps({INVALID_ARGUMENTS_KEY: text}).decode()


def arguments_text(call: ToolCall) -> str:
    """The JSON arguments string as the model sent it, or, when that was not a JSON object (the raw
    text is kept under ``RAW_ARGUMENTS``), its ``wire_arguments`` form: always a JSON object."""
    args = call.arguments
    if len(args) == 1 and isinstance(args.get(RAW_ARGUMENTS), str):
        return wire_arguments(args[RAW_ARGUMENTS])
    return orjson.dumps(args).decode()


def assistant_tool_message(calls: list[ToolCall], content: str | None = None) -> dict[str, Any]:
    """The assistant message that issues ``calls``."""
    return {"role": "assistant", "content": content or None,
            "tool_calls": [{"id": c.id, "type": "function",
                            "function": {"name": c.tool_name, "arguments": arguments_text(c)}} for c in calls]}


def tool_messages(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """One ``tool`` message per call, in the order of the calls."""
    return [{"role": "tool", "tool_call_id": c.id, "content": _result_text(c)} for c in calls]


def _result_text(call: ToolCall) -> str:
    """A call's result as replayed: UNFINISHED_RESULT for one that has none, or the bare
    ``"interrupted"`` older servers stored for a call a cancel stopped."""
    result = call.result
    if not result or (result == LEGACY_INTERRUPTED_RESULT and call.status != "success"):
        return UNFINISHED_RESULT
    return result


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


# -- replayed knowledge passages of documents no longer readable ---------------------------------------
SEARCH_KNOWLEDGE = "search_knowledge"
#: the text a replayed passage of a document the caller can no longer read is replaced by
UNREADABLE_TEXT = "[document deleted or no longer readable]"
#: the note of a replayed result that was cut to fit (no longer JSON) and named such a document: it
#: is replaced whole, readable passages of its kept head included
UNREADABLE_CUT_NOTE = ("an earlier search result, cut to fit, quoted documents that were deleted or are no "
                       "longer readable: it is left out")
_DOC_ID = re.compile(r'"doc_id":"((?:[^"\\]|\\.)*)"')     # (compact JSON, as the tools write it)


def knowledge_results(messages: list[dict[str, Any]]) -> list[int]:
    """The indexes of the ``tool`` messages that answer a ``search_knowledge`` call (each right after
    the assistant message that issued it, as ``sanitize`` leaves them)."""
    out: list[int] = []
    names: dict[Any, Any] = {}
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            names = {c.get("id"): (c.get("function") or {}).get("name")
                     for c in m["tool_calls"] if isinstance(c, dict)}
        elif role == "tool":
            if names.get(m.get("tool_call_id")) == SEARCH_KNOWLEDGE and isinstance(m.get("content"), str):
                out.append(i)
        else:
            names = {}
    return out


def parsed_result(content: str) -> tuple[dict[str, Any], list[Any]] | None:
    """(the result, its passages) of a whole search_knowledge result; None for anything else (an
    error result has no passages; a result cut to fit the window is no longer JSON)."""
    try:
        doc = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("passages"), list):
        return None
    return doc, doc["passages"]


def _named_doc_ids(content: str) -> set[str]:
    """The document ids a result names: its passages' (whole), or every ``"doc_id"`` in its text (cut)."""
    parsed = parsed_result(content)
    if parsed is not None:
        return {p["doc_id"] for p in parsed[1] if isinstance(p, dict) and isinstance(p.get("doc_id"), str)}
    if '"passages"' not in content:      # an error result (or no search result at all): names nothing
        return set()
    out = set()
    for raw in _DOC_ID.findall(content):
        try:
            out.add(orjson.loads(f'"{raw}"'))
        except orjson.JSONDecodeError:
            out.add(raw)
    return out


def replayed_doc_ids(messages: list[dict[str, Any]]) -> set[str]:
    """The ids of the documents whose passages the replayed ``search_knowledge`` results carry."""
    out: set[str] = set()
    for i in knowledge_results(messages):
        out |= _named_doc_ids(messages[i]["content"])
    return out


def _stub(p: dict[str, Any]) -> dict[str, Any]:
    """A passage of a document no longer readable: which one it was, its text replaced."""
    kept = {k: p[k] for k in ("citation", "collection", "doc_id", "chunk_id") if p.get(k) is not None}
    return {**kept, "text": UNREADABLE_TEXT}


def stub_unreadable(messages: list[dict[str, Any]], readable: set[str]) -> int:
    """Replace, in ``messages`` (a prompt), the replayed ``search_knowledge`` passages of documents not
    in ``readable`` by ``_stub``s; how many passages were replaced. A result cut to fit (no longer
    JSON) that names such a document is replaced whole (``UNREADABLE_CUT_NOTE``). Changed messages are
    new dicts (the memory layer's cached ones are never changed); the call ids stay."""
    n = 0
    for i in knowledge_results(messages):
        m = messages[i]
        content = m["content"]
        parsed = parsed_result(content)
        if parsed is not None:
            doc, passages = parsed
            gone = [isinstance(p, dict) and isinstance(p.get("doc_id"), str) and p["doc_id"] not in readable
                    for p in passages]
            if any(gone):
                kept = [_stub(p) if g else p for p, g in zip(passages, gone)]
                messages[i] = {**m, "content": orjson.dumps({**doc, "passages": kept}).decode()}
                n += sum(gone)
            continue
        lost = sorted(d for d in _named_doc_ids(content) if d not in readable)
        if lost:
            stubs = [{"doc_id": d, "text": UNREADABLE_TEXT} for d in lost]
            messages[i] = {**m, "content": orjson.dumps({"note": UNREADABLE_CUT_NOTE, "passages": stubs}).decode()}
            n += len(lost)
    return n


async def forget_unreadable(messages: list[dict[str, Any]], source: Any, user_id: str) -> int:
    """``stub_unreadable`` with what ``user_id`` can read now, asked of ``source`` (a
    ``server.tools.knowledge.KnowledgeSource``: ``readable_doc_ids``) for the replayed documents
    only; nothing is asked when no search result is replayed. How many passages were replaced."""
    if source is None:
        return 0
    ids = replayed_doc_ids(messages)
    if not ids:
        return 0
    return stub_unreadable(messages, await source.readable_doc_ids(user_id, ids))


def readable_history(recall: Callable[[Any], Awaitable[None]], source: Any) -> Callable[[Any], Awaitable[None]]:
    """The pipeline's ``recall`` step (``server.pipeline.recall_step``), then ``forget_unreadable`` on
    the context it built; the count of replaced passages goes to the recall record
    (``unreadable_passages``) when there are any. ``source``: the search_knowledge tool's
    ``KnowledgeSource`` (None: no knowledge base, the step is ``recall`` as it is)."""
    async def recall_readable(state: Any) -> None:
        await recall(state)
        ctx = state.context
        if ctx is None:
            return
        n = await forget_unreadable(ctx.messages, source, state.user_id)
        if n:
            state.trace.setdefault("recall", {})["unreadable_passages"] = n
    recall_readable.forgets_unreadable = True      # type: ignore[attr-defined]
    return recall_readable
