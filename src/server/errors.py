"""The errors a request can end with, each with a stable ``ErrorCode`` (docs/protocol.md §8).

``HandlerError`` is raised by handlers and services and answered as ``ERROR {code, message}`` with the
request's id. ``failure_of`` maps what the store raises to a code: its own errors carry theirs
(``StorageError.code``); an ``OSError`` from the store (a full disk, an I/O error) is
``STORAGE_ERROR``, never "not found". Also the ERROR frame for a connection refused before it has a
codec state (``server_full_frame``).
"""
from __future__ import annotations

import logging

import orjson

from protocol import ErrorCode, MsgType, encode_frame
from protocol.messages import request_id
from storage.errors import StorageError

log = logging.getLogger("nplt.errors")


class HandlerError(Exception):
    """Raised by handlers and services; the connection answers ``ERROR {code, message}``."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        if not isinstance(code, ErrorCode):
            raise TypeError(f"HandlerError needs an ErrorCode, got {code!r}")
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def not_found(what: str = "session") -> HandlerError:
    """The one answer for missing and foreign objects alike, so ids do not leak."""
    return HandlerError(ErrorCode.NOT_FOUND, f"no such {what}")


def error_code(raw: str) -> ErrorCode:
    """``raw`` (a code read back from another node's NOTIFY) as an ErrorCode; an unknown code is
    INTERNAL, and logged: it is a bug."""
    try:
        return ErrorCode(raw)
    except ValueError:
        log.error("unknown error code %r sent as INTERNAL", raw)
        return ErrorCode.INTERNAL


def failure_of(exc: BaseException) -> HandlerError | None:
    """The client-facing error for ``exc``, or None when it is a bug (logged, answered INTERNAL).

    HandlerError as it is; a StorageError by its code (NOT_FOUND, INVALID_MESSAGE, STORAGE_ERROR, ...);
    an OSError (raised by the store's file I/O: ENOSPC, EIO, ...) as STORAGE_ERROR.
    """
    if isinstance(exc, HandlerError):
        return exc
    if isinstance(exc, StorageError):
        return HandlerError(exc.code, exc.message)
    if isinstance(exc, OSError):
        reason = exc.strerror or type(exc).__name__
        return HandlerError(ErrorCode.STORAGE_ERROR, f"the server could not store or read this: {reason}")
    return None


def server_full_frame(first: bytes, max_clients: int) -> bytes:
    """ERROR SERVER_FULL (fatal) for a client whose first read is ``first``; b"" unless it is v3.

    A v3 client starts with HELLO (type code 0x20): it gets the error, with the HELLO's id when the
    whole frame is in ``first``. Anything else is a v2 client, which only sees the close.
    """
    if not first or first[0] != MsgType.HELLO:
        return b""
    re = None
    end = 5 + int.from_bytes(first[3:5], "big")
    if len(first) >= 5 and len(first) >= end:
        try:
            re = request_id(orjson.loads(first[5:end]))
        except orjson.JSONDecodeError:
            re = None   # a HELLO we cannot read still gets the error, without an id
    payload = orjson.dumps({"re": re, "code": ErrorCode.SERVER_FULL, "fatal": True,
                            "message": f"the server is full ({max_clients} clients)"})
    return encode_frame(MsgType.ERROR, 0, payload)
