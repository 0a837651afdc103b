"""Decoding of v3 payloads: one UTF-8 JSON object; INVALID_UTF8 and INVALID_JSON are told apart."""
from __future__ import annotations

from typing import Any

import orjson

from .codes import ErrorCode, MsgType
from .errors import ProtocolError
from .events import Event, InvalidMessage, Message


def json_kind(value: Any) -> str:
    """How a JSON value is named in error messages."""
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"


def decode_body(mt: MsgType, seq: int, payload: bytes) -> Event:
    """A Message with the decoded JSON object, or the InvalidMessage saying what is wrong."""
    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        return json_error(mt, seq, payload, exc)
    if type(body) is not dict:
        return not_object(mt, seq, body)
    return Message(mt, body, seq)


def json_error(mt: MsgType, seq: int, payload: bytes, exc: Exception) -> InvalidMessage:
    """INVALID_UTF8 if the payload is not UTF-8, else INVALID_JSON."""
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError as uexc:
        err = ProtocolError(ErrorCode.INVALID_UTF8,
                            f"{mt.name} payload is not valid UTF-8 at byte {uexc.start}", fatal=False)
    else:
        err = ProtocolError(ErrorCode.INVALID_JSON,
                            f"{mt.name} payload is not valid JSON: {exc}", fatal=False)
    return InvalidMessage(err, mt, seq)


def not_object(mt: MsgType, seq: int, body: Any) -> InvalidMessage:
    """INVALID_JSON for a payload that is valid JSON but not an object."""
    return InvalidMessage(ProtocolError(
        ErrorCode.INVALID_JSON, f"{mt.name} payload must be a JSON object, got {json_kind(body)}",
        fatal=False), mt, seq)
