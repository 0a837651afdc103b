"""Knowledge-base requests (docs/protocol.md §5.8): upload begin/end, list, delete, search, passage,
download. The caller's collections come from its user and the user's groups (``[auth]``); every
access check is the knowledge base's (``server.knowledge``)."""
from __future__ import annotations

import asyncio
import re
from datetime import datetime

from protocol import ErrorCode, MsgType
from protocol.binary import MAX_DATA, data_frames
from protocol.kb import (KbDelete, KbDeleteReply, KbDocument, KbDocumentReply, KbDownload, KbDownloadReply, KbHit,
                         KbList, KbListReply, KbPassage, KbPassageReply, KbSearch, KbSearchReply, KbUploadBegin,
                         KbUploadEnd, KbUploadReply)
from server.context import RequestContext
from server.errors import HandlerError, failure_of
from server.fit import fit_items
from server.handlers.common import check_limit, fewer_hits
from server.knowledge.access import resolve
from server.knowledge.names import clean_name
from server.knowledge.models import DocumentInfo, Hit
from server.knowledge.parsers import kind_of
from server.wire import encode_reply

DOWNLOAD_BLOCK = 1 << 20       # read from disk (in a worker thread) this much at a time
_DOWNLOAD_DATA = MsgType.KB_DOWNLOAD_DATA


def principal(ctx: RequestContext) -> tuple[str, tuple[str, ...]]:
    """(user, groups) of the request's connection."""
    user = ctx.user_id
    return user, ctx.services.auth.groups_of(user)


def doc_obj(d: DocumentInfo) -> KbDocument:
    return KbDocument(d.doc_id, d.name, d.md5, d.sha256, d.size, d.chunks, d.collection, d.uploaded_at,
                      d.uploader, d.duplicate)


def hit_obj(h: Hit) -> KbHit:
    return KbHit(h.doc_id, h.name, h.chunk_id, h.text, h.score, h.location, h.collection, h.citation)


def _kb(ctx: RequestContext):
    kb = ctx.services.knowledge
    if kb is None:
        raise HandlerError(ErrorCode.UNSUPPORTED, "this server has no knowledge base")
    return kb


async def upload_begin(ctx: RequestContext, req: KbUploadBegin) -> KbUploadReply:
    kb = _kb(ctx)
    user, groups = principal(ctx)
    coll = resolve(user, groups, req.collection)
    name = clean_name(req.name)
    kind_of(name)
    cfg = kb.config
    if req.size == 0:
        raise HandlerError(ErrorCode.UNSUPPORTED_MEDIA, "empty file")
    if req.size > cfg.max_upload_bytes:
        raise HandlerError(ErrorCode.QUOTA_EXCEEDED,
                           f"file of {req.size} bytes over the upload limit ({cfg.max_upload_bytes}, max_upload_bytes)")
    # the quota counts the user's documents and their partial uploads (attached or not), by declared size
    return await ctx.services.uploads.begin(ctx.port, req.id, user, coll, name, req.size, req.md5, req.sha256,
                                            usage=lambda: kb.usage(user))


#: Error codes of a KB_UPLOAD_END's ingest that do not say anything about the upload itself (the
#: database unreachable, the server stopping): the received upload is kept for a resume (KB_UPLOAD_BEGIN
#: again answers offset = size, and KB_UPLOAD_END stores it), as when END's connection closes while it
#: waits. Any other failure is a refusal of the file (unsupported, over a quota, ...): it is removed.
KEEP_UPLOAD_ON = frozenset({ErrorCode.STORAGE_UNAVAILABLE, ErrorCode.SHUTTING_DOWN})


async def upload_end(ctx: RequestContext, req: KbUploadEnd) -> KbDocumentReply:
    """Store a complete upload. Stored or refused, its partial files are removed; when the ingest
    fails for a passing reason (``KEEP_UPLOAD_ON``), the upload is kept for a resume instead."""
    kb = _kb(ctx)
    uploads = ctx.services.uploads
    up = await uploads.finish(ctx.port, req.upload_id, kb.wait_for_ingest_slot)   # (waits for an ingest slot)
    user, groups = principal(ctx)
    try:
        info = await kb.ingest(user, groups, up.collection, up.name, up.part, md5=up.md5,
                               progress=uploads.progress(up, req.id))
    except BaseException as exc:
        err = failure_of(exc) if isinstance(exc, Exception) else None
        if err is not None and err.code in KEEP_UPLOAD_ON:
            uploads.keep(up)            # detached, counted, resumable
        else:
            await uploads.remove(up)
        raise
    await uploads.remove(up)
    return KbDocumentReply(doc_obj(info))


async def kb_list(ctx: RequestContext, req: KbList) -> KbListReply:
    """Newest first, paged by an opaque cursor ("<uploaded_at>|<doc_id>" of the page's last
    document): ``limit`` documents at most (every one without it), and never more than fit in one
    message (docs/protocol.md §3, "Size"): ``has_more`` and ``next_before`` say where the rest is."""
    user, groups = principal(ctx)
    limit = None if req.limit is None else check_limit(ctx, req.limit, req.limit)   # (over max_page_size: refused)
    docs = sorted(await _kb(ctx).list(user, groups, req.collection), key=_list_key, reverse=True)
    if req.before is not None:
        start = _parse_cursor(req.before)
        docs = [d for d in docs if _list_key(d) < start]
    page = docs[:limit]
    reply = KbListReply(tuple(doc_obj(d) for d in page))
    n = fit_items(encode_reply(req.id, reply), "documents", ctx.limits.max_message_size)
    if n == len(docs):                         # (the page is every document left)
        return reply
    last = page[n - 1]
    return KbListReply(reply.documents[:n], True, f"{last.uploaded_at}|{last.doc_id}")


def _list_key(d: DocumentInfo) -> tuple[str, str]:
    return d.uploaded_at, d.doc_id


_DOC_ID = re.compile(r"[0-9a-f]{24}")   # what server.knowledge.kb names a document (secrets.token_hex(12))


def _parse_cursor(cursor: str) -> tuple[str, str]:
    """(uploaded_at, doc_id) of a next_before cursor: an ISO 8601 time and a document id
    (``secrets.token_hex(12)``, server.knowledge.kb); anything else is INVALID_MESSAGE."""
    uploaded_at, sep, doc_id = cursor.rpartition("|")
    try:
        if not sep or not _DOC_ID.fullmatch(doc_id):
            raise ValueError(doc_id)
        datetime.fromisoformat(uploaded_at)
    except ValueError:
        raise HandlerError(ErrorCode.INVALID_MESSAGE, "field 'before': expected the next_before cursor of a "
                                                      f"KB_LIST reply, got {cursor[:80]!r}") from None
    return uploaded_at, doc_id


async def kb_delete(ctx: RequestContext, req: KbDelete) -> KbDeleteReply:
    user, groups = principal(ctx)
    kept = await _kb(ctx).delete(user, groups, req.doc_id, admin=ctx.services.auth.is_admin(user))
    return KbDeleteReply(req.doc_id, kept.uploader if kept is not None else None)


async def kb_search(ctx: RequestContext, req: KbSearch) -> KbSearchReply:
    user, groups = principal(ctx)
    hits = await _kb(ctx).search(user, groups, req.query, req.limit, collection=req.collection)
    return fewer_hits(ctx, req.id, KbSearchReply(tuple(hit_obj(h) for h in hits)))


async def kb_passage(ctx: RequestContext, req: KbPassage) -> KbPassageReply:
    user, groups = principal(ctx)
    return KbPassageReply(hit_obj(await _kb(ctx).get_passage(user, groups, req.chunk_id)))


async def kb_download(ctx: RequestContext, req: KbDownload) -> KbDownloadReply:
    """The bytes from ``offset`` as data frames, then the reply; waits while the client does not read."""
    user, groups = principal(ctx)
    info, f = await _kb(ctx).open_document(user, groups, req.doc_id, req.offset)
    port = ctx.port
    pos = req.offset
    block = max(MAX_DATA, min(DOWNLOAD_BLOCK, ctx.limits.max_output_buffer // 4))  # never near SLOW_CONSUMER
    try:
        while not port.closed:
            data = await asyncio.to_thread(f.read, block)
            if not data:
                break
            port.send_frames(data_frames(port.codec.send_raw, _DOWNLOAD_DATA, req.handle, pos, data))
            pos += len(data)
            await port.writable()
    finally:
        await asyncio.to_thread(f.close)
    return KbDownloadReply(doc_obj(info), req.offset, pos - req.offset)
