"""ProtocolError: the one exception src/protocol raises for malformed input (docs/protocol.md §8)."""
from __future__ import annotations

from typing import Any

from .codes import FATAL_CODES, ErrorCode


class ProtocolError(Exception):
    """A protocol violation with a stable code.

    ``fatal`` defaults to the §8 table. ``events`` holds the events decoded earlier in the same
    ``receive_data`` call when a fatal error interrupted it, so none of them is lost.
    """

    code: ErrorCode
    message: str
    fatal: bool
    events: list[Any]

    def __init__(self, code: ErrorCode | str, message: str, fatal: bool | None = None,
                 events: list[Any] | None = None) -> None:
        code = ErrorCode(code)
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.fatal = code in FATAL_CODES if fatal is None else fatal
        self.events = events if events is not None else []

    def __repr__(self) -> str:
        return f"ProtocolError({self.code.value!r}, {self.message!r}, fatal={self.fatal})"


def closed_error(detail: str = "the connection is closed") -> ProtocolError:
    """The fatal CONNECTION_CLOSED error."""
    return ProtocolError(ErrorCode.CONNECTION_CLOSED, detail, fatal=True)
