"""HandlerError: a request failed with a stable protocol error code (sent as ERROR with the request's id)."""
from __future__ import annotations


class HandlerError(Exception):
    """Raised by handlers and services; the connection answers ``ERROR {code, message}``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = str(code)
        self.message = message


def not_found(what: str = "session") -> HandlerError:
    """The one answer for missing and foreign objects alike, so ids do not leak."""
    return HandlerError("NOT_FOUND", f"no such {what}")
