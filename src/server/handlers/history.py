"""History requests (docs/protocol.md §5.3): page, search, export."""
from __future__ import annotations

from protocol.messages import (DEFAULT_PAGE_LIMIT, DEFAULT_SEARCH_LIMIT, HistoryExport, HistoryPage,
                               HistorySearch)
from protocol.objects import EncodedObject
from protocol.replies import HistoryExportReply, HistoryPageReply, HistorySearchReply
from server.context import RequestContext
from server.handlers.common import check_limit, fewer_hits, target_session
from server.wire import hit_obj
from storage.models import EncodedPage


#: pages of only superseded messages skipped to reach a visible one (then an empty page, has_more true)
MAX_PAGES_SKIPPED = 100


async def history_page(ctx: RequestContext, req: HistoryPage) -> HistoryPageReply:
    limit = check_limit(ctx, req.limit, DEFAULT_PAGE_LIMIT)
    rec = await target_session(ctx, req.session_id)
    # Each message comes as its JSON bytes, encoded once per stored message and cached by the
    # store: the reply splices them (no ChatMessage objects, no re-encoding per page).
    before = req.before
    for _ in range(MAX_PAGES_SKIPPED + 1):
        page = await ctx.services.store.page_encoded(rec.session_id, before=before, limit=limit)
        if _visible(req, page) or not page.has_more:
            break
        before = page.next_before       # a page of superseded messages only: the next one is asked
    return _page_reply(rec.session_id, req, page)


def history_page_now(ctx: RequestContext, req: HistoryPage) -> HistoryPageReply | None:
    """``history_page`` without awaiting, for the dispatcher's inline table: the reply when the
    session is the user's, live, loaded and idle right now (no I/O, no waiting), else None (then
    ``history_page`` runs as a task and gives the same reply or the error)."""
    store = ctx.services.store
    session_id = req.session_id or ctx.session_id
    get_loaded = getattr(store, "get_loaded", None)          # (backends with a memory of their own)
    page_loaded = getattr(store, "page_encoded_loaded", None)
    if not isinstance(session_id, str) or get_loaded is None or page_loaded is None:
        return None
    limit = check_limit(ctx, req.limit, DEFAULT_PAGE_LIMIT)
    rec = get_loaded(session_id)
    if rec is None or rec.user_id != ctx.user_id or rec.deleted:
        return None
    page = page_loaded(session_id, req.before, limit)
    if page is None or (page.has_more and not _visible(req, page)):
        return None                     # (``history_page`` pages on past the superseded messages)
    return _page_reply(session_id, req, page)


def _visible(req: HistoryPage, page: EncodedPage) -> list[bytes]:
    """The page's messages the reply holds: those replaced by a regenerate or an edit are left out
    unless asked for."""
    if req.superseded or not any(page.superseded):
        return page.messages
    return [raw for raw, sup in zip(page.messages, page.superseded) if not sup]


def _page_reply(session_id: str, req: HistoryPage, page: EncodedPage) -> HistoryPageReply:
    # Such a page may hold fewer than ``limit`` messages (never none while more are left: a page of
    # superseded messages only is skipped); has_more / next_before still page through everything.
    raws = _visible(req, page)
    return HistoryPageReply(session_id, EncodedObject(b"[" + b",".join(raws) + b"]"), page.has_more,
                            page.next_before, page.total)


async def history_search(ctx: RequestContext, req: HistorySearch) -> HistorySearchReply:
    limit = check_limit(ctx, req.limit, DEFAULT_SEARCH_LIMIT)
    session_id = None
    if req.session_id is not None:
        session_id = (await target_session(ctx, req.session_id)).session_id
    hits = await ctx.services.store.search(ctx.user_id, req.query, session_id=session_id, limit=limit)
    return fewer_hits(ctx, req.id, HistorySearchReply(tuple(hit_obj(h) for h in hits)))


async def history_export(ctx: RequestContext, req: HistoryExport) -> HistoryExportReply:
    rec = await target_session(ctx, req.session_id)
    # the header names the model SESSION_INFO shows (a session on the default model stores none)
    model = ctx.services.sessions.model_of(rec)
    content = await ctx.services.store.export(rec.session_id, req.format, model)
    return HistoryExportReply(rec.session_id, req.format, content)
