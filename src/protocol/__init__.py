"""Sans-IO NPLT v3 codec (compatible with NPLT v2). See docs/protocol.md and docs/architecture.md.

No asyncio, no sockets: feed ``Connection.receive_data`` the bytes you read, write out what
``Connection.send`` returns. Typed request bodies live in ``protocol.messages``; typed replies and
events in ``protocol.replies`` and ``protocol.server_events`` (shared objects: ``protocol.objects``).
"""
from __future__ import annotations

from .codes import (BINARY_TYPES, EVENT_CODES, FATAL_CODES, REQUEST_CODES, V2_ONLY_TYPES, V2_TYPES, V3_ONLY_TYPES,
                    ErrorCode, MsgType, type_name)
from .codes import ProtocolVersion, Role
from .connection import Connection
from .receiver import DEFAULT_MAX_MESSAGE_SIZE
from .errors import ProtocolError
from .events import Event, InvalidMessage, Message
from .frame import (HEADER, HEADER_SIZE, MAX_FRAME, MAX_PAYLOAD, TLS_ON_PLAIN_PORT, decode_header, encode_frame,
                    looks_like_tls)
from .textsplit import split_text_utf8

__all__ = [
    "MsgType", "ErrorCode", "ProtocolError", "Connection", "Role", "Message", "InvalidMessage",
    "ProtocolVersion", "Event", "FATAL_CODES", "V2_TYPES", "V3_ONLY_TYPES", "V2_ONLY_TYPES",
    "REQUEST_CODES", "EVENT_CODES", "BINARY_TYPES", "type_name", "DEFAULT_MAX_MESSAGE_SIZE", "HEADER",
    "HEADER_SIZE", "MAX_FRAME", "MAX_PAYLOAD", "encode_frame", "decode_header", "looks_like_tls",
    "TLS_ON_PLAIN_PORT", "split_text_utf8",
]
