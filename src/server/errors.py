"""HandlerError: a request failed with a stable protocol error code (sent as ERROR with the request's id).

Also the ERROR frame for a connection refused before it has a codec state (``server_full_frame``).
"""
from __future__ import annotations

import orjson

from protocol import MsgType, encode_frame
from protocol.messages import request_id


class HandlerError(Exception):
    """Raised by handlers and services; the connection answers ``ERROR {code, message}``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = str(code)
        self.message = message


def not_found(what: str = "session") -> HandlerError:
    """The one answer for missing and foreign objects alike, so ids do not leak."""
    return HandlerError("NOT_FOUND", f"no such {what}")


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
            pass
    payload = orjson.dumps({"re": re, "code": "SERVER_FULL", "fatal": True,
                            "message": f"the server is full ({max_clients} clients)"})
    return encode_frame(MsgType.ERROR, 0, payload)
