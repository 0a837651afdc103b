"""The shared objects of docs/protocol.md §3 (ToolCall, Message, SessionInfo, TurnState) and the small
objects replies carry (summaries, search hits, models, agent info), as frozen dataclasses.

``encode()`` gives the JSON object exactly as the server sends it (same keys, same order);
``decode(body)`` validates one (ProtocolError INVALID_MESSAGE naming the field) and ignores unknown
fields. Lists become tuples. Open-ended objects (``arguments``, ``metadata``, ``limits``, ``usage``,
``context``) stay dicts: treat them as read-only. Enumerated strings (roles, statuses) are checked to
be strings, not against today's values, so a newer server can add one without breaking a client.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from .fields import Fields, Wire

# Documented values of the enumerated strings (docs/protocol.md §3, §6).
ROLES = ("user", "assistant", "system", "tool")
TOOL_STATUSES = ("running", "success", "error", "timeout")
TURN_STATUSES = ("thinking", "tool_call", "generating")


@dataclass(frozen=True, slots=True)
class ToolCall(Wire):
    """One tool call of a turn. In TOOL_CALL events ``result`` is "", ``status`` "running", ``duration`` 0."""
    id: str
    tool_name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    result: str = ""
    status: str = "running"
    duration: float = 0
    timestamp: str = ""
    step: int = 0

    @classmethod
    def read(cls, f: Fields) -> ToolCall:
        return cls(f.text("id"), f.text("tool_name"), f.mapping("arguments", optional=True),
                   f.text("result", optional=True, default=""), f.text("status"),
                   f.number("duration", optional=True, default=0),
                   f.text("timestamp", optional=True, default=""), f.integer("step", optional=True, default=0))

    def encode(self) -> dict[str, Any]:
        return {"id": self.id, "tool_name": self.tool_name, "arguments": self.arguments,
                "result": self.result, "status": self.status, "duration": self.duration,
                "timestamp": self.timestamp, "step": self.step}


@dataclass(frozen=True, slots=True)
class ChatMessage(Wire):
    """A stored chat message (the "Message" object of §3). ``id`` is None for a queued user message.

    Named ChatMessage so it does not clash with ``protocol.Message``, the codec's received message.
    """
    id: int | None
    role: str
    content: str
    timestamp: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, f: Fields) -> ChatMessage:
        return cls(f.integer("id", optional=True), f.text("role"), f.text("content"),
                   f.text("timestamp", optional=True, default=""),
                   f.objects("tool_calls", ToolCall.read, optional=True), f.mapping("metadata", optional=True))

    def encode(self) -> dict[str, Any]:
        return {"id": self.id, "role": self.role, "content": self.content, "timestamp": self.timestamp,
                "tool_calls": [c.encode() for c in self.tool_calls], "metadata": self.metadata}

    @property
    def queued(self) -> bool:
        """A user message whose turn waits in the queue (not stored yet)."""
        return self.id is None and bool(self.metadata.get("queued"))

    @property
    def partial(self) -> bool:
        """An answer cut short (cancelled or failed turn)."""
        return bool(self.metadata.get("partial"))


@dataclass(frozen=True, slots=True)
class EncodedObject:
    """JSON already encoded (``raw``: what ``encode()`` of these objects, or a list of them, would
    give): spliced into the message as is (a history page joins each stored message's cached
    bytes into its ``messages`` array). Send side only; a receiver decodes the real classes."""
    raw: bytes

    def encode(self) -> orjson.Fragment:
        return orjson.Fragment(self.raw)


@dataclass(frozen=True, slots=True)
class Summary(Wire):
    """A session summary (``SessionInfo.summary``); ``covers_from_id`` is sent by this server, optional."""
    text: str
    covers_to_id: int
    created_at: str = ""
    model: str = ""
    covers_from_id: int | None = None

    @classmethod
    def read(cls, f: Fields) -> Summary:
        return cls(f.text("text"), f.integer("covers_to_id"), f.text("created_at", optional=True, default=""),
                   f.text("model", optional=True, default=""), f.integer("covers_from_id", optional=True))

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {"text": self.text}
        if self.covers_from_id is not None:
            out["covers_from_id"] = self.covers_from_id
        out.update(covers_to_id=self.covers_to_id, created_at=self.created_at, model=self.model)
        return out


@dataclass(frozen=True, slots=True)
class SessionInfo(Wire):
    """One session as listed and reported (§3); ``summary`` is None in listings."""
    session_id: str
    title: str
    created_at: str = ""
    updated_at: str = ""
    message_count: int = 0
    preview: str = ""
    model: str | None = None
    running: bool = False
    summary: Summary | None = None

    @classmethod
    def read(cls, f: Fields) -> SessionInfo:
        return cls(f.text("session_id"), f.text("title"), f.text("created_at", optional=True, default=""),
                   f.text("updated_at", optional=True, default=""),
                   f.integer("message_count", optional=True, default=0),
                   f.text("preview", optional=True, default=""), f.text("model", optional=True),
                   f.flag("running", optional=True), f.obj("summary", Summary.read, optional=True))

    def encode(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "title": self.title, "created_at": self.created_at,
                "updated_at": self.updated_at, "message_count": self.message_count, "preview": self.preview,
                "model": self.model, "running": self.running,
                "summary": self.summary.encode() if self.summary is not None else None}


@dataclass(frozen=True, slots=True)
class QueuedTurn(Wire):
    """A turn waiting behind the running one (``TurnState.queued``); its message has ``id`` None."""
    turn_id: str
    user_message: ChatMessage

    @classmethod
    def read(cls, f: Fields) -> QueuedTurn:
        return cls(f.text("turn_id"), f.obj("user_message", ChatMessage.read))  # type: ignore[arg-type]

    def encode(self) -> dict[str, Any]:
        return {"turn_id": self.turn_id, "user_message": self.user_message.encode()}


@dataclass(frozen=True, slots=True)
class TurnState(Wire):
    """A turn still running, for reattaching (§3): the answer so far and the turns queued behind it."""
    turn_id: str
    session_id: str
    user_message: ChatMessage
    status: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    started_at: str = ""
    queued: tuple[QueuedTurn, ...] = ()

    @classmethod
    def read(cls, f: Fields) -> TurnState:
        return cls(f.text("turn_id"), f.text("session_id"), f.obj("user_message", ChatMessage.read),  # type: ignore[arg-type]
                   f.text("status"), f.text("content", optional=True, default=""),
                   f.objects("tool_calls", ToolCall.read, optional=True),
                   f.text("started_at", optional=True, default=""), f.objects("queued", QueuedTurn.read, optional=True))

    def encode(self) -> dict[str, Any]:
        return {"turn_id": self.turn_id, "session_id": self.session_id,
                "user_message": self.user_message.encode(), "status": self.status, "content": self.content,
                "tool_calls": [c.encode() for c in self.tool_calls], "started_at": self.started_at,
                "queued": [q.encode() for q in self.queued]}


@dataclass(frozen=True, slots=True)
class AgentInfo(Wire):
    """The agent behind the server (HELLO and STATS replies)."""
    name: str
    offline: bool
    model: str

    @classmethod
    def read(cls, f: Fields) -> AgentInfo:
        return cls(f.text("name"), f.flag("offline"), f.text("model"))

    def encode(self) -> dict[str, Any]:
        return {"name": self.name, "offline": self.offline, "model": self.model}


@dataclass(frozen=True, slots=True)
class ModelInfo(Wire):
    """One model offered (MODEL_LIST reply)."""
    name: str
    offline: bool = False
    default: bool = False

    @classmethod
    def read(cls, f: Fields) -> ModelInfo:
        return cls(f.text("name"), f.flag("offline", optional=True), f.flag("default", optional=True))

    def encode(self) -> dict[str, Any]:
        return {"name": self.name, "offline": self.offline, "default": self.default}


@dataclass(frozen=True, slots=True)
class MemoryItem(Wire):
    """One long-term memory item (§5.10): a durable fact or preference and where it was said."""
    id: str
    kind: str                 # "fact" | "preference" (checked as a string)
    text: str
    session_id: str
    message_id: int
    created_at: str
    source: str = "rules"     # "rules" | "model"

    @classmethod
    def read(cls, f: Fields) -> MemoryItem:
        return cls(f.text("id"), f.text("kind"), f.text("text"), f.text("session_id"), f.integer("message_id"),
                   f.text("created_at"), f.text("source", optional=True, default="rules"))

    def encode(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "text": self.text, "session_id": self.session_id,
                "message_id": self.message_id, "created_at": self.created_at, "source": self.source}


@dataclass(frozen=True, slots=True)
class SearchHit(Wire):
    """One HISTORY_SEARCH hit."""
    session_id: str
    title: str
    message_id: int
    role: str
    snippet: str
    timestamp: str = ""
    score: float = 0

    @classmethod
    def read(cls, f: Fields) -> SearchHit:
        return cls(f.text("session_id"), f.text("title"), f.integer("message_id"), f.text("role"),
                   f.text("snippet"), f.text("timestamp", optional=True, default=""),
                   f.number("score", optional=True, default=0))

    def encode(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "title": self.title, "message_id": self.message_id,
                "role": self.role, "snippet": self.snippet, "timestamp": self.timestamp, "score": self.score}


@dataclass(frozen=True, slots=True)
class ClientInfo(Wire):
    """One connection in a CLIENT_LIST reply (§5.9). ``user`` and ``session`` are None before HELLO;
    ``proto`` is "v3", "v2" or None (not decided yet); ``state`` one of the connection states
    (grace, handshaking, ready, legacy, refused, closing); ``buffered`` the bytes of partial input
    it holds, ``output`` its unsent bytes; ``me`` marks the connection the request came on."""
    id: int
    peer: str
    user: str | None = None
    session: str | None = None
    state: str = ""
    proto: str | None = None
    age_s: float = 0
    idle_s: float = 0
    buffered: int = 0
    output: int = 0
    me: bool = False

    @classmethod
    def read(cls, f: Fields) -> ClientInfo:
        return cls(f.integer("id"), f.text("peer"), f.text("user", optional=True), f.text("session", optional=True),
                   f.text("state"), f.text("proto", optional=True), f.number("age_s"), f.number("idle_s"),
                   f.integer("buffered"), f.integer("output"), f.flag("me", optional=True))

    def encode(self) -> dict[str, Any]:
        return {"id": self.id, "peer": self.peer, "user": self.user, "session": self.session, "state": self.state,
                "proto": self.proto, "age_s": self.age_s, "idle_s": self.idle_s, "buffered": self.buffered,
                "output": self.output, "me": self.me}
