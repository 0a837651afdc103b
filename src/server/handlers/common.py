"""Helpers shared by the handlers: the current-or-given session, page-size checks."""
from __future__ import annotations

from typing import TYPE_CHECKING

from server.errors import HandlerError
from storage.models import SessionRecord

if TYPE_CHECKING:  # pragma: no cover
    from server.connection import ServerConnection


async def target_session(conn: ServerConnection, session_id: str | None) -> SessionRecord:
    """The given session (or the connection's current one), checked to belong to the user."""
    return await conn.server.sessions.owned(conn.user_id, session_id or conn.session_id)


def check_limit(conn: ServerConnection, limit: int | None, default: int) -> int:
    """The page size: ``default`` when absent (never over ``max_page_size``), else at most that."""
    cap = conn.limits.max_page_size
    if limit is None:
        return min(default, cap)
    if limit > cap:
        raise HandlerError("INVALID_MESSAGE", f"field 'limit': expected an integer in 1..{cap}, got {limit}")
    return limit
