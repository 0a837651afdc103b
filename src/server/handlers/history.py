"""History requests (docs/protocol.md §5.3): page, search, export."""
from __future__ import annotations

from protocol.messages import (DEFAULT_PAGE_LIMIT, DEFAULT_SEARCH_LIMIT, HistoryExport, HistoryPage,
                               HistorySearch)
from protocol.objects import EncodedObject
from protocol.replies import HistoryExportReply, HistoryPageReply, HistorySearchReply
from server.context import RequestContext
from server.handlers.common import check_limit, target_session
from server.wire import hit_obj


async def history_page(ctx: RequestContext, req: HistoryPage) -> HistoryPageReply:
    limit = check_limit(ctx, req.limit, DEFAULT_PAGE_LIMIT)
    rec = await target_session(ctx, req.session_id)
    # Each message comes as its JSON bytes, encoded once per stored message and cached by the
    # store: the reply splices them (no ChatMessage objects, no re-encoding per page).
    page = await ctx.services.store.page_encoded(rec.session_id, before=req.before, limit=limit)
    # Messages replaced by a regenerate or an edit are left out unless asked for: such a page may
    # hold fewer than ``limit`` messages; has_more / next_before still page through everything.
    raws = page.messages if req.superseded or not any(page.superseded) else \
        [raw for raw, sup in zip(page.messages, page.superseded) if not sup]
    return HistoryPageReply(rec.session_id, EncodedObject(b"[" + b",".join(raws) + b"]"), page.has_more,
                            page.next_before, page.total)


async def history_search(ctx: RequestContext, req: HistorySearch) -> HistorySearchReply:
    limit = check_limit(ctx, req.limit, DEFAULT_SEARCH_LIMIT)
    session_id = None
    if req.session_id is not None:
        session_id = (await target_session(ctx, req.session_id)).session_id
    hits = await ctx.services.store.search(ctx.user_id, req.query, session_id=session_id, limit=limit)
    return HistorySearchReply(tuple(hit_obj(h) for h in hits))


async def history_export(ctx: RequestContext, req: HistoryExport) -> HistoryExportReply:
    rec = await target_session(ctx, req.session_id)
    content = await ctx.services.store.export(rec.session_id, req.format)
    return HistoryExportReply(rec.session_id, req.format, content)
