"""Exports of one session: JSON (machine-readable) and Markdown (for people).

An export is built in pieces (a header, then one piece per message). With a ``max_bytes`` budget it
is refused as soon as the pieces built so far are over it (``ExportTooLarge``): a session far larger
than a reply can hold then costs about ``max_bytes`` of work and memory, not its whole size, and the
messages past that point are never converted (``messages`` may be a lazy iterable).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable

import re

import orjson

from .errors import MessageTooLarge
from .models import ChatMessage, SessionRecord
from .session import SCHEMA_VERSION

FORMATS = ("json", "markdown")
_BACKTICKS = re.compile("`+")


class ExportTooLarge(MessageTooLarge):
    """The export is over its ``max_bytes`` budget: raised while it is built, as soon as the part
    built so far is over (the rest is not built). ``size``: the bytes counted so far (JSON-escaped, as
    in a reply), after ``done`` of ``total`` messages; ``limit``: the budget."""

    def __init__(self, fmt: str, size: int, done: int, total: int | None, limit: int) -> None:
        of = f" of {total}" if total is not None else ""
        super().__init__(f"the {fmt} export is over {limit} bytes: {size} bytes so far, after {done}{of} "
                         "messages (not built further)")
        self.fmt, self.size, self.done, self.total, self.limit = fmt, size, done, total, limit


def wire_size(text: str) -> int:
    """The bytes ``text`` takes inside a JSON string (a reply's ``content``): UTF-8, escapes counted.
    JSON escapes each character on its own, so a concatenation takes the sum of its pieces."""
    try:
        return len(orjson.dumps(text)) - 2
    except orjson.JSONEncodeError:          # (a lone surrogate: not sendable anyway; a lower bound)
        return len(text)


class _Budget:
    """Counts the pieces of one export; raises ExportTooLarge once they are over ``limit``."""

    __slots__ = ("fmt", "limit", "total", "size", "done")

    def __init__(self, fmt: str, limit: int | None, total: int | None) -> None:
        self.fmt, self.limit, self.total = fmt, limit, total
        self.size = self.done = 0

    def add(self, piece: str, *, message: bool = True) -> str:
        if self.limit is not None:
            self.size += wire_size(piece)
            if self.size > self.limit:
                raise ExportTooLarge(self.fmt, self.size, self.done, self.total, self.limit)
        self.done += message
        return piece


def export(record: SessionRecord, messages: Iterable[ChatMessage], fmt: str, model: str | None = None, *,
           max_bytes: int | None = None, total: int | None = None) -> str:
    """``fmt`` (one of FORMATS, checked by the caller) of the session; ``model``, when given, is the
    model named in the header instead of the stored one (the server's effective model: a session
    on the default model stores none). ``max_bytes``: the most the text may take JSON-escaped (the
    room left in the reply), else ExportTooLarge as soon as the part built is over it (None: no
    bound); ``total``: how many messages ``messages`` holds, named in that error (``len`` of a list)."""
    if model:
        record = replace(record, model=model)
    if total is None and isinstance(messages, (list, tuple)):
        total = len(messages)
    budget = _Budget(fmt, max_bytes, total)
    try:
        return export_json(record, messages, budget) if fmt == "json" else export_markdown(record, messages, budget)
    except ExportTooLarge as exc:
        # raised without the frames of the build: they hold its pieces (up to max_bytes), which would
        # live on with the error, until a full garbage collection when a reference cycle holds it
        raise exc.with_traceback(None)


def export_json(record: SessionRecord, messages: Iterable[ChatMessage], budget: _Budget | None = None) -> str:
    """The text of ``orjson.dumps({"schema_version", "session", "messages"}, OPT_INDENT_2)``, built one
    message at a time: each is indented as at depth 2 of that document (a newline never occurs inside
    a JSON string, so indenting every line is exact)."""
    add = (budget or _Budget("json", None, None)).add
    session = record.to_dict()
    summaries, session["summaries"] = session["summaries"], []
    head = orjson.dumps({"schema_version": SCHEMA_VERSION, "session": session}, option=orjson.OPT_INDENT_2).decode()
    # the summaries (a long session has thousands) are counted one by one too: the head is cut at its
    # empty list, which occurs once (a raw newline never occurs inside a JSON string)
    cut = head.index(_SUMMARIES) + len(_SUMMARIES) - 1
    parts = [add(head[:cut], message=False)]
    _items(parts, add, summaries, "\n      ", message=False)
    parts.append(add(head[cut + 1:-2] + ',\n  "messages": [', message=False))     # (the head ends "\n}")
    _items(parts, add, (m.to_dict() for m in messages), "\n    ", message=True)
    parts.append(add("\n}", message=False))
    return "".join(parts)


_SUMMARIES = '\n    "summaries": []'


def _items(parts: list[str], add: Any, items: Iterable[Any], indent: str, *, message: bool) -> None:
    """The items of a JSON array at the depth ``indent`` gives, then its closing bracket (as
    ``orjson.dumps(..., OPT_INDENT_2)`` writes them), each counted by ``add``."""
    sep = indent
    for item in items:
        parts.append(add(sep + orjson.dumps(item, option=orjson.OPT_INDENT_2).decode().replace("\n", indent),
                         message=message))
        sep = "," + indent
    parts.append(add("]" if sep == indent else indent[:-2] + "]", message=False))


def _fence(text: str, lang: str = "") -> str:
    """A code block whose fence is longer than any backtick run inside ``text`` (found by a regular
    expression: a loop over the characters in Python took most of a large Markdown export)."""
    longest = max(map(len, _BACKTICKS.findall(text)), default=0) if "`" in text else 0
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


def export_markdown(record: SessionRecord, messages: Iterable[ChatMessage], budget: _Budget | None = None) -> str:
    add = (budget or _Budget("markdown", None, None)).add
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
    parts = [add("\n".join(out), message=False)]
    for m in messages:
        parts.append(add("\n" + "\n".join(_message_lines(m))))
    parts.append(add("\n", message=False))
    return "".join(parts)


def _message_lines(m: ChatMessage) -> list[str]:
    """The Markdown lines of one message (the first follows the header or the previous message)."""
    flags, body = _marks(m)
    out = ["", "---", "", f"### {m.role.capitalize()} #{m.id}{flags}", "", f"*{m.timestamp}*", "", body]
    cites = [source_label(c) for c in m.metadata.get("citations") or () if isinstance(c, dict)]
    if any(cites):   # the documents an answer quoted (knowledge base, docs/knowledge.md)
        out += ["", "Sources: " + " ".join(c for c in cites if c)]
    for tc in m.tool_calls:
        out += ["", _tool_call(tc)]
    context = m.metadata.get("context") if m.role == "assistant" else None
    if isinstance(context, dict) and context:
        out += ["", _context(context)]
    return out


def source_label(cite: dict[str, Any]) -> str:
    """One source of an answer: its citation (``[runbook.md §Backup, line 5]``), followed by
    ``(group NAME)`` for a passage of a group's document (metadata ``collection`` ``group:NAME``), as
    the answer's own source lines say it, so a personal and a group document of one name are told
    apart; "" without a citation."""
    text = str(cite.get("citation") or "")
    coll = cite.get("collection")
    if text and isinstance(coll, str) and coll.startswith("group:") and len(coll) > len("group:"):
        text += f" (group {coll[len('group:'):]})"
    return text


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
