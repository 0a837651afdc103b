"""Typed replies (docs/protocol.md §5): the RESPONSE body of each request, PONG and ERROR.

Every reply carries ``re`` (the id of the request it answers; a keyword field, None by default, so a
handler can build its reply before it knows the id and ``dataclasses.replace(reply, re=...)`` it) and
``truncated`` (True only when the server cut long texts, or left a search's weakest hits out, to fit
``max_message_size``; encoded only then). ``encode()`` is the JSON body exactly as sent; ``decode(body)`` validates it
(ProtocolError INVALID_MESSAGE naming the field) and ignores unknown fields.

``REPLY_TYPES`` maps each request type to its reply class; ``decode_reply`` picks the class from the
frame that came back (RESPONSE, PONG or ERROR).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from .codes import ErrorCode, MsgType, type_name
from .errors import ProtocolError
from .fields import Addressed, Fields, Wire, addressed, invalid
from .kb import KB_REPLY_TYPES
from .objects import (AgentInfo, ChatMessage, ClientInfo, EncodedObject, MemoryItem, ModelInfo, SearchHit,
                      SessionInfo, TurnState)


@dataclass(frozen=True, slots=True)
class Reply(Addressed):
    """Base of every reply: ``re`` and ``truncated``."""


_re = addressed


@dataclass(frozen=True, slots=True)
class HelloReply(Reply):
    """HELLO (§5.1)."""
    server: str
    proto: int
    user: str
    session: SessionInfo | None      # None: the user has no session yet (created by the first message)
    session_restored: bool = False
    running_turn: TurnState | None = None
    limits: dict[str, Any] = field(default_factory=dict)
    capabilities: tuple[str, ...] = ()
    agent: AgentInfo | None = None

    @classmethod
    def read(cls, f: Fields) -> HelloReply:
        return cls(f.text("server"), f.integer("proto"), f.text("user"),
                   f.obj("session", SessionInfo.read, optional=True),
                   f.flag("session_restored", optional=True), f.obj("running_turn", TurnState.read, optional=True),
                   f.mapping("limits", optional=True), f.texts("capabilities", optional=True),
                   f.obj("agent", AgentInfo.read, optional=True), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({
            "re": self.re, "server": self.server, "proto": self.proto, "user": self.user,
            "session": self.session.encode() if self.session is not None else None,
            "session_restored": self.session_restored,
            "running_turn": self.running_turn.encode() if self.running_turn is not None else None,
            "limits": self.limits, "capabilities": list(self.capabilities),
            "agent": self.agent.encode() if self.agent is not None else None})


@dataclass(frozen=True, slots=True)
class SessionListReply(Reply):
    """SESSION_LIST (§5.2): newest first; ``next_before`` is an opaque cursor."""
    sessions: tuple[SessionInfo, ...] = ()
    has_more: bool = False
    next_before: str | None = None

    @classmethod
    def read(cls, f: Fields) -> SessionListReply:
        return cls(f.objects("sessions", SessionInfo.read), f.flag("has_more", optional=True),
                   f.text("next_before", optional=True), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "sessions": [s.encode() for s in self.sessions],
                             "has_more": self.has_more, "next_before": self.next_before})


@dataclass(frozen=True, slots=True)
class SessionReply(Reply):
    """SESSION_NEW, SESSION_RENAME and SESSION_INFO (§5.2): the session as it is now."""
    session: SessionInfo

    @classmethod
    def read(cls, f: Fields) -> SessionReply:
        return cls(f.obj("session", SessionInfo.read), **_re(f))  # type: ignore[arg-type]

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "session": self.session.encode()})


@dataclass(frozen=True, slots=True)
class SessionSwitchReply(Reply):
    """SESSION_SWITCH (§5.2): the session and its running turn, if any."""
    session: SessionInfo
    running_turn: TurnState | None = None

    @classmethod
    def read(cls, f: Fields) -> SessionSwitchReply:
        return cls(f.obj("session", SessionInfo.read),  # type: ignore[arg-type]
                   f.obj("running_turn", TurnState.read, optional=True), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "session": self.session.encode(),
                             "running_turn": self.running_turn.encode() if self.running_turn is not None else None})


@dataclass(frozen=True, slots=True)
class SessionDeleteReply(Reply):
    """SESSION_DELETE (§5.2): ``current`` is the requesting connection's session afterwards (None:
    it had none and still has none)."""
    session_id: str
    current: SessionInfo | None

    @classmethod
    def read(cls, f: Fields) -> SessionDeleteReply:
        return cls(f.text("session_id"), f.obj("current", SessionInfo.read, optional=True), **_re(f))

    def encode(self) -> dict[str, Any]:
        current = self.current.encode() if self.current is not None else None
        return self._finish({"re": self.re, "session_id": self.session_id, "current": current})


@dataclass(frozen=True, slots=True)
class SessionClearReply(Reply):
    """CLEAR_REQUEST (§5.2): ``cleared`` messages were hidden."""
    session: SessionInfo
    cleared: int = 0

    @classmethod
    def read(cls, f: Fields) -> SessionClearReply:
        return cls(f.obj("session", SessionInfo.read), f.integer("cleared"), **_re(f))  # type: ignore[arg-type]

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "session": self.session.encode(), "cleared": self.cleared})


@dataclass(frozen=True, slots=True)
class HistoryPageReply(Reply):
    """HISTORY_REQUEST (§5.3): one page, ``messages`` ascending by id; ``next_before`` the smallest id.
    A server may give the whole ``messages`` array pre-encoded (``EncodedObject``: a page splices
    each stored message's cached JSON); a decoded reply has ChatMessages."""
    session_id: str
    messages: tuple[ChatMessage, ...] | EncodedObject = ()
    has_more: bool = False
    next_before: int | None = None
    total: int = 0

    @classmethod
    def read(cls, f: Fields) -> HistoryPageReply:
        return cls(f.text("session_id"), f.objects("messages", ChatMessage.read), f.flag("has_more", optional=True),
                   f.integer("next_before", optional=True), f.integer("total", optional=True, default=0), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "session_id": self.session_id,
                             "messages": self.messages.encode() if isinstance(self.messages, EncodedObject)
                             else [m.encode() for m in self.messages], "has_more": self.has_more,
                             "next_before": self.next_before, "total": self.total})


@dataclass(frozen=True, slots=True)
class HistorySearchReply(Reply):
    """HISTORY_SEARCH (§5.3)."""
    hits: tuple[SearchHit, ...] = ()

    @classmethod
    def read(cls, f: Fields) -> HistorySearchReply:
        return cls(f.objects("hits", SearchHit.read), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "hits": [h.encode() for h in self.hits]})


@dataclass(frozen=True, slots=True)
class HistoryExportReply(Reply):
    """HISTORY_EXPORT (§5.3): the whole session as ``format`` text."""
    session_id: str
    format: str
    content: str

    @classmethod
    def read(cls, f: Fields) -> HistoryExportReply:
        return cls(f.text("session_id"), f.text("format"), f.text("content"), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "session_id": self.session_id, "format": self.format,
                             "content": self.content})


@dataclass(frozen=True, slots=True)
class ChatSendReply(Reply):
    """CHAT_TEXT (§5.4): ``queued`` turns are ahead of this one (its message has id None if > 0)."""
    turn_id: str
    session_id: str
    user_message: ChatMessage
    queued: int = 0

    @classmethod
    def read(cls, f: Fields) -> ChatSendReply:
        return cls(f.text("turn_id"), f.text("session_id"), f.obj("user_message", ChatMessage.read),  # type: ignore[arg-type]
                   f.integer("queued", optional=True, default=0), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "turn_id": self.turn_id, "session_id": self.session_id,
                             "user_message": self.user_message.encode(), "queued": self.queued})


@dataclass(frozen=True, slots=True)
class ChatCancelReply(Reply):
    """CHAT_CANCEL (§5.4): ``withdrawn`` when the turn was still queued (nothing stored)."""
    turn_id: str
    cancelled: bool = True
    withdrawn: bool = False

    @classmethod
    def read(cls, f: Fields) -> ChatCancelReply:
        return cls(f.text("turn_id"), f.flag("cancelled", optional=True, default=True),
                   f.flag("withdrawn", optional=True), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "turn_id": self.turn_id, "cancelled": self.cancelled,
                             "withdrawn": self.withdrawn})


@dataclass(frozen=True, slots=True)
class ModelListReply(Reply):
    """MODEL_LIST (§5.6): ``current`` is the session's model."""
    models: tuple[ModelInfo, ...] = ()
    current: str = ""

    @classmethod
    def read(cls, f: Fields) -> ModelListReply:
        return cls(f.objects("models", ModelInfo.read), f.text("current"), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "models": [m.encode() for m in self.models], "current": self.current})


@dataclass(frozen=True, slots=True)
class ModelSwitchReply(Reply):
    """MODEL_SWITCH (§5.6)."""
    session_id: str
    model: str

    @classmethod
    def read(cls, f: Fields) -> ModelSwitchReply:
        return cls(f.text("session_id"), f.text("model"), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "session_id": self.session_id, "model": self.model})


@dataclass(frozen=True, slots=True)
class StatsReply(Reply):
    """STATS (§5.7)."""
    uptime_s: float
    clients: int
    sessions_loaded: int
    turns_total: int
    turns_running: int
    refused_total: int
    slow_consumers_total: int
    agent: AgentInfo
    version: str

    @classmethod
    def read(cls, f: Fields) -> StatsReply:
        return cls(f.number("uptime_s"), f.integer("clients"), f.integer("sessions_loaded"),
                   f.integer("turns_total"), f.integer("turns_running"), f.integer("refused_total"),
                   f.integer("slow_consumers_total"), f.obj("agent", AgentInfo.read),  # type: ignore[arg-type]
                   f.text("version"), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({
            "re": self.re, "uptime_s": self.uptime_s, "clients": self.clients,
            "sessions_loaded": self.sessions_loaded, "turns_total": self.turns_total,
            "turns_running": self.turns_running, "refused_total": self.refused_total,
            "slow_consumers_total": self.slow_consumers_total, "agent": self.agent.encode(),
            "version": self.version})


@dataclass(frozen=True, slots=True)
class ClientListReply(Reply):
    """CLIENT_LIST (§5.9): every connection, oldest first."""
    clients: tuple[ClientInfo, ...] = ()

    @classmethod
    def read(cls, f: Fields) -> ClientListReply:
        return cls(f.objects("clients", ClientInfo.read), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "clients": [c.encode() for c in self.clients]})


@dataclass(frozen=True, slots=True)
class ClientKillReply(Reply):
    """CLIENT_KILL (§5.9): the ids of the connections closed."""
    killed: tuple[int, ...] = ()

    @classmethod
    def read(cls, f: Fields) -> ClientKillReply:
        killed = f.body.get("killed")
        if not isinstance(killed, list) or not all(type(k) is int and k >= 0 for k in killed):
            raise invalid(f.name("killed"), f"expected an array of connection ids, got {killed!r:.40}")
        return cls(tuple(killed), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "killed": list(self.killed)})


@dataclass(frozen=True, slots=True)
class MemoryListReply(Reply):
    """MEMORY_LIST (§5.10): ``enabled`` false when long-term memory is turned off (``items`` empty)."""
    enabled: bool = True
    items: tuple[MemoryItem, ...] = ()

    @classmethod
    def read(cls, f: Fields) -> MemoryListReply:
        return cls(f.flag("enabled"), f.objects("items", MemoryItem.read), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "enabled": self.enabled, "items": [i.encode() for i in self.items]})


@dataclass(frozen=True, slots=True)
class MemoryForgetReply(Reply):
    """MEMORY_FORGET (§5.10): the item is gone."""
    item_id: str

    @classmethod
    def read(cls, f: Fields) -> MemoryForgetReply:
        return cls(f.text("item_id"), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "item_id": self.item_id})


@dataclass(frozen=True, slots=True)
class Pong(Reply):
    """PONG (§5.5): the answer to PING, with the answering side's time."""
    time: str = ""

    @classmethod
    def read(cls, f: Fields) -> Pong:
        return cls(f.text("time", optional=True, default=""), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "time": self.time})


@dataclass(frozen=True, slots=True)
class ErrorReply(Reply):
    """ERROR (§8): answers a request (``re``) or, with ``re`` None, reports a connection problem."""
    code: ErrorCode
    message: str = ""
    fatal: bool = False

    @classmethod
    def read(cls, f: Fields) -> ErrorReply:
        return cls(f.code("code"), f.text("message", optional=True, default=""),
                   f.flag("fatal", optional=True), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "code": str(self.code), "message": self.message,
                             "fatal": self.fatal})

    def error(self) -> ProtocolError:
        """The same error as an exception."""
        return ProtocolError(self.code, self.message, fatal=self.fatal)


AnyReply = Union[HelloReply, SessionListReply, SessionReply, SessionSwitchReply, SessionDeleteReply,
                 SessionClearReply, HistoryPageReply, HistorySearchReply, HistoryExportReply, ChatSendReply,
                 ChatCancelReply, ModelListReply, ModelSwitchReply, StatsReply, ClientListReply, ClientKillReply,
                 Pong, ErrorReply]

@dataclass(frozen=True, slots=True)
class SessionPromptReply(Reply):
    """SESSION_PROMPT (§5.2): the session and its own system prompt (null: the server's is used)."""
    session: SessionInfo
    system_prompt: str | None = None

    @classmethod
    def read(cls, f: Fields) -> SessionPromptReply:
        return cls(f.obj("session", SessionInfo.read),  # type: ignore[arg-type]
                   f.text("system_prompt", optional=True), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "session": self.session.encode(), "system_prompt": self.system_prompt})


def _ids(f: Fields, key: str) -> tuple[int, ...]:
    """An optional array of message ids (integers >= 1)."""
    value = f.body.get(key)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, f"field '{f.name(key)}': expected an array", fatal=False)
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int) or item < 1:
            raise ProtocolError(ErrorCode.INVALID_MESSAGE,
                                f"field '{f.name(key)}[{i}]': expected an integer >= 1, got {item!r}", fatal=False)
    return tuple(value)


@dataclass(frozen=True, slots=True)
class ChatRedoReply(Reply):
    """CHAT_REGENERATE and CHAT_EDIT (§5.4): the new turn, the user message it answers and the ids
    of the messages it superseded."""
    turn_id: str
    session_id: str
    user_message: ChatMessage
    superseded: tuple[int, ...] = ()

    @classmethod
    def read(cls, f: Fields) -> ChatRedoReply:
        return cls(f.text("turn_id"), f.text("session_id"),
                   f.obj("user_message", ChatMessage.read),  # type: ignore[arg-type]
                   _ids(f, "superseded"), **_re(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "turn_id": self.turn_id, "session_id": self.session_id,
                             "user_message": self.user_message.encode(), "superseded": list(self.superseded)})


#: Request type -> the class of its successful reply (the RESPONSE body; PONG for PING).
REPLY_TYPES: dict[MsgType, type[Wire]] = {
    MsgType.HELLO: HelloReply,
    MsgType.SESSION_LIST: SessionListReply,
    MsgType.SESSION_NEW: SessionReply,
    MsgType.SESSION_SWITCH: SessionSwitchReply,
    MsgType.SESSION_RENAME: SessionReply,
    MsgType.SESSION_DELETE: SessionDeleteReply,
    MsgType.CLEAR_REQUEST: SessionClearReply,
    MsgType.SESSION_INFO: SessionReply,
    MsgType.HISTORY_REQUEST: HistoryPageReply,
    MsgType.HISTORY_SEARCH: HistorySearchReply,
    MsgType.HISTORY_EXPORT: HistoryExportReply,
    MsgType.CHAT_TEXT: ChatSendReply,
    MsgType.CHAT_CANCEL: ChatCancelReply,
    MsgType.MODEL_LIST: ModelListReply,
    MsgType.MODEL_SWITCH: ModelSwitchReply,
    MsgType.PING: Pong,
    MsgType.STATS: StatsReply,
    MsgType.CLIENT_LIST: ClientListReply,
    MsgType.CLIENT_KILL: ClientKillReply,
    MsgType.SESSION_RESTORE: SessionReply,
    MsgType.SESSION_PURGE: SessionDeleteReply,
    MsgType.SESSION_PROMPT: SessionPromptReply,
    MsgType.CHAT_REGENERATE: ChatRedoReply,
    MsgType.CHAT_EDIT: ChatRedoReply,
    **KB_REPLY_TYPES,
    MsgType.MEMORY_LIST: MemoryListReply,
    MsgType.MEMORY_FORGET: MemoryForgetReply,
}


def decode_reply(request: MsgType, frame: int, body: Any) -> Reply:
    """The typed reply to a ``request`` that came back as a ``frame`` (RESPONSE, PONG or ERROR).

    An ERROR gives an ``ErrorReply``; a RESPONSE (PONG for PING) the request's reply class. Anything
    else, or a body that does not validate, raises ProtocolError(INVALID_MESSAGE).
    """
    if frame == MsgType.ERROR:
        return ErrorReply.decode(body)
    expected = MsgType.PONG if request == MsgType.PING else MsgType.RESPONSE
    cls = REPLY_TYPES.get(request)  # type: ignore[call-overload]
    if cls is None or frame != expected:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE,
                            f"{type_name(frame)} is not a reply to {type_name(request)}", fatal=False)
    return cls.decode(body)  # type: ignore[no-any-return]
