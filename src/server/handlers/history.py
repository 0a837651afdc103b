"""History requests (docs/protocol.md §5.3): page, search, export."""
from __future__ import annotations

from typing import Any

from protocol.messages import (DEFAULT_PAGE_LIMIT, DEFAULT_SEARCH_LIMIT, HistoryExport, HistoryPage,
                               HistorySearch)
from server.context import RequestContext
from server.handlers.common import check_limit, target_session


async def history_page(ctx: RequestContext, req: HistoryPage) -> dict[str, Any]:
    limit = check_limit(ctx, req.limit, DEFAULT_PAGE_LIMIT)
    rec = await target_session(ctx, req.session_id)
    page = await ctx.services.store.page(rec.session_id, before=req.before, limit=limit)
    return {"session_id": rec.session_id, "messages": [m.to_dict() for m in page.messages],
            "has_more": page.has_more, "next_before": page.next_before, "total": page.total}


async def history_search(ctx: RequestContext, req: HistorySearch) -> dict[str, Any]:
    limit = check_limit(ctx, req.limit, DEFAULT_SEARCH_LIMIT)
    session_id = None
    if req.session_id is not None:
        session_id = (await target_session(ctx, req.session_id)).session_id
    hits = await ctx.services.store.search(ctx.user_id, req.query, session_id=session_id, limit=limit)
    return {"hits": [h.to_dict() for h in hits]}


async def history_export(ctx: RequestContext, req: HistoryExport) -> dict[str, Any]:
    rec = await target_session(ctx, req.session_id)
    content = await ctx.services.store.export(rec.session_id, req.format)
    return {"session_id": rec.session_id, "format": req.format, "content": content}
