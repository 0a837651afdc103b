"""Typed v3 request bodies (docs/protocol.md §5) with precise validation.

Each class has ``from_body(dict)``, which raises ``ProtocolError(INVALID_MESSAGE)`` naming the field
and what was wrong, e.g. ``field 'limit': expected an integer >= 1, got 'x'``. Unknown fields are
ignored; an explicit ``null`` for an optional field means "absent". An absent ``limit`` stays None:
the server applies ``DEFAULT_PAGE_LIMIT`` / ``DEFAULT_SEARCH_LIMIT`` within its configured
``max_page_size``, which also bounds an explicit one.
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, ip_address
from typing import Any, Union

from .codes import ErrorCode, MsgType, type_name
from .errors import ProtocolError
from .events import InvalidMessage, Message
from .fields import _MISSING, _show, id_problem, invalid, valid_request_id
from .fields import MAX_ID_CHARS as _MAX_ID_CHARS
from .kb import KB_REQUEST_TYPES

RequestId = Union[int, str]
MAX_ID_CHARS = _MAX_ID_CHARS   # (defined in protocol.fields; kept here for importers)

MAX_TITLE_CHARS = 200        # session titles
MAX_NAME_CHARS = 200         # client and model names
MAX_REF_CHARS = 128          # session ids, turn ids
MAX_CURSOR_CHARS = 256       # opaque session-list cursors
MAX_QUERY_CHARS = 1000       # search queries
MAX_TOKEN_CHARS = 4096       # auth tokens
MAX_PROMPT_CHARS = 20_000    # per-session system prompts (the store may set a lower limit)
EXPORT_FORMATS = ("markdown", "json")
DEFAULT_PAGE_LIMIT = 50
DEFAULT_SEARCH_LIMIT = 20



def _fail(field: str, expected: str, value: Any) -> ProtocolError:
    return invalid(field, f"expected {expected}, got {_show(value)}")


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "request body must be a JSON object",
                            fatal=False)
    return body


def _id(body: dict[str, Any]) -> RequestId:
    value = body.get("id", _MISSING)
    if value is _MISSING:
        raise invalid("id", "missing (every request carries an id)")
    if not valid_request_id(value):
        raise id_problem(value)
    return value


def _str(body: dict[str, Any], name: str, hi: int | None, *, required: bool = False,
         blank: bool = False) -> str | None:
    """A string of 1..hi characters (not only whitespace unless ``blank``)."""
    value = body.get(name, _MISSING)
    if value is _MISSING or (value is None and not required):
        if required:
            raise invalid(name, "missing (required)")
        return None
    size = "a non-empty string" if hi is None else f"a string of 1..{hi} characters"
    if not isinstance(value, str) or not value or (hi is not None and len(value) > hi):
        raise _fail(name, size, value)
    if not blank and not value.strip():
        raise _fail(name, "text that is not only whitespace", value)
    return value


def _int(body: dict[str, Any], name: str, lo: int, hi: int | None, default: Any) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (
            hi is not None and value > hi):
        expected = f"an integer >= {lo}" if hi is None else f"an integer in {lo}..{hi}"
        raise _fail(name, expected, value)
    return value


def _flag(body: dict[str, Any], name: str) -> bool:
    """An optional boolean (absent or null: false)."""
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _fail(name, "true or false", value)
    return value


def _prompt(body: dict[str, Any]) -> str | None:
    """A system prompt: a string of at most MAX_PROMPT_CHARS ("" is allowed: it means "none")."""
    value = body.get("system_prompt")
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_PROMPT_CHARS:
        raise _fail("system_prompt", f"a string of at most {MAX_PROMPT_CHARS} characters", value)
    return value


def _session(body: dict[str, Any], required: bool = False) -> str | None:
    return _str(body, "session_id", MAX_REF_CHARS, required=required, blank=True)


def _limit(body: dict[str, Any]) -> int | None:
    """A page size >= 1, or None (absent: the server's default); the upper bound is the server's."""
    return _int(body, "limit", 1, None, None)


_NOT_IN_A_TITLE = {"Cc", "Zl", "Zp"}          # controls, and line / paragraph separators (U+2028, U+2029)
#: bidirectional embeddings, overrides and isolates: a title showing reversed ("a\u202eb") in lists
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _title(body: dict[str, Any], required: bool = False) -> str | None:
    """A session title: 1..MAX_TITLE_CHARS characters, no control characters, something visible."""
    value = _str(body, "title", MAX_TITLE_CHARS, required=required)
    if value is None:
        return None
    if any(unicodedata.category(c) in _NOT_IN_A_TITLE or c in _BIDI_CONTROLS for c in value):
        raise _fail("title", "one line without control characters", value)
    if all(c.isspace() or unicodedata.category(c) == "Cf" for c in value):
        raise _fail("title", "text with a visible character", value)
    return value


@dataclass(slots=True)
class Hello:
    """HELLO (§5.1). ``proto`` is only type-checked: the server answers UNSUPPORTED_VERSION.

    ``token`` is passed on as sent (``None`` when absent or null), not validated: whether it is
    acceptable is the server's authentication decision (a bad token is AUTH_FAILED and fatal when
    users are configured, and is ignored otherwise), never a retryable INVALID_MESSAGE.
    """
    id: RequestId
    proto: int
    client: str
    token: Any = None
    session_id: str | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Hello:
        body = _object(body)
        proto = body.get("proto", _MISSING)
        if proto is _MISSING:
            raise invalid("proto", "missing (required)")
        if isinstance(proto, bool) or not isinstance(proto, int):
            raise _fail("proto", "an integer", proto)
        return cls(_id(body), proto, _str(body, "client", MAX_NAME_CHARS, required=True),
                   body.get("token"), _session(body))


@dataclass(slots=True)
class ChatSend:
    """CHAT_TEXT (§5.4): send a user message; ``new_session``: it starts a new session (the user's
    empty one is reused)."""
    id: RequestId
    text: str
    session_id: str | None = None
    new_session: bool = False

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> ChatSend:
        body = _object(body)
        session_id, new_session = _session(body), _flag(body, "new_session")
        if session_id is not None and new_session:
            raise invalid("new_session", "not allowed together with session_id")
        return cls(_id(body), _str(body, "text", None, required=True), session_id, new_session)


@dataclass(slots=True)
class ChatRegenerate:
    """CHAT_REGENERATE (§5.4): answer the last user message again (the old answer is superseded)."""
    id: RequestId
    session_id: str | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> ChatRegenerate:
        body = _object(body)
        return cls(_id(body), _session(body))


@dataclass(slots=True)
class ChatEdit:
    """CHAT_EDIT (§5.4): replace user message ``message_id`` with ``text`` and answer it (it and
    everything after it are superseded)."""
    id: RequestId
    message_id: int
    text: str
    session_id: str | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> ChatEdit:
        body = _object(body)
        if body.get("message_id") is None:
            raise invalid("message_id", "missing (required)")
        return cls(_id(body), _int(body, "message_id", 1, None, None),
                   _str(body, "text", None, required=True), _session(body))


@dataclass(slots=True)
class ChatCancel:
    """CHAT_CANCEL (§5.4)."""
    id: RequestId
    session_id: str | None = None
    turn_id: str | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> ChatCancel:
        body = _object(body)
        return cls(_id(body), _session(body), _str(body, "turn_id", MAX_REF_CHARS, blank=True))


@dataclass(slots=True)
class HistoryPage:
    """HISTORY_REQUEST (§5.3): one page, newest first, of messages with id < before."""
    id: RequestId
    session_id: str | None = None
    before: int | None = None
    limit: int | None = None
    superseded: bool = False     # also the messages replaced by regenerate / edit

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> HistoryPage:
        body = _object(body)
        return cls(_id(body), _session(body), _int(body, "before", 1, None, None), _limit(body),
                   _flag(body, "superseded"))


@dataclass(slots=True)
class HistorySearch:
    """HISTORY_SEARCH (§5.3); without session_id it searches all the user's sessions."""
    id: RequestId
    query: str
    session_id: str | None = None
    limit: int | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> HistorySearch:
        body = _object(body)
        return cls(_id(body), _str(body, "query", MAX_QUERY_CHARS, required=True), _session(body),
                   _limit(body))


@dataclass(slots=True)
class HistoryExport:
    """HISTORY_EXPORT (§5.3)."""
    id: RequestId
    format: str
    session_id: str | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> HistoryExport:
        body = _object(body)
        fmt = body.get("format", _MISSING)
        if fmt is _MISSING:
            raise invalid("format", "missing (required)")
        if fmt not in EXPORT_FORMATS:
            raise _fail("format", " or ".join(repr(f) for f in EXPORT_FORMATS), fmt)
        return cls(_id(body), fmt, _session(body))


@dataclass(slots=True)
class SessionList:
    """SESSION_LIST (§5.2); ``before`` is an opaque cursor; ``deleted``: list the trash instead."""
    id: RequestId
    before: str | None = None
    limit: int | None = None
    deleted: bool = False

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> SessionList:
        body = _object(body)
        return cls(_id(body), _str(body, "before", MAX_CURSOR_CHARS, blank=True), _limit(body),
                   _flag(body, "deleted"))


@dataclass(slots=True)
class SessionNew:
    """SESSION_NEW (§5.2); ``system_prompt``: the new session's own system prompt."""
    id: RequestId
    title: str | None = None
    system_prompt: str | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> SessionNew:
        body = _object(body)
        return cls(_id(body), _title(body), _prompt(body) or None)


@dataclass(slots=True)
class SessionSwitch:
    """SESSION_SWITCH (§5.2)."""
    id: RequestId
    session_id: str

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> SessionSwitch:
        body = _object(body)
        return cls(_id(body), _session(body, required=True))


@dataclass(slots=True)
class SessionRename:
    """SESSION_RENAME (§5.2)."""
    id: RequestId
    title: str
    session_id: str | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> SessionRename:
        body = _object(body)
        return cls(_id(body), _title(body, required=True), _session(body))


@dataclass(slots=True)
class SessionDelete:
    """SESSION_DELETE (§5.2)."""
    id: RequestId
    session_id: str

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> SessionDelete:
        body = _object(body)
        return cls(_id(body), _session(body, required=True))


@dataclass(slots=True)
class SessionClear:
    """CLEAR_REQUEST (§5.2); ``purge``: the hidden messages are removed for good."""
    id: RequestId
    session_id: str | None = None
    purge: bool = False

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> SessionClear:
        body = _object(body)
        return cls(_id(body), _session(body), _flag(body, "purge"))


@dataclass(slots=True)
class SessionRestore:
    """SESSION_RESTORE (§5.2): a deleted session out of the trash."""
    id: RequestId
    session_id: str

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> SessionRestore:
        body = _object(body)
        return cls(_id(body), _session(body, required=True))


@dataclass(slots=True)
class SessionPurge:
    """SESSION_PURGE (§5.2): remove a session (deleted or not) for good."""
    id: RequestId
    session_id: str

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> SessionPurge:
        body = _object(body)
        return cls(_id(body), _session(body, required=True))


@dataclass(slots=True)
class SessionPrompt:
    """SESSION_PROMPT (§5.2): read (``system_prompt`` absent or null), set, or reset ("") the
    session's own system prompt."""
    id: RequestId
    session_id: str | None = None
    system_prompt: str | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> SessionPrompt:
        body = _object(body)
        return cls(_id(body), _session(body), _prompt(body))


@dataclass(slots=True)
class SessionInfoReq:
    """SESSION_INFO (§5.2)."""
    id: RequestId
    session_id: str | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> SessionInfoReq:
        body = _object(body)
        return cls(_id(body), _session(body))


@dataclass(slots=True)
class ModelList:
    """MODEL_LIST (§5.6); ``current`` is the model of ``session_id`` (default: the current session)."""
    id: RequestId
    session_id: str | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> ModelList:
        body = _object(body)
        return cls(_id(body), _session(body))


@dataclass(slots=True)
class ModelSwitch:
    """MODEL_SWITCH (§5.6), per session."""
    id: RequestId
    model: str
    session_id: str | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> ModelSwitch:
        body = _object(body)
        return cls(_id(body), _str(body, "model", MAX_NAME_CHARS, required=True), _session(body))


@dataclass(slots=True)
class Ping:
    """PING (§5.5), answered by PONG."""
    id: RequestId

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Ping:
        return cls(_id(_object(body)))


@dataclass(slots=True)
class Stats:
    """STATS (§5.7)."""
    id: RequestId

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Stats:
        return cls(_id(_object(body)))


@dataclass(slots=True)
class ClientList:
    """CLIENT_LIST (§5.9, admin only): the server's connections."""
    id: RequestId

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> ClientList:
        return cls(_id(_object(body)))


@dataclass(frozen=True, slots=True)
class MemoryList:
    """MEMORY_LIST (§5.10): the caller's long-term memory items."""
    id: RequestId

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> MemoryList:
        return cls(_id(_object(body)))


@dataclass(slots=True)
class ClientKill:
    """CLIENT_KILL (§5.9, admin only): close the connections matching every filter given (at least one)."""
    id: RequestId
    client_id: int | None = None
    user: str | None = None
    peer: str | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> ClientKill:
        body = _object(body)
        req = cls(_id(body), _int(body, "client_id", 1, None, None), _str(body, "user", MAX_REF_CHARS),
                  _str(body, "peer", MAX_REF_CHARS))
        if req.client_id is None and req.user is None and req.peer is None:
            raise invalid("client_id", "missing (give client_id, user or peer)")
        if req.peer is not None and not peer_forms(req.peer):
            raise _fail("peer", '"ip:port", "[ipv6]:port" or an ip address', req.peer)
        return req


Address = Union[IPv4Address, IPv6Address]


def _address(text: str) -> Address | None:
    """``text`` as an IP address (an IPv6 one in brackets or not; an IPv4-mapped IPv6 address as
    its IPv4 address, as a dual-stack socket names an IPv4 peer), or None."""
    bracketed = text.startswith("[") and text.endswith("]")
    try:
        ip = ip_address(text[1:-1] if bracketed else text)
    except ValueError:
        return None
    if not isinstance(ip, IPv6Address):
        return None if bracketed else ip        # brackets hold an IPv6 address only
    return ip.ipv4_mapped or ip


def peer_forms(peer: str) -> tuple[tuple[Address, int | None], ...]:
    """What a CLIENT_KILL ``peer`` (§5.9) may mean, as (address, port or None for every port): "ip",
    "[ipv6]" (every port), "ipv4:port", "[ipv6]:port", and "ipv6:port" as a peer without brackets
    is shown. "::1:5000" is both the address ::1:5000 and ::1 port 5000: both forms are returned.
    Empty for anything else (not an address: INVALID_MESSAGE)."""
    forms: list[tuple[Address, int | None]] = []
    whole = _address(peer)
    if whole is not None:
        forms.append((whole, None))
    host, sep, port = peer.rpartition(":")
    if sep and port.isascii() and port.isdigit() and int(port) <= 0xFFFF:
        ip = _address(host)
        if ip is not None:
            forms.append((ip, int(port)))
    return tuple(forms)


@dataclass(frozen=True, slots=True)
class MemoryForget:
    """MEMORY_FORGET (§5.10): delete one of the caller's long-term memory items."""
    id: RequestId
    item_id: str

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> MemoryForget:
        body = _object(body)
        return cls(_id(body), _str(body, "item_id", MAX_REF_CHARS, required=True))  # type: ignore[arg-type]


Request = Union[Hello, ChatSend, ChatCancel, HistoryPage, HistorySearch, HistoryExport, SessionList,
                SessionNew, SessionSwitch, SessionRename, SessionDelete, SessionClear,
                SessionInfoReq, ModelList, ModelSwitch, Ping, Stats, ClientList, ClientKill, SessionRestore,
                SessionPurge, SessionPrompt, ChatRegenerate, ChatEdit, MemoryList, MemoryForget]

REQUEST_TYPES: dict[MsgType, type] = {
    MsgType.HELLO: Hello,
    MsgType.CHAT_TEXT: ChatSend,
    MsgType.CHAT_CANCEL: ChatCancel,
    MsgType.HISTORY_REQUEST: HistoryPage,
    MsgType.HISTORY_SEARCH: HistorySearch,
    MsgType.HISTORY_EXPORT: HistoryExport,
    MsgType.SESSION_LIST: SessionList,
    MsgType.SESSION_NEW: SessionNew,
    MsgType.SESSION_SWITCH: SessionSwitch,
    MsgType.SESSION_RENAME: SessionRename,
    MsgType.SESSION_DELETE: SessionDelete,
    MsgType.CLEAR_REQUEST: SessionClear,
    MsgType.SESSION_INFO: SessionInfoReq,
    MsgType.MODEL_LIST: ModelList,
    MsgType.MODEL_SWITCH: ModelSwitch,
    MsgType.PING: Ping,
    MsgType.STATS: Stats,
    MsgType.CLIENT_LIST: ClientList,
    MsgType.CLIENT_KILL: ClientKill,
    MsgType.SESSION_RESTORE: SessionRestore,
    MsgType.SESSION_PURGE: SessionPurge,
    MsgType.SESSION_PROMPT: SessionPrompt,
    MsgType.CHAT_REGENERATE: ChatRegenerate,
    MsgType.CHAT_EDIT: ChatEdit,
    **KB_REQUEST_TYPES,
    MsgType.MEMORY_LIST: MemoryList,
    MsgType.MEMORY_FORGET: MemoryForget,
}


def request_id(body: Any) -> RequestId | None:
    """The request's "id" if the body has a valid one, else None (for "re" in errors)."""
    if isinstance(body, dict):
        value = body.get("id")
        if valid_request_id(value):
            return value
    return None


def parse_request(msg: Message) -> Request | InvalidMessage:
    """Validate a v3 request message into its typed body.

    Returns an ``InvalidMessage`` (``re`` = the request id when it could be read) for an invalid
    body (INVALID_MESSAGE) or a type that is not a request (UNSUPPORTED).
    """
    cls = REQUEST_TYPES.get(msg.type)  # type: ignore[call-overload]
    try:
        if cls is None:
            raise ProtocolError(ErrorCode.UNSUPPORTED,
                                f"{type_name(msg.type)} is not a request", fatal=False)
        return cls.from_body(msg.body)
    except ProtocolError as exc:
        return InvalidMessage(exc, msg.type, msg.seq, request_id(msg.body))
