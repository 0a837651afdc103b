"""Exports of one session: JSON (machine-readable) and Markdown (for people)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from .models import ChatMessage, SessionRecord
from .session import SCHEMA_VERSION

FORMATS = ("json", "markdown")


def export(record: SessionRecord, messages: list[ChatMessage], fmt: str, model: str | None = None) -> str:
    """``fmt`` (one of FORMATS, checked by the caller) of the session; ``model``, when given, is the
    model named in the header instead of the stored one (the server's effective model: a session
    on the default model stores none)."""
    if model:
        record = replace(record, model=model)
    return export_json(record, messages) if fmt == "json" else export_markdown(record, messages)


def export_json(record: SessionRecord, messages: list[ChatMessage]) -> str:
    doc = {"schema_version": SCHEMA_VERSION, "session": record.to_dict(),
           "messages": [m.to_dict() for m in messages]}
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode()


def _fence(text: str, lang: str = "") -> str:
    """A code block whose fence is longer than any backtick run inside ``text``."""
    longest = run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text}\n{fence}"


def _tool_call(tc: Any) -> str:
    args = orjson.dumps(tc.arguments, option=orjson.OPT_INDENT_2).decode()
    head = f"Tool call: {tc.tool_name} ({tc.status}, {tc.duration:.3f} s)"
    parts = [f"<details><summary>{_escape(head)}</summary>", "", f"Call id `{tc.id}`, step {tc.step}, "
             f"at {tc.timestamp}", "", "Arguments:", "", _fence(args, "json"), "", "Result:", "",
             _fence(tc.result), "", "</details>"]
    return "\n".join(parts)


def _escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def export_markdown(record: SessionRecord, messages: list[ChatMessage]) -> str:
    out = [f"# {record.title}", "",
           f"- Session: `{record.session_id}`",
           f"- User: {record.user_id}",
           f"- Created: {record.created_at}",
           f"- Updated: {record.updated_at}",
           f"- Model: {record.model or '-'}",
           f"- Messages: {record.message_count}"]
    if record.summary is not None:
        out += [f"- Summary (messages up to #{record.summary.covers_to_id}): {record.summary.text}"]
    if record.system_prompt is not None:
        out += ["", "System prompt:", "", _fence(record.system_prompt)]
    for m in messages:
        flags, body = _marks(m)
        out += ["", "---", "", f"### {m.role.capitalize()} #{m.id}{flags}", "", f"*{m.timestamp}*", "", body]
        cites = [c.get("citation") for c in m.metadata.get("citations") or () if isinstance(c, dict)]
        if any(cites):   # the documents an answer quoted (knowledge base, docs/knowledge.md)
            out += ["", "Sources: " + " ".join(c for c in cites if c)]
        for tc in m.tool_calls:
            out += ["", _tool_call(tc)]
        context = m.metadata.get("context") if m.role == "assistant" else None
        if isinstance(context, dict) and context:
            out += ["", _context(context)]
    return "\n".join(out) + "\n"


def _marks(m: ChatMessage) -> tuple[str, str]:
    """The heading's flags and the body of one message: a cancelled or failed answer says so (an
    empty body would read as an empty answer), a replaced one says it was replaced."""
    meta, body = m.metadata, m.content
    flags = []
    if meta.get("partial"):
        flags.append("partial")
    error = meta.get("error")
    if meta.get("finish_reason") == "cancelled":
        flags.append("cancelled")
        if not body and not m.tool_calls:
            body = "*[cancelled before any answer]*"
    elif meta.get("finish_reason") == "interrupted":   # closed at start after a crash (server.recovery)
        flags.append("interrupted")
        if not body and not m.tool_calls:
            body = "*[interrupted: the server stopped before the answer was finished]*"
    elif error:
        flags.append(f"failed: {error}")
        if not body and not m.tool_calls:
            attempts = meta.get("attempts")
            tries = f" (after {attempts} attempts)" if isinstance(attempts, int) and attempts > 1 else ""
            body = f"*[no answer: {meta.get('error_message') or error}{tries}]*"
    if isinstance(meta.get("edited_from"), int):
        flags.append(f"edited, replaces #{meta['edited_from']}")
    if meta.get("superseded"):
        flags.append("superseded")
    return (f" ({', '.join(flags)})" if flags else ""), body


def _context(context: dict[str, Any]) -> str:
    """What reached the model for an answer (the server's context metadata, ids only)."""
    body = orjson.dumps(context, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
    return "\n".join(["<details><summary>Why this answer (context sent to the model)</summary>", "",
                      _fence(body, "json"), "", "</details>"])
