"""Session requests (docs/protocol.md §5.2): list, new, switch, rename, delete, clear, info."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from protocol.messages import (DEFAULT_PAGE_LIMIT, SessionClear, SessionDelete, SessionInfoReq, SessionList, SessionNew,
                               SessionRename, SessionSwitch)
from server.handlers.common import check_limit, target_session

if TYPE_CHECKING:  # pragma: no cover
    from server.connection import ServerConnection


async def session_list(conn: ServerConnection, req: SessionList) -> dict[str, Any]:
    limit = check_limit(conn, req.limit, DEFAULT_PAGE_LIMIT)
    srv = conn.server
    recs, cursor = await srv.store.list(conn.user_id, before=req.before, limit=limit)
    return {"sessions": [srv.sessions.info(r) for r in recs], "has_more": cursor is not None,
            "next_before": cursor}


async def session_new(conn: ServerConnection, req: SessionNew) -> dict[str, Any]:
    srv = conn.server
    rec = await srv.sessions.create(conn.user_id, req.title)
    srv.hub.attach(conn, rec.session_id)
    await srv.sessions.publish_event("created", rec)
    return {"session": srv.sessions.info(rec, summary=True)}


async def session_switch(conn: ServerConnection, req: SessionSwitch) -> dict[str, Any]:
    srv = conn.server
    rec = await srv.sessions.owned(conn.user_id, req.session_id)
    srv.hub.attach(conn, rec.session_id)
    return {"session": srv.sessions.info(rec, summary=True),
            "running_turn": srv.runner.running_state(rec.session_id)}


async def session_rename(conn: ServerConnection, req: SessionRename) -> dict[str, Any]:
    srv = conn.server
    rec = await target_session(conn, req.session_id)
    rec = await srv.store.rename(rec.session_id, req.title.strip())
    await srv.sessions.publish_event("renamed", rec)
    return {"session": srv.sessions.info(rec, summary=True)}


async def session_delete(conn: ServerConnection, req: SessionDelete) -> dict[str, Any]:
    """Soft delete (SessionService.delete: turns cancelled, every attached connection moved)."""
    srv = conn.server
    deleted = await srv.sessions.delete(conn.user_id, req.session_id)
    current = await target_session(conn, None)
    return {"session_id": deleted.session_id, "current": srv.sessions.info(current, summary=True)}


async def session_clear(conn: ServerConnection, req: SessionClear) -> dict[str, Any]:
    """Hide every message; a running turn is cancelled first (its partial answer is hidden too)."""
    srv = conn.server
    rec = await target_session(conn, req.session_id)
    rec, cleared = await srv.sessions.clear(rec.session_id)
    return {"session": srv.sessions.info(rec, summary=True), "cleared": cleared}


async def session_info(conn: ServerConnection, req: SessionInfoReq) -> dict[str, Any]:
    rec = await target_session(conn, req.session_id)
    return {"session": conn.server.sessions.info(rec, summary=True)}
