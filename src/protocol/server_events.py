"""Typed server-to-client events (docs/protocol.md §6), one frozen dataclass per event type.

Every event carries ``re`` (the chat send's id on the connection that sent it, None elsewhere: a
keyword field, so one event is built once and ``dataclasses.replace(event, re=...)`` per receiver)
and ``truncated`` (encoded only when True). Turn events also carry ``session_id`` and ``turn_id``.
``TYPE`` is each class's frame type; ``EVENT_TYPES`` maps a frame type back to its class, and
``decode_event`` validates a received body (ProtocolError INVALID_MESSAGE naming the field).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

from .codes import ErrorCode, MsgType, type_name
from .errors import ProtocolError
from .fields import Addressed, Fields, addressed
from .kb import KbProgress
from .objects import ChatMessage, SessionInfo, ToolCall

#: TURN_END finish_reason (§6): "interrupted" closes a turn its node died under (docs/cluster.md)
FINISH_REASONS = ("stop", "length", "max_iterations", "context_budget", "cancelled", "interrupted")
#: SESSION_EVENT kind (§6)
SESSION_EVENT_KINDS = frozenset({"created", "renamed", "deleted", "restored", "purged", "cleared", "updated",
                                 "summary", "model"})
NOTICE_LEVELS = ("info", "warning")


@dataclass(frozen=True, slots=True)
class ServerEvent(Addressed):
    """Base of every event: ``re`` and ``truncated``."""
    TYPE: ClassVar[MsgType]


_kw = addressed


@dataclass(frozen=True, slots=True)
class TurnEvent(ServerEvent):
    """Base of the events of one turn (TURN_START ... TURN_END / TURN_ERROR)."""
    session_id: str
    turn_id: str


@dataclass(frozen=True, slots=True)
class TurnStart(TurnEvent):
    """The turn started: its stored user message and the model answering."""
    TYPE: ClassVar[MsgType] = MsgType.TURN_START
    user_message: ChatMessage
    model: str

    @classmethod
    def read(cls, f: Fields) -> TurnStart:
        return cls(f.text("session_id"), f.text("turn_id"), f.obj("user_message", ChatMessage.read),  # type: ignore[arg-type]
                   f.text("model"), **_kw(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "session_id": self.session_id, "turn_id": self.turn_id,
                             "user_message": self.user_message.encode(), "model": self.model})


@dataclass(frozen=True, slots=True)
class TurnStatus(TurnEvent):
    """thinking / tool_call / generating, with an optional ``detail`` (encoded only when set)."""
    TYPE: ClassVar[MsgType] = MsgType.TURN_STATUS
    status: str
    detail: str | None = None

    @classmethod
    def read(cls, f: Fields) -> TurnStatus:
        return cls(f.text("session_id"), f.text("turn_id"), f.text("status"), f.text("detail", optional=True),
                   **_kw(f))

    def encode(self) -> dict[str, Any]:
        out = {"re": self.re, "session_id": self.session_id, "turn_id": self.turn_id, "status": self.status}
        if self.detail is not None:
            out["detail"] = self.detail
        return self._finish(out)


@dataclass(frozen=True, slots=True)
class ToolCallEvent(TurnEvent):
    """TOOL_CALL: a tool call started (``call.status`` "running")."""
    TYPE: ClassVar[MsgType] = MsgType.TOOL_CALL
    call: ToolCall

    @classmethod
    def read(cls, f: Fields) -> ToolCallEvent:
        return cls(f.text("session_id"), f.text("turn_id"), f.obj("call", ToolCall.read), **_kw(f))  # type: ignore[arg-type]

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "session_id": self.session_id, "turn_id": self.turn_id,
                             "call": self.call.encode()})


@dataclass(frozen=True, slots=True)
class ToolResultEvent(TurnEvent):
    """TOOL_RESULT: a tool call finished, with its result."""
    TYPE: ClassVar[MsgType] = MsgType.TOOL_RESULT
    call: ToolCall

    @classmethod
    def read(cls, f: Fields) -> ToolResultEvent:
        return cls(f.text("session_id"), f.text("turn_id"), f.obj("call", ToolCall.read), **_kw(f))  # type: ignore[arg-type]

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "session_id": self.session_id, "turn_id": self.turn_id,
                             "call": self.call.encode()})


@dataclass(frozen=True, slots=True)
class AnswerDelta(TurnEvent):
    """A piece of the answer; ``offset`` is the answer's length in characters before it."""
    TYPE: ClassVar[MsgType] = MsgType.ANSWER_DELTA
    text: str
    offset: int

    @classmethod
    def read(cls, f: Fields) -> AnswerDelta:
        return cls(f.text("session_id"), f.text("turn_id"), f.text("text"), f.integer("offset"), **_kw(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "session_id": self.session_id, "turn_id": self.turn_id,
                             "text": self.text, "offset": self.offset})


@dataclass(frozen=True, slots=True)
class TurnEnd(TurnEvent):
    """The turn ended: ``message`` is the stored answer (``metadata.partial`` if cancelled).

    A queued turn withdrawn before it started has ``message`` None, ``withdrawn`` True and its
    ``user_message`` (id None); ``user_message`` and ``withdrawn`` are encoded only then.
    """
    TYPE: ClassVar[MsgType] = MsgType.TURN_END
    message: ChatMessage | None
    usage: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = "stop"
    context: dict[str, Any] = field(default_factory=dict)
    user_message: ChatMessage | None = None
    withdrawn: bool = False

    @classmethod
    def read(cls, f: Fields) -> TurnEnd:
        return cls(f.text("session_id"), f.text("turn_id"), f.obj("message", ChatMessage.read, optional=True),
                   f.mapping("usage", optional=True), f.text("finish_reason"), f.mapping("context", optional=True),
                   f.obj("user_message", ChatMessage.read, optional=True), f.flag("withdrawn", optional=True),
                   **_kw(f))

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {"re": self.re, "session_id": self.session_id, "turn_id": self.turn_id,
                               "message": self.message.encode() if self.message is not None else None}
        if self.user_message is not None:
            out["user_message"] = self.user_message.encode()
        out.update(usage=self.usage, finish_reason=self.finish_reason, context=self.context)
        if self.withdrawn:
            out["withdrawn"] = True
        return self._finish(out)


@dataclass(frozen=True, slots=True)
class TurnError(TurnEvent):
    """The turn failed (LLM_ERROR, LLM_TIMEOUT, ...); what was streamed is ``partial_message``."""
    TYPE: ClassVar[MsgType] = MsgType.TURN_ERROR
    code: ErrorCode
    message: str
    partial_message: ChatMessage | None = None

    @classmethod
    def read(cls, f: Fields) -> TurnError:
        return cls(f.text("session_id"), f.text("turn_id"), f.code("code"),
                   f.text("message", optional=True, default=""),
                   f.obj("partial_message", ChatMessage.read, optional=True), **_kw(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "session_id": self.session_id, "turn_id": self.turn_id,
                             "code": str(self.code), "message": self.message,
                             "partial_message": self.partial_message.encode()
                             if self.partial_message is not None else None})


@dataclass(frozen=True, slots=True)
class SessionEvent(ServerEvent):
    """A session of the user changed (created, renamed, deleted, cleared, updated, summary, model)."""
    TYPE: ClassVar[MsgType] = MsgType.SESSION_EVENT
    kind: str
    session: SessionInfo

    @classmethod
    def read(cls, f: Fields) -> SessionEvent:
        return cls(f.text("kind"), f.obj("session", SessionInfo.read), **_kw(f))  # type: ignore[arg-type]

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "kind": self.kind, "session": self.session.encode()})

    @property
    def session_id(self) -> str:
        return self.session.session_id


@dataclass(frozen=True, slots=True)
class Notice(ServerEvent):
    """Out-of-band information; ``code`` is free text (e.g. SUMMARY_FAILED), not an ErrorCode."""
    TYPE: ClassVar[MsgType] = MsgType.NOTICE
    level: str
    code: str
    message: str
    session_id: str | None = None

    @classmethod
    def read(cls, f: Fields) -> Notice:
        return cls(f.text("level"), f.text("code"), f.text("message", optional=True, default=""),
                   f.text("session_id", optional=True), **_kw(f))

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {"re": self.re, "level": self.level, "code": self.code, "message": self.message}
        if self.session_id is not None:
            out["session_id"] = self.session_id
        return self._finish(out)


@dataclass(frozen=True, slots=True)
class DownloadOfferV3(ServerEvent):
    """The assistant offers a knowledge-base document: fetch it with the KB download request."""
    TYPE: ClassVar[MsgType] = MsgType.DOWNLOAD_OFFER_V3
    doc_id: str
    filename: str
    size: int
    md5: str

    @classmethod
    def read(cls, f: Fields) -> DownloadOfferV3:
        return cls(f.text("doc_id"), f.text("filename"), f.integer("size", lo=0), f.text("md5"), **_kw(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "doc_id": self.doc_id, "filename": self.filename, "size": self.size,
                             "md5": self.md5})


AnyEvent = Union[TurnStart, TurnStatus, ToolCallEvent, ToolResultEvent, AnswerDelta, TurnEnd, TurnError,
                 SessionEvent, Notice, DownloadOfferV3]

#: Frame type -> event class, for every event of §6.
EVENT_TYPES: dict[MsgType, type[ServerEvent]] = {
    cls.TYPE: cls for cls in (TurnStart, TurnStatus, ToolCallEvent, ToolResultEvent, AnswerDelta, TurnEnd,
                              TurnError, SessionEvent, Notice, DownloadOfferV3)
}
EVENT_TYPES[MsgType.KB_PROGRESS] = KbProgress  # type: ignore[assignment]  # knowledge base (protocol.kb)


def decode_event(frame: int, body: Any) -> ServerEvent:
    """The typed event of a received frame; ProtocolError(INVALID_MESSAGE) if it is not a valid event."""
    cls = EVENT_TYPES.get(frame)  # type: ignore[call-overload]
    if cls is None:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, f"{type_name(frame)} is not an event", fatal=False)
    return cls.decode(body)  # type: ignore[no-any-return]
