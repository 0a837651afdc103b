"""History requests (docs/protocol.md §5.3): page, search, export."""
from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, Awaitable, Callable, Protocol, TypeVar

import orjson

from protocol import ErrorCode
from protocol.messages import (DEFAULT_PAGE_LIMIT, DEFAULT_SEARCH_LIMIT, HistoryExport, HistoryPage,
                               HistorySearch)
from protocol.objects import EncodedObject
from protocol.replies import HistoryExportReply, HistoryPageReply, HistorySearchReply
from server.context import RequestContext
from server.errors import HandlerError
from server.handlers.common import check_limit, fewer_hits, target_session
from server.output import total_unsent
from server.wire import encode_reply, hit_obj
from storage.export import ExportTooLarge
from storage.models import EncodedPage, Page


class _Paged(Protocol):
    has_more: bool
    next_before: int | None


P = TypeVar("P", bound=_Paged)


#: pages of only superseded messages skipped to reach a visible one (then an empty page, has_more true)
MAX_PAGES_SKIPPED = 100


async def history_page(ctx: RequestContext, req: HistoryPage) -> HistoryPageReply:
    limit = check_limit(ctx, req.limit, DEFAULT_PAGE_LIMIT)
    rec = await target_session(ctx, req.session_id)
    # Each message comes as its JSON bytes, encoded once per stored message and cached by the
    # store: the reply splices them (no ChatMessage objects, no re-encoding per page).
    store = ctx.services.store
    page = await skip_superseded(lambda before: store.page_encoded(rec.session_id, before=before, limit=limit),
                                 req.before, lambda page: bool(_visible(req, page)))
    return _page_reply(rec.session_id, req, page)


async def skip_superseded(fetch: Callable[[int | None], Awaitable[P]], before: int | None,
                          visible: Callable[[P], bool]) -> P:
    """The page ``fetch(before)`` gives, or, when it holds no ``visible`` message (superseded ones
    only) and more are left, the next older one, and so on: at most ``MAX_PAGES_SKIPPED`` pages are
    paged past (then that last page is returned, empty of visible messages, ``has_more`` true).
    Shared by v3 pages and v2 ``HISTORY_REQUEST`` (``server.legacy_v2``)."""
    for _ in range(MAX_PAGES_SKIPPED + 1):
        page = await fetch(before)
        if visible(page) or not page.has_more:
            break
        before = page.next_before       # a page of superseded messages only: the next one is asked
    return page


async def visible_page(store: Any, session_id: str, before: int | None, limit: int) -> Page:
    """A history page of ChatMessages as a default v3 page holds them: messages superseded by a
    regenerate or an edit left out, stretches of them paged past (``skip_superseded``);
    ``has_more``, ``next_before`` and ``total`` still count every message."""
    page: Page = await skip_superseded(lambda b: store.page(session_id, before=b, limit=limit), before,
                                       lambda p: any(not is_superseded(m) for m in p.messages))
    if any(is_superseded(m) for m in page.messages):
        page = replace(page, messages=[m for m in page.messages if not is_superseded(m)])
    return page


def is_superseded(m: Any) -> bool:
    """Whether a stored message was replaced by a regenerate or an edit (``metadata.superseded``)."""
    return bool((m.metadata or {}).get("superseded"))


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


#: How long (seconds) an export waits for one of the ``max_concurrent_exports`` slots before it is
#: refused SERVER_BUSY (not fatal; retry later) instead of waiting without a reply (review s33: two
#: clients that never read held both slots and a third export got no answer at all). Above
#: ``server.output.SLOW_CONSUMER_STALL_S`` (6 s, after which a slot held by a client that stopped
#: reading comes back) plus the building of a large export; below a person's patience. A slot can
#: still be held longer by a client reading a large reply slowly (8 MB at 200 KB/s: 40 s).
EXPORT_SLOT_WAIT_S = 30.0


async def history_export(ctx: RequestContext, req: HistoryExport) -> HistoryExportReply:
    """The whole session as one reply. It is built in a worker thread, at most
    ``max_concurrent_exports`` at once server-wide (``ExportSlots``), and refused with
    MESSAGE_TOO_LARGE as soon as the part built is over ``max_message_size``: a session too large to
    send costs about ``max_message_size`` of work and memory, not its whole size. A slot is held
    until the reply has left the server (or its connection is gone), not only while it is built:
    clients that do not read cannot make the server hold more than ``max_concurrent_exports``
    replies (one that stops reading is dropped ``SLOW_CONSUMER_STALL_S`` later, ``server.output``,
    which gives the slot back). Refused SERVER_BUSY while the unsent output of all connections is
    over ``max_total_output_buffer``, or when no slot came free within ``EXPORT_SLOT_WAIT_S``."""
    rec = await target_session(ctx, req.session_id)
    # the header names the model SESSION_INFO shows (a session on the default model stores none)
    model = ctx.services.sessions.model_of(rec)
    limit = ctx.limits.max_message_size
    # what the reply takes besides the text (the text's quotes included): the rest is the text's room
    overhead = len(orjson.dumps(encode_reply(req.id, HistoryExportReply(rec.session_id, req.format, ""))))
    slots = export_slots(ctx.services)
    _check_output_room(ctx)
    if not await slots.acquire(EXPORT_SLOT_WAIT_S):
        raise HandlerError(ErrorCode.SERVER_BUSY,
                           f"all {slots.limit} export slots (max_concurrent_exports) stayed busy for "
                           f"{EXPORT_SLOT_WAIT_S:g} s: export not built; try again later")
    if getattr(ctx.port, "closed", False):      # the client left while this export waited: not built
        slots.release()
        raise HandlerError(ErrorCode.CONNECTION_CLOSED, "the connection closed before the export was built")
    try:
        _check_output_room(ctx)                 # (it may have waited long for its slot)
    except HandlerError:
        slots.release()
        raise
    build = asyncio.ensure_future(ctx.services.store.export(rec.session_id, req.format, model,
                                                            max_bytes=limit - overhead))
    build.add_done_callback(_retrieved)
    try:
        content = await asyncio.shield(build)
    except asyncio.CancelledError:
        # the request is gone (its client left): the build runs on in its worker thread and keeps
        # the slot until it ends
        if build.done():
            slots.release()
        else:
            build.add_done_callback(lambda _b: slots.release())
        raise
    except ExportTooLarge as exc:
        slots.release()
        refused = _too_large(rec.session_id, exc, overhead, limit)
    except BaseException:
        slots.release()
        raise
    else:
        # the slot is given back once the reply, queued right after this returns, has left
        when_drained = getattr(ctx.port, "when_drained", None)
        if when_drained is None:
            slots.release()
        else:
            when_drained(slots.release)
        return HistoryExportReply(rec.session_id, req.format, content)
    raise HandlerError(ErrorCode.MESSAGE_TOO_LARGE, refused)     # (outside the except: no chained error kept)


def _check_output_room(ctx: RequestContext) -> None:
    """SERVER_BUSY while the output not yet taken by the clients (all connections) is over
    ``max_total_output_buffer``: an export adds up to ``max_message_size`` to it."""
    cap = ctx.limits.max_total_output_buffer
    unsent = total_unsent(ctx.services.connections)
    if unsent > cap:
        raise HandlerError(ErrorCode.SERVER_BUSY,
                           f"the server holds {unsent} bytes of output its clients have not read yet, over "
                           f"max_total_output_buffer ({cap} bytes): export not built; try again later")


def _retrieved(build: asyncio.Future) -> None:
    """A build's outcome is read here too, so one whose request is gone is not reported as never
    retrieved."""
    if not build.cancelled():
        build.exception()


def _too_large(session_id: str, exc: ExportTooLarge, overhead: int, limit: int) -> str:
    of = f" of {exc.total}" if exc.total is not None else ""
    return (f"the {exc.fmt} export of session {session_id} is over max_message_size ({limit} bytes): "
            f"{exc.size + overhead} bytes so far, after {exc.done}{of} messages, so it was not built "
            "further. A session this large cannot be exported in one reply (there is no partial export): "
            "read it page by page (HISTORY_REQUEST; 'history --before' in the CLI: a message too large for one reply "
            "comes cut there, marked truncated), or ask the operator "
            "to raise [limits] max_message_size")


class ExportSlots:
    """At most ``limit`` exports built or being sent at once, server-wide (``[limits]
    max_concurrent_exports``): each holds up to ``max_message_size`` while it is built and until its
    reply has left the server, and keeps a worker busy while it is built, so many at once would
    multiply that and starve other requests. More wait their turn (first come, first served), for a
    bounded time (``acquire``'s timeout: ``EXPORT_SLOT_WAIT_S``); a waiting request counts against
    its connection's ``max_pending_requests`` like any other."""

    __slots__ = ("limit", "building", "waiting", "_sem")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.building = 0            # slots taken: exports being built, or their replies being sent
        self.waiting = 0             # exports waiting for a slot
        self._sem = asyncio.Semaphore(limit)

    async def acquire(self, timeout: float | None = None) -> bool:
        """Wait for a slot, at most ``timeout`` seconds (None: without end); True once taken,
        False when none came free in time. A cancelled or timed-out wait takes none (a slot handed
        to it as it gave up goes to the next waiter); ``release`` gives a taken one back."""
        self.waiting += 1
        try:
            async with asyncio.timeout(timeout):
                await self._sem.acquire()
        except asyncio.TimeoutError:
            return False
        finally:
            self.waiting -= 1
        self.building += 1
        return True

    def release(self) -> None:
        self.building -= 1
        self._sem.release()


def export_slots(services: Any) -> ExportSlots:
    """The server's ExportSlots (``Services.exports``, made on first use)."""
    if services.exports is None:
        services.exports = ExportSlots(services.limits.max_concurrent_exports)
    return services.exports
