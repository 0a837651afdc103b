"""Argument checks shared by the store's public methods (raise InvalidArgument)."""
from __future__ import annotations

from collections.abc import Iterable

from .errors import InvalidArgument
from .models import ROLES, ToolCall

MAX_USER_ID_CHARS = 256


def check_user(user_id: object) -> None:
    if not isinstance(user_id, str) or not user_id or len(user_id) > MAX_USER_ID_CHARS:
        raise InvalidArgument(f"user_id: expected a string of 1..{MAX_USER_ID_CHARS} characters")


def check_opt_str(name: str, v: object) -> None:
    if v is not None and not isinstance(v, str):
        raise InvalidArgument(f"{name}: expected a string or None, got {type(v).__name__}")


def check_title(title: object, max_chars: int) -> str:
    """The title stripped; InvalidArgument when empty or over ``max_chars`` (max_title_chars)."""
    if not isinstance(title, str) or not title.strip():
        raise InvalidArgument("title: expected a non-empty string")
    if len(title) > max_chars:
        raise InvalidArgument(f"title: longer than max_title_chars ({max_chars})")
    return title.strip()


def check_int(name: str, v: object) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidArgument(f"{name}: expected an integer, got {v!r}")


def check_positive(name: str, v: object) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InvalidArgument(f"{name}: expected a positive integer, got {v!r}")


def check_message(role: object, content: object, metadata: object, timestamp: object) -> None:
    if role not in ROLES:
        raise InvalidArgument(f"role: expected one of {', '.join(ROLES)}, got {role!r}")
    if not isinstance(content, str):
        raise InvalidArgument(f"content: expected a string, got {type(content).__name__}")
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidArgument(f"metadata: expected a dict, got {type(metadata).__name__}")
    check_opt_str("timestamp", timestamp)


def tool_calls(calls: Iterable[ToolCall | dict]) -> list[ToolCall]:
    out = []
    for c in calls:
        if isinstance(c, ToolCall):
            out.append(c)
        elif isinstance(c, dict):
            try:
                out.append(ToolCall.from_dict(c))
            except (KeyError, TypeError, ValueError) as exc:
                raise InvalidArgument(f"tool_calls: bad tool call {exc!r}") from None
        else:
            raise InvalidArgument(f"tool_calls: expected ToolCall objects, got {type(c).__name__}")
    return out
