"""Exports of one session: JSON (machine-readable) and Markdown (for people)."""
from __future__ import annotations

from typing import Any

import orjson

from .models import ChatMessage, SessionRecord
from .session import SCHEMA_VERSION

FORMATS = ("json", "markdown")


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
    for m in messages:
        flags = (" (partial, interrupted)" if m.metadata.get("interrupted") else " (partial)") \
            if m.metadata.get("partial") else ""
        out += ["", "---", "", f"### {m.role.capitalize()} #{m.id}{flags}", "", f"*{m.timestamp}*", "",
                m.content]
        for tc in m.tool_calls:
            out += ["", _tool_call(tc)]
    return "\n".join(out) + "\n"
