"""The stored data model: ToolCall, ChatMessage, SummaryRecord, SessionRecord, Page, SearchHit.

Each class converts to and from the JSON objects of docs/protocol.md §3 with ``to_dict`` /
``from_dict``; ``from_dict`` tolerates missing optional fields so older files still load.
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
        return cls(
            session_id=str(d["session_id"]), user_id=str(d["user_id"]), title=str(d.get("title", "")),
            created_at=str(d["created_at"]), updated_at=str(d.get("updated_at") or d["created_at"]),
            message_count=int(d.get("message_count", 0)), deleted=bool(d.get("deleted", False)),
            model=d.get("model"), preview=str(d.get("preview", "")),
            summaries=[SummaryRecord.from_dict(s) for s in d.get("summaries") or ()],
            system_prompt=d.get("system_prompt") if isinstance(d.get("system_prompt"), str) else None,
            title_auto=d.get("title_auto") is True,
        )


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
