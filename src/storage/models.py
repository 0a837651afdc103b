"""The stored data model: ToolCall, ChatMessage, SummaryRecord, SessionRecord, Page, SearchHit.

Each class converts to and from the JSON objects of docs/protocol.md §3 with ``to_dict`` /
``from_dict``; ``from_dict`` tolerates missing optional fields so older files still load, but not
fields of the wrong type (``SessionRecord.from_snapshot`` repairs those of a snapshot, saying so).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import orjson

ROLES = ("user", "assistant", "system", "tool")
TOOL_STATUSES = ("success", "error", "timeout", "running")


def now_iso() -> str:
    """Current time as ISO 8601 with timezone (UTC)."""
    return datetime.now(timezone.utc).isoformat()


DEFAULT_TITLE = "New chat"          # a new session's title, and an automatic one's after a clear

@dataclass(slots=True)
class ToolCall:
    id: str
    tool_name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    result: str = ""
    status: str = "success"
    duration: float = 0.0
    timestamp: str = field(default_factory=now_iso)
    step: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "tool_name": self.tool_name, "arguments": self.arguments,
            "result": self.result, "status": self.status, "duration": self.duration,
            "timestamp": self.timestamp, "step": self.step,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolCall:
        return cls(
            id=str(d["id"]), tool_name=str(d["tool_name"]), arguments=dict(d.get("arguments") or {}),
            result=str(d.get("result", "")), status=str(d.get("status", "success")),
            duration=float(d.get("duration", 0.0)), timestamp=str(d.get("timestamp") or now_iso()),
            step=int(d.get("step", 0)),
        )


@dataclass(slots=True)
class ChatMessage:
    id: int
    role: str
    content: str
    timestamp: str = field(default_factory=now_iso)
    tool_calls: list[ToolCall] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "role": self.role, "content": self.content, "timestamp": self.timestamp,
            "tool_calls": [t.to_dict() for t in self.tool_calls], "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChatMessage:
        return cls(
            id=int(d["id"]), role=str(d["role"]), content=str(d.get("content", "")),
            timestamp=str(d.get("timestamp") or now_iso()),
            tool_calls=[ToolCall.from_dict(t) for t in d.get("tool_calls") or ()],
            metadata=dict(d.get("metadata") or {}),
        )


@dataclass(slots=True, frozen=True)
class SummaryRecord:
    """A summary of messages covers_from_id..covers_to_id; immutable, so records can share it."""

    text: str
    covers_from_id: int
    covers_to_id: int
    created_at: str = field(default_factory=now_iso)
    model: str = ""

    @classmethod
    def withdrawal(cls) -> SummaryRecord:
        """A record covering nothing: added after summaries, it withdraws them (the session has no
        summary until the next one; an edit superseded messages they covered)."""
        return cls(text="", covers_from_id=0, covers_to_id=0)

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "covers_from_id": self.covers_from_id, "covers_to_id": self.covers_to_id,
                "created_at": self.created_at, "model": self.model}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SummaryRecord:
        return cls(text=str(d["text"]), covers_from_id=int(d.get("covers_from_id", 1)),
                   covers_to_id=int(d["covers_to_id"]), created_at=str(d.get("created_at") or now_iso()),
                   model=str(d.get("model", "")))

    @classmethod
    def checked(cls, d: Any) -> SummaryRecord:
        """``from_dict`` with strict types (a snapshot's summaries): TypeError / ValueError / KeyError."""
        if not isinstance(d, dict):
            raise TypeError("summary record is not an object")
        text, first, last = d["text"], d.get("covers_from_id", 1), d["covers_to_id"]
        created, model = d.get("created_at") or now_iso(), d.get("model", "")
        if not isinstance(text, str) or type(first) is not int or type(last) is not int \
                or not isinstance(created, str) or not isinstance(model, str):
            raise ValueError("summary record field of the wrong type")
        return cls(text=text, covers_from_id=first, covers_to_id=last, created_at=created, model=model)


@dataclass(slots=True)
class SessionRecord:
    session_id: str
    user_id: str
    title: str
    created_at: str
    updated_at: str
    message_count: int = 0
    deleted: bool = False
    model: str | None = None
    preview: str = ""
    summaries: list[SummaryRecord] = field(default_factory=list)
    system_prompt: str | None = None     # the session's own system prompt (None: the server's)
    title_auto: bool = False             # the title was made from the first message (a clear resets it)

    @property
    def summary(self) -> SummaryRecord | None:
        """The newest summary (it folds every earlier one in); None when there is none or the newest
        record is a withdrawal (``SummaryRecord.withdrawal``)."""
        s = self.summaries[-1] if self.summaries else None
        return s if s is not None and s.covers_to_id > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id, "user_id": self.user_id, "title": self.title,
            "created_at": self.created_at, "updated_at": self.updated_at,
            "message_count": self.message_count, "deleted": self.deleted, "model": self.model,
            "preview": self.preview, "summaries": [s.to_dict() for s in self.summaries],
            "system_prompt": self.system_prompt, "title_auto": self.title_auto,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SessionRecord:
        """A record from its dict (an index entry, a record the store wrote), with strict types:
        ValueError (TypeError for a non-object) on a field of the wrong type, never a silent
        coercion (``bool("no")`` is True). Missing optional fields take their defaults. A snapshot's
        record is read with ``from_snapshot`` instead, which repairs what it can."""
        record, problems = cls.from_snapshot(d, repair=False)
        if problems:
            raise ValueError("; ".join(problems))
        return record

    @classmethod
    def from_snapshot(cls, d: Any, *, messages: list[dict[str, Any]] = (), fallback_time: str | None = None,
                      repair: bool = True) -> tuple[SessionRecord, list[str]]:
        """A record read from a snapshot, with strict types, and the list of fields that were not
        of their type (``"field: what"``), each replaced by a safe value: ``deleted`` -> False (a
        session is never sent to the trash by a bad value), ``title`` -> one made from the first
        user message (``title_auto``) or DEFAULT_TITLE, ``created_at`` / ``updated_at`` (not an ISO
        8601 date) -> the first / last message's timestamp, else ``fallback_time`` (the file's
        mtime), ``model`` / ``system_prompt`` -> None, ``title_auto`` -> False, bad ``summaries``
        -> none (the server summarizes again). ``message_count`` and ``preview`` are recomputed on
        load and not checked. A record that names no session or no user (``session_id``,
        ``user_id`` not non-empty strings) cannot be repaired: ValueError. With ``repair`` False
        the problems are only reported (``from_dict`` raises on them)."""
        if not isinstance(d, dict):
            raise TypeError(f"session record is a {type(d).__name__}, not an object")
        for key in ("session_id", "user_id"):
            if not isinstance(d.get(key), str) or not d[key]:
                raise ValueError(f"session record: {key} {d.get(key)!r} is not a non-empty string")
        problems: list[str] = []

        def bad(field_name: str, value: Any, replacement: Any) -> Any:
            problems.append(f"{field_name}: {_shown(value)} is not {_EXPECTED[field_name]}"
                            + (f", replaced by {_shown(replacement)}" if repair else ""))
            return replacement

        title = d.get("title", DEFAULT_TITLE)
        title_auto = d.get("title_auto", False)
        if type(title_auto) is not bool:
            title_auto = bad("title_auto", title_auto, False)
        if not isinstance(title, str):
            made = title_from_messages(messages)
            title = bad("title", title, made if made is not None else DEFAULT_TITLE)
            title_auto = made is not None
        deleted = d.get("deleted", False)
        if type(deleted) is not bool:
            deleted = bad("deleted", deleted, False)
        created = d.get("created_at")
        if not is_iso_time(created):
            created = bad("created_at", created, _message_time(messages, 0) or fallback_time or now_iso())
        updated = d.get("updated_at", created) if repair else d.get("updated_at")
        if not is_iso_time(updated):
            updated = bad("updated_at", updated, _message_time(messages, -1) or fallback_time or created)
        model = d.get("model")
        if model is not None and not isinstance(model, str):
            model = bad("model", model, None)
        prompt = d.get("system_prompt")
        if prompt is not None and not isinstance(prompt, str):
            prompt = bad("system_prompt", prompt, None)
        raw_summaries = d.get("summaries") or []
        try:
            if not isinstance(raw_summaries, list):
                raise TypeError("not a list")
            summaries = [SummaryRecord.checked(s) for s in raw_summaries]
        except (KeyError, TypeError, ValueError):
            summaries = bad("summaries", raw_summaries, [])
        count, preview = d.get("message_count", 0), d.get("preview", "")
        if not repair and (type(count) is not int or not isinstance(preview, str)):
            problems.append(f"message_count {_shown(count)} or preview {_shown(preview)} of the wrong type")
        return cls(session_id=d["session_id"], user_id=d["user_id"], title=title, created_at=created,
                   updated_at=updated, message_count=count if type(count) is int else 0, deleted=deleted,
                   model=model, preview=preview if isinstance(preview, str) else "", summaries=summaries,
                   system_prompt=prompt, title_auto=title_auto), problems


#: what each checked field of a session record must be (the repair messages say it)
_EXPECTED = {"title": "a string", "title_auto": "true or false", "deleted": "true or false",
             "created_at": "an ISO 8601 date", "updated_at": "an ISO 8601 date",
             "model": "a string or null", "system_prompt": "a string or null",
             "summaries": "a list of summary records"}

#: longest title made from the first user message when a snapshot's title is unusable
REPAIRED_TITLE_CHARS = 60


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_iso_time(value: Any) -> bool:
    """``value`` is an ISO 8601 date and time string (what the store writes: ``now_iso()``)."""
    if not isinstance(value, str) or len(value) < 10:
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def _message_time(messages: list[dict[str, Any]], i: int) -> str | None:
    """The timestamp of ``messages[i]`` if it is a valid ISO 8601 date."""
    if not messages:
        return None
    m = messages[i]
    t = m.get("timestamp") if isinstance(m, dict) else None
    return t if is_iso_time(t) else None


def title_from_messages(messages: list[dict[str, Any]]) -> str | None:
    """A title from the first user message's first line (at most REPAIRED_TITLE_CHARS), or None."""
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str):
            line = " ".join(m["content"].split())
            if line:
                return line if len(line) <= REPAIRED_TITLE_CHARS else line[:REPAIRED_TITLE_CHARS - 1] + "\u2026"
    return None


@dataclass(slots=True)
class Page:
    """One page of history: ``messages`` ascending by id; pages run newest-first."""
    messages: list[ChatMessage]
    has_more: bool
    next_before: int | None
    total: int


@dataclass(slots=True)
class EncodedPage:
    """A page whose messages are already JSON: ``messages[i]`` is ``orjson.dumps(m.to_dict())``
    of the i-th message (the protocol's Message object, byte for byte), ``superseded[i]`` whether
    its metadata marks it replaced by a regenerate or an edit."""
    messages: list[bytes]
    superseded: list[bool]
    has_more: bool
    next_before: int | None
    total: int


def encode_message(m: ChatMessage) -> tuple[bytes, bool]:
    """A message as it goes on the wire (its JSON bytes), and whether it is superseded."""
    return orjson.dumps(m.to_dict()), bool(m.metadata.get("superseded"))


def encode_page(page: Page) -> EncodedPage:
    """``page`` with its messages encoded (backends without an encoded-message cache)."""
    encoded = [encode_message(m) for m in page.messages]
    return EncodedPage([raw for raw, _ in encoded], [sup for _, sup in encoded],
                       page.has_more, page.next_before, page.total)


@dataclass(slots=True)
class SearchHit:
    session_id: str
    title: str
    message_id: int
    role: str
    snippet: str
    timestamp: str
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "title": self.title, "message_id": self.message_id,
                "role": self.role, "snippet": self.snippet, "timestamp": self.timestamp, "score": self.score}
