"""Session requests (docs/protocol.md §5.2): list (and the trash), new, switch, rename, delete,
restore, purge, clear, info, system prompt."""
from __future__ import annotations

from protocol.messages import (DEFAULT_PAGE_LIMIT, SessionClear, SessionDelete, SessionInfoReq, SessionList,
                               SessionNew, SessionPrompt, SessionPurge, SessionRename, SessionRestore,
                               SessionSwitch)
from protocol.objects import SessionInfo
from protocol.replies import (SessionClearReply, SessionDeleteReply, SessionListReply, SessionPromptReply,
                              SessionReply, SessionSwitchReply)
from server.context import RequestContext
from server.fit import fit_items
from server.handlers.common import check_limit, running_turn, target_session
from server.wire import encode_reply


async def session_list(ctx: RequestContext, req: SessionList) -> SessionListReply:
    """A page of sessions; one over ``max_message_size`` (long titles) holds fewer, the next page the
    rest (docs/protocol.md §3, "Size")."""
    limit = check_limit(ctx, req.limit, DEFAULT_PAGE_LIMIT)
    svc = ctx.services
    recs, cursor = await svc.store.list(ctx.user_id, before=req.before, limit=limit, deleted=req.deleted)
    reply = SessionListReply(tuple(svc.sessions.info(r) for r in recs), cursor is not None, cursor)
    n = fit_items(encode_reply(req.id, reply), "sessions", ctx.limits.max_message_size)
    if n < len(recs):        # the shorter page again, for the store's own cursor after its last session
        recs, cursor = await svc.store.list(ctx.user_id, before=req.before, limit=n, deleted=req.deleted)
        reply = SessionListReply(tuple(svc.sessions.info(r) for r in recs), cursor is not None, cursor)
    return reply


async def session_new(ctx: RequestContext, req: SessionNew) -> SessionReply:
    """Without a title, the user's empty session (not the current one) is reused: empty sessions do
    not pile up."""
    sessions = ctx.services.sessions
    rec, created = await sessions.fresh(ctx.user_id, req.title, req.system_prompt, exclude=ctx.session_id)
    ctx.attach(rec.session_id)
    if created:
        await sessions.publish_event("created", rec)
    return SessionReply(sessions.info(rec, summary=True))


async def session_switch(ctx: RequestContext, req: SessionSwitch) -> SessionSwitchReply:
    svc = ctx.services
    rec = await svc.sessions.owned(ctx.user_id, req.session_id)
    ctx.attach(rec.session_id)
    return SessionSwitchReply(svc.sessions.info(rec, summary=True), await running_turn(ctx, rec.session_id))


async def session_rename(ctx: RequestContext, req: SessionRename) -> SessionReply:
    svc = ctx.services
    rec = await target_session(ctx, req.session_id)
    rec = await svc.store.rename(rec.session_id, req.title.strip())
    titles = getattr(svc.memory, "titles", None)      # (long-term memory names sessions by title)
    if titles is not None:
        titles.forget(rec.session_id)
    await svc.sessions.publish_event("renamed", rec)
    return SessionReply(svc.sessions.info(rec, summary=True))


async def session_delete(ctx: RequestContext, req: SessionDelete) -> SessionDeleteReply:
    """Soft delete (SessionService.delete: turns cancelled, every attached connection moved)."""
    sessions = ctx.services.sessions
    deleted = await sessions.delete(ctx.user_id, req.session_id, requester=ctx.port)
    return SessionDeleteReply(deleted.session_id, await _current_info(ctx))


async def session_clear(ctx: RequestContext, req: SessionClear) -> SessionClearReply:
    """Hide every message and drop the summaries (``purge``: remove the hidden messages for good); a
    running turn is cancelled first (its partial answer is hidden too)."""
    sessions = ctx.services.sessions
    rec = await target_session(ctx, req.session_id)
    rec, cleared = await sessions.clear(rec, req.purge)
    return SessionClearReply(sessions.info(rec, summary=True), cleared)


async def session_info(ctx: RequestContext, req: SessionInfoReq) -> SessionReply:
    rec = await target_session(ctx, req.session_id)
    return SessionReply(ctx.services.sessions.info(rec, summary=True))


async def session_restore(ctx: RequestContext, req: SessionRestore) -> SessionReply:
    """A session out of the trash (the connection stays where it is)."""
    sessions = ctx.services.sessions
    rec = await sessions.restore(ctx.user_id, req.session_id)
    return SessionReply(sessions.info(rec, summary=True))


async def session_purge(ctx: RequestContext, req: SessionPurge) -> SessionDeleteReply:
    """Remove a session for good (a live one is deleted first: turns cancelled, clients moved)."""
    sessions = ctx.services.sessions
    purged = await sessions.purge(ctx.user_id, req.session_id, requester=ctx.port)
    return SessionDeleteReply(purged.session_id, await _current_info(ctx))


async def _current_info(ctx: RequestContext) -> SessionInfo | None:
    """The connection's session after a delete or purge (None: it had none, and still has none)."""
    if ctx.session_id is None:
        return None
    return ctx.services.sessions.info(await target_session(ctx, None), summary=True)


async def session_prompt(ctx: RequestContext, req: SessionPrompt) -> SessionPromptReply:
    """Read (no ``system_prompt``), set, or reset ("") the session's own system prompt."""
    sessions = ctx.services.sessions
    rec = await target_session(ctx, req.session_id)
    if req.system_prompt is not None and (req.system_prompt or None) != rec.system_prompt:
        rec = await sessions.set_system_prompt(rec.session_id, req.system_prompt)   # (an unchanged prompt: no event)
    return SessionPromptReply(sessions.info(rec, summary=True), rec.system_prompt)
