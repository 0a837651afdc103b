"""Session requests (docs/protocol.md §5.2): list, new, switch, rename, delete, clear, info."""
from __future__ import annotations

from typing import Any

from protocol.messages import (DEFAULT_PAGE_LIMIT, SessionClear, SessionDelete, SessionInfoReq, SessionList,
                               SessionNew, SessionRename, SessionSwitch)
from server.context import RequestContext
from server.handlers.common import check_limit, target_session


async def session_list(ctx: RequestContext, req: SessionList) -> dict[str, Any]:
    limit = check_limit(ctx, req.limit, DEFAULT_PAGE_LIMIT)
    svc = ctx.services
    recs, cursor = await svc.store.list(ctx.user_id, before=req.before, limit=limit)
    return {"sessions": [svc.sessions.info(r) for r in recs], "has_more": cursor is not None,
            "next_before": cursor}


async def session_new(ctx: RequestContext, req: SessionNew) -> dict[str, Any]:
    sessions = ctx.services.sessions
    rec = await sessions.create(ctx.user_id, req.title)
    ctx.attach(rec.session_id)
    await sessions.publish_event("created", rec)
    return {"session": sessions.info(rec, summary=True)}


async def session_switch(ctx: RequestContext, req: SessionSwitch) -> dict[str, Any]:
    svc = ctx.services
    rec = await svc.sessions.owned(ctx.user_id, req.session_id)
    ctx.attach(rec.session_id)
    return {"session": svc.sessions.info(rec, summary=True),
            "running_turn": svc.runner.running_state(rec.session_id)}


async def session_rename(ctx: RequestContext, req: SessionRename) -> dict[str, Any]:
    svc = ctx.services
    rec = await target_session(ctx, req.session_id)
    rec = await svc.store.rename(rec.session_id, req.title.strip())
    await svc.sessions.publish_event("renamed", rec)
    return {"session": svc.sessions.info(rec, summary=True)}


async def session_delete(ctx: RequestContext, req: SessionDelete) -> dict[str, Any]:
    """Soft delete (SessionService.delete: turns cancelled, every attached connection moved)."""
    sessions = ctx.services.sessions
    deleted = await sessions.delete(ctx.user_id, req.session_id, requester=ctx.port)
    current = await target_session(ctx, None)
    return {"session_id": deleted.session_id, "current": sessions.info(current, summary=True)}


async def session_clear(ctx: RequestContext, req: SessionClear) -> dict[str, Any]:
    """Hide every message; a running turn is cancelled first (its partial answer is hidden too)."""
    sessions = ctx.services.sessions
    rec = await target_session(ctx, req.session_id)
    rec, cleared = await sessions.clear(rec.session_id)
    return {"session": sessions.info(rec, summary=True), "cleared": cleared}


async def session_info(ctx: RequestContext, req: SessionInfoReq) -> dict[str, Any]:
    rec = await target_session(ctx, req.session_id)
    return {"session": ctx.services.sessions.info(rec, summary=True)}
