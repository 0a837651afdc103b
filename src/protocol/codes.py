"""NPLT type codes (docs/protocol.md §4) and error codes (§8), with the sets the codec needs."""
from __future__ import annotations

from enum import Enum, IntEnum, StrEnum


class Role(Enum):
    """Which side of the connection this endpoint is."""

    CLIENT = "client"
    SERVER = "server"


class ProtocolVersion(Enum):
    """UNKNOWN only on the server until the first frame (or the legacy grace period)."""

    UNKNOWN = 0
    V2 = 2
    V3 = 3


class MsgType(IntEnum):
    """Every frame type code of docs/protocol.md §4."""

    # v2 codes (their meaning is kept in v3)
    CHAT_TEXT = 0x01
    AGENT_THOUGHT = 0x0A
    DOWNLOAD_OFFER = 0x0C
    FILE_DATA = 0x0D
    FILE_METADATA = 0x0E
    MODEL_SWITCH = 0x0F
    HISTORY_REQUEST = 0x10
    CLEAR_REQUEST = 0x11
    SESSION_LIST = 0x14
    SESSION_SWITCH = 0x15
    SESSION_NEW = 0x16
    SESSION_DELETE = 0x17
    CLIENT_UDP_PORT = 0x18
    # v3 codes
    HELLO = 0x20
    RESPONSE = 0x21
    ERROR = 0x22
    PING = 0x23
    PONG = 0x24
    SESSION_RENAME = 0x25
    HISTORY_SEARCH = 0x26
    HISTORY_EXPORT = 0x27
    CHAT_CANCEL = 0x28
    MODEL_LIST = 0x29
    STATS = 0x2A
    SESSION_INFO = 0x2B
    SESSION_RESTORE = 0x2E
    SESSION_PURGE = 0x2F
    TURN_START = 0x30
    TURN_STATUS = 0x31
    TOOL_CALL = 0x32
    TOOL_RESULT = 0x33
    ANSWER_DELTA = 0x34
    TURN_END = 0x35
    TURN_ERROR = 0x36
    SESSION_EVENT = 0x37
    NOTICE = 0x38
    SESSION_PROMPT = 0x39
    CHAT_REGENERATE = 0x3A
    CHAT_EDIT = 0x3B
    # v3 knowledge base (§5.8); 0x4F is reserved for DOWNLOAD_OFFER's v3 event
    KB_UPLOAD_BEGIN = 0x40
    KB_UPLOAD_DATA = 0x41
    KB_UPLOAD_END = 0x42
    KB_PROGRESS = 0x43
    KB_LIST = 0x44
    KB_DELETE = 0x45
    KB_SEARCH = 0x46
    KB_PASSAGE = 0x47
    KB_DOWNLOAD = 0x48
    KB_DOWNLOAD_DATA = 0x49
    DOWNLOAD_OFFER_V3 = 0x4F
    FRAGMENT = 0x7F


class ErrorCode(StrEnum):
    """Every error code of docs/protocol.md §8 (both tables)."""

    # raised or reported by src/protocol
    SEQ_MISMATCH = "SEQ_MISMATCH"
    BAD_FRAGMENT = "BAD_FRAGMENT"
    BUFFER_OVERFLOW = "BUFFER_OVERFLOW"
    CONNECTION_CLOSED = "CONNECTION_CLOSED"
    MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"
    INVALID_UTF8 = "INVALID_UTF8"
    INVALID_JSON = "INVALID_JSON"
    INVALID_MESSAGE = "INVALID_MESSAGE"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    UNSUPPORTED = "UNSUPPORTED"
    # used only in ERROR frames from the server
    HANDSHAKE_REQUIRED = "HANDSHAKE_REQUIRED"
    HANDSHAKE_TIMEOUT = "HANDSHAKE_TIMEOUT"
    UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"
    AUTH_FAILED = "AUTH_FAILED"
    SERVER_FULL = "SERVER_FULL"
    IDLE_TIMEOUT = "IDLE_TIMEOUT"
    SLOW_CONSUMER = "SLOW_CONSUMER"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    TOO_MANY_PENDING = "TOO_MANY_PENDING"
    NOT_FOUND = "NOT_FOUND"
    NO_ACTIVE_TURN = "NO_ACTIVE_TURN"
    UNKNOWN_MODEL = "UNKNOWN_MODEL"
    QUEUE_FULL = "QUEUE_FULL"
    LLM_ERROR = "LLM_ERROR"
    LLM_TIMEOUT = "LLM_TIMEOUT"
    INTERNAL = "INTERNAL"
    STORAGE_ERROR = "STORAGE_ERROR"
    STORAGE_UNAVAILABLE = "STORAGE_UNAVAILABLE"
    UNSUPPORTED_MEDIA = "UNSUPPORTED_MEDIA"
    CHECKSUM_MISMATCH = "CHECKSUM_MISMATCH"
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    FORBIDDEN = "FORBIDDEN"
    SERVER_BUSY = "SERVER_BUSY"
    MESSAGE_TIMEOUT = "MESSAGE_TIMEOUT"
    TOO_MANY_CONNECTIONS = "TOO_MANY_CONNECTIONS"
    CLIENT_KILLED = "CLIENT_KILLED"


#: Codes whose errors end the connection (the "fatal" column of §8).
FATAL_CODES: frozenset[ErrorCode] = frozenset({
    ErrorCode.SEQ_MISMATCH, ErrorCode.BAD_FRAGMENT, ErrorCode.BUFFER_OVERFLOW,
    ErrorCode.CONNECTION_CLOSED, ErrorCode.HANDSHAKE_REQUIRED, ErrorCode.HANDSHAKE_TIMEOUT,
    ErrorCode.UNSUPPORTED_VERSION, ErrorCode.AUTH_FAILED, ErrorCode.SERVER_FULL,
    ErrorCode.IDLE_TIMEOUT, ErrorCode.SLOW_CONSUMER, ErrorCode.SHUTTING_DOWN,
    ErrorCode.MESSAGE_TIMEOUT, ErrorCode.TOO_MANY_CONNECTIONS, ErrorCode.CLIENT_KILLED,
})

#: Type codes a legacy v2 peer knows; a v3 server never sends any other code to a v2 connection.
V2_TYPES: frozenset[MsgType] = frozenset({
    MsgType.CHAT_TEXT, MsgType.AGENT_THOUGHT, MsgType.DOWNLOAD_OFFER, MsgType.FILE_DATA,
    MsgType.FILE_METADATA, MsgType.MODEL_SWITCH, MsgType.HISTORY_REQUEST, MsgType.CLEAR_REQUEST,
    MsgType.SESSION_LIST, MsgType.SESSION_SWITCH, MsgType.SESSION_NEW, MsgType.SESSION_DELETE,
    MsgType.CLIENT_UDP_PORT,
})

#: Type codes that exist only in v3.
V3_ONLY_TYPES: frozenset[MsgType] = frozenset(MsgType) - V2_TYPES

#: v2 codes that v3 does not serve (answered UNSUPPORTED / ignored).
V2_ONLY_TYPES: frozenset[MsgType] = frozenset({
    MsgType.AGENT_THOUGHT, MsgType.DOWNLOAD_OFFER, MsgType.FILE_DATA, MsgType.FILE_METADATA,
    MsgType.CLIENT_UDP_PORT,
})

#: v3 request types: their body carries "id" and is answered by RESPONSE/ERROR (PING: PONG).
REQUEST_CODES: frozenset[MsgType] = frozenset({
    MsgType.HELLO, MsgType.CHAT_TEXT, MsgType.CHAT_CANCEL, MsgType.HISTORY_REQUEST,
    MsgType.HISTORY_SEARCH, MsgType.HISTORY_EXPORT, MsgType.SESSION_LIST, MsgType.SESSION_NEW,
    MsgType.SESSION_SWITCH, MsgType.SESSION_RENAME, MsgType.SESSION_DELETE, MsgType.CLEAR_REQUEST,
    MsgType.SESSION_INFO, MsgType.MODEL_LIST, MsgType.MODEL_SWITCH, MsgType.PING, MsgType.STATS,
    MsgType.SESSION_RESTORE, MsgType.SESSION_PURGE, MsgType.SESSION_PROMPT, MsgType.CHAT_REGENERATE,
    MsgType.CHAT_EDIT,
    MsgType.KB_UPLOAD_BEGIN, MsgType.KB_UPLOAD_END, MsgType.KB_LIST, MsgType.KB_DELETE, MsgType.KB_SEARCH,
    MsgType.KB_PASSAGE, MsgType.KB_DOWNLOAD,
})

#: Server-to-client events of §6 (pushed, carrying "re" or null).
EVENT_CODES: frozenset[MsgType] = frozenset({
    MsgType.TURN_START, MsgType.TURN_STATUS, MsgType.TOOL_CALL, MsgType.TOOL_RESULT,
    MsgType.ANSWER_DELTA, MsgType.TURN_END, MsgType.TURN_ERROR, MsgType.SESSION_EVENT,
    MsgType.NOTICE, MsgType.KB_PROGRESS, MsgType.DOWNLOAD_OFFER_V3,
})

#: v3 binary types: the payload is not JSON but a fixed header and raw bytes (``protocol.binary``).
BINARY_TYPES: frozenset[MsgType] = frozenset({MsgType.KB_UPLOAD_DATA, MsgType.KB_DOWNLOAD_DATA})


def type_name(code: int) -> str:
    """Human name of a type code: the MsgType name, or ``0xNN`` for an unknown code."""
    try:
        return MsgType(code).name
    except ValueError:
        return f"0x{code:02X}"
