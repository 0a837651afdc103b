"""Session requests (docs/protocol.md §5.2): list, new, switch, rename, delete, clear, info."""
from __future__ import annotations

from protocol.messages import (DEFAULT_PAGE_LIMIT, SessionClear, SessionDelete, SessionInfoReq, SessionList,
                               SessionNew, SessionRename, SessionSwitch)
from protocol.replies import (SessionClearReply, SessionDeleteReply, SessionListReply, SessionReply,
                              SessionSwitchReply)
from server.context import RequestContext
from server.handlers.common import check_limit, target_session


async def session_list(ctx: RequestContext, req: SessionList) -> SessionListReply:
    limit = check_limit(ctx, req.limit, DEFAULT_PAGE_LIMIT)
    svc = ctx.services
    recs, cursor = await svc.store.list(ctx.user_id, before=req.before, limit=limit)
    return SessionListReply(tuple(svc.sessions.info(r) for r in recs), cursor is not None, cursor)


async def session_new(ctx: RequestContext, req: SessionNew) -> SessionReply:
    sessions = ctx.services.sessions
    rec = await sessions.create(ctx.user_id, req.title)
    ctx.attach(rec.session_id)
    await sessions.publish_event("created", rec)
    return SessionReply(sessions.info(rec, summary=True))


async def session_switch(ctx: RequestContext, req: SessionSwitch) -> SessionSwitchReply:
    svc = ctx.services
    rec = await svc.sessions.owned(ctx.user_id, req.session_id)
    ctx.attach(rec.session_id)
    return SessionSwitchReply(svc.sessions.info(rec, summary=True), svc.runner.running_state(rec.session_id))


async def session_rename(ctx: RequestContext, req: SessionRename) -> SessionReply:
    svc = ctx.services
    rec = await target_session(ctx, req.session_id)
    rec = await svc.store.rename(rec.session_id, req.title.strip())
    await svc.sessions.publish_event("renamed", rec)
    return SessionReply(svc.sessions.info(rec, summary=True))


async def session_delete(ctx: RequestContext, req: SessionDelete) -> SessionDeleteReply:
    """Soft delete (SessionService.delete: turns cancelled, every attached connection moved)."""
    sessions = ctx.services.sessions
    deleted = await sessions.delete(ctx.user_id, req.session_id, requester=ctx.port)
    current = await target_session(ctx, None)
    return SessionDeleteReply(deleted.session_id, sessions.info(current, summary=True))


async def session_clear(ctx: RequestContext, req: SessionClear) -> SessionClearReply:
    """Hide every message; a running turn is cancelled first (its partial answer is hidden too)."""
    sessions = ctx.services.sessions
    rec = await target_session(ctx, req.session_id)
    rec, cleared = await sessions.clear(rec.session_id)
    return SessionClearReply(sessions.info(rec, summary=True), cleared)


async def session_info(ctx: RequestContext, req: SessionInfoReq) -> SessionReply:
    rec = await target_session(ctx, req.session_id)
    return SessionReply(ctx.services.sessions.info(rec, summary=True))
