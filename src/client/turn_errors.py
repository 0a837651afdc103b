"""The error line of a failed turn, as the TUI (under the answer) and ``nplt-client history`` show
it: ``Error CODE: message (after N attempts)``.

The server stores a failed answer with metadata ``error`` (the code), ``error_message`` and
``attempts`` (docs/protocol.md). Its message may already end with ``(after N attempts)`` (the model
endpoint's errors say it themselves): ``with_attempts`` then adds nothing, so it is never said twice.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

#: what a message that already says how often it was tried ends with
ATTEMPTS_SUFFIX = re.compile(r"\(after \d+ attempts\)\s*$")


def with_attempts(message: str, attempts: Any) -> str:
    """``message`` followed by `` (after N attempts)`` when it took more than one attempt, unless it
    already ends with such a suffix."""
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 2:
        return message
    if ATTEMPTS_SUFFIX.search(message):
        return message
    return f"{message} (after {attempts} attempts)"


def error_line(meta: Mapping[str, Any]) -> str | None:
    """``Error CODE: message (after N attempts)`` for a stored answer's metadata, or None when it is
    not marked failed. ``error`` may also be an object ``{"code", "message"}``."""
    error = meta.get("error")
    if not error:
        return None
    code, message = error, meta.get("error_message")
    if isinstance(error, Mapping):
        code, message = error.get("code") or "ERROR", message or error.get("message")
    return "Error " + with_attempts(f"{code}: {message or 'the answer failed'}", meta.get("attempts"))
