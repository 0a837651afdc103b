"""Turns that were running when the server died (issue 15, item 5): find them, and build the
assistant message that closes each one as ``interrupted``.

A turn stores its user message when it starts and its assistant message when it ends, so at start-up
(no turn is running) a user message with no assistant message after it is a turn cut short by a crash
or a kill. Only the last message of a session can be closed in place: the store appends, so an
answer to an older unanswered question would land after later messages. ``unanswered`` lists them all
(for a count in the log), ``trailing_unanswered`` is the one to close, and ``interrupted_message``
builds the closing message: empty content, ``partial: true`` and ``finish_reason: "interrupted"``
(its own reason, unlike ``cancelled``), with the id of the question it answers.

Note: a failed turn that streamed nothing stores no assistant message either, so until failed turns
are stored as error messages it also shows up here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

INTERRUPTED = "interrupted"


@dataclass(slots=True)
class ClosingMessage:
    """What to append (role ``assistant``) to close an interrupted turn."""
    content: str
    metadata: dict[str, Any] = field(default_factory=dict)


def _role(m: Any) -> str:
    return str(m.get("role", "") if isinstance(m, dict) else getattr(m, "role", ""))


def _id(m: Any) -> int:
    return int(m.get("id", 0) if isinstance(m, dict) else getattr(m, "id", 0))


def unanswered(messages: Iterable[Any]) -> list[Any]:
    """Every user message (ChatMessage or dict, ascending ids) not followed by an assistant message
    before the next user message or the end."""
    out: list[Any] = []
    waiting: Any = None
    for m in messages:
        role = _role(m)
        if role == "user":
            if waiting is not None:
                out.append(waiting)
            waiting = m
        elif role == "assistant":
            waiting = None
    if waiting is not None:
        out.append(waiting)
    return out


def trailing_unanswered(messages: list[Any]) -> Any | None:
    """The session's last message if it is an unanswered user message (the turn to close), else None."""
    return messages[-1] if messages and _role(messages[-1]) == "user" else None


def interrupted_message(user_message: Any, *, model: str | None = None, detected_at: str | None = None) -> ClosingMessage:
    """The assistant message that closes the turn of ``user_message`` as interrupted."""
    meta: dict[str, Any] = {"partial": True, INTERRUPTED: True, "finish_reason": INTERRUPTED,
                            "answers": _id(user_message)}
    if model:
        meta["model"] = model
    if detected_at:
        meta["interrupted_detected_at"] = detected_at
    return ClosingMessage("", meta)
