"""Events produced by ``Connection.receive_data``: Message and InvalidMessage."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .codes import ErrorCode
from .errors import ProtocolError


@dataclass(slots=True)
class Message:
    """One complete logical message received.

    ``type`` is a MsgType member for known codes and the raw int for unknown codes (v2 only: v3
    reports unknown codes as InvalidMessage). ``body`` is the decoded JSON object in v3 and the raw
    payload bytes in v2. ``seq`` is the seq of the (final) frame.
    """

    type: int
    body: dict[str, Any] | bytes
    seq: int

    @property
    def text(self) -> str:
        """v2 helper: the payload decoded as UTF-8 (ProtocolError INVALID_UTF8 if it is not)."""
        body = self.body
        if not isinstance(body, bytes):
            raise TypeError("Message.text is only available for v2 (bytes) payloads")
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(ErrorCode.INVALID_UTF8,
                                f"payload is not valid UTF-8 at byte {exc.start}", fatal=False) from None


@dataclass(slots=True)
class InvalidMessage:
    """A recoverable error: the offending message was skipped and the connection stays usable."""

    error: ProtocolError
    type: int
    seq: int
    re: int | str | None = None

    @property
    def code(self) -> ErrorCode:
        """Shortcut for ``error.code``."""
        return self.error.code


Event = Message | InvalidMessage
