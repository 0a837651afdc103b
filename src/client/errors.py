"""Client-side errors and the stable codes the client adds to the server's ERROR codes.

A ``ClientError`` carries either a server code (``protocol.ErrorCode``, docs/protocol.md §8, e.g.
``NOT_FOUND``, ``AUTH_FAILED``) or a ``ClientCode`` below, which never travels on the wire.
"""
from __future__ import annotations

from enum import StrEnum

from protocol import ErrorCode


class ClientCode(StrEnum):
    """Client-only codes (the server never sends these)."""

    CONNECTION_REFUSED = "CONNECTION_REFUSED"   # nothing listens on host:port
    CONNECTION_FAILED = "CONNECTION_FAILED"     # DNS failure, unreachable host, other OSError
    CONNECTION_LOST = "CONNECTION_LOST"         # the connection dropped while a request was pending
    NOT_CONNECTED = "NOT_CONNECTED"             # a request was made while (re)connecting or closed
    TIMEOUT = "TIMEOUT"                         # connect or request timed out
    TLS_ERROR = "TLS_ERROR"                     # TLS handshake or certificate verification failed, or one
    #                                             end speaks TLS and the other does not (never retried)
    CLOSED = "CLOSED"                           # the client was closed by its owner
    NOT_A_FILE = "NOT_A_FILE"                   # a local path to upload is not a readable file
    FILE_CHANGED = "FILE_CHANGED"               # a local file changed while it was uploaded
    WRITE_FAILED = "WRITE_FAILED"               # a local file (an export, a download) could not be written
    FILE_EXISTS = "FILE_EXISTS"                 # a download would replace a local file nobody named
    SERVED_AS_V2 = "SERVED_AS_V2"               # the HELLO came after the server's v2 grace (connect retries)


CONNECTION_REFUSED = ClientCode.CONNECTION_REFUSED
CONNECTION_FAILED = ClientCode.CONNECTION_FAILED
CONNECTION_LOST = ClientCode.CONNECTION_LOST
NOT_CONNECTED = ClientCode.NOT_CONNECTED
TIMEOUT = ClientCode.TIMEOUT
TLS_ERROR = ClientCode.TLS_ERROR
CLOSED = ClientCode.CLOSED
SERVED_AS_V2 = ClientCode.SERVED_AS_V2

CONNECTION_CODES = frozenset({CONNECTION_REFUSED, CONNECTION_FAILED, CONNECTION_LOST, NOT_CONNECTED,
                              TIMEOUT, TLS_ERROR, CLOSED, SERVED_AS_V2})
# Errors after which reconnecting is pointless: the same HELLO would fail again (a TLS mismatch or
# a certificate that is not trusted too: the link already tried a dropped handshake twice).
PERMANENT_CODES = frozenset({ErrorCode.AUTH_FAILED, ErrorCode.UNSUPPORTED_VERSION, TLS_ERROR})
# Local file errors: the command's own fault, not the server's (the CLI's usage exit code).
LOCAL_FILE_CODES = frozenset({ClientCode.WRITE_FAILED, ClientCode.FILE_EXISTS})


class ClientError(Exception):
    """A request failed: an ERROR reply from the server or a client-side failure."""

    def __init__(self, code: ErrorCode | ClientCode, message: str, fatal: bool = False) -> None:
        if not isinstance(code, (ErrorCode, ClientCode)):
            raise TypeError(f"ClientError needs an ErrorCode or a ClientCode, got {code!r}")
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.fatal = fatal

    @property
    def is_connection_error(self) -> bool:
        """True when the failure is about the transport, not the request itself."""
        return self.code in CONNECTION_CODES
