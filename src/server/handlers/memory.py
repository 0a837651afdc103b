"""Long-term memory requests: list and forget the caller's own items (docs/protocol.md §5.10)."""
from __future__ import annotations

from dataclasses import replace

from protocol import ErrorCode
from protocol.messages import MemoryForget, MemoryList
from protocol.objects import MemoryItem
from protocol.replies import MemoryForgetReply, MemoryListReply
from server.context import RequestContext
from server.errors import HandlerError
from server.fit import fit_last_items
from server.wire import encode_reply


def _user_memory(ctx: RequestContext):      # server.memory.UserMemory, or None when turned off
    return getattr(ctx.services.memory, "user_memory", None)


async def memory_list(ctx: RequestContext, req: MemoryList) -> MemoryListReply:
    """Every item, oldest first; over ``max_message_size`` only the newest items that fit (the oldest
    are the first the store lets go), marked ``truncated`` (docs/protocol.md §3, "Size")."""
    um = _user_memory(ctx)
    if um is None:
        return MemoryListReply(False, ())
    items = await um.list(ctx.user_id)
    reply = MemoryListReply(True, tuple(MemoryItem(i.id, i.kind, i.text, i.session_id, i.message_id, i.created_at,
                                                   i.source) for i in items))
    n = fit_last_items(encode_reply(req.id, reply), "items", ctx.limits.max_message_size)
    return reply if n == len(reply.items) else replace(reply, items=reply.items[len(reply.items) - n:], truncated=True)


async def memory_forget(ctx: RequestContext, req: MemoryForget) -> MemoryForgetReply:
    um = _user_memory(ctx)
    if um is None:
        raise HandlerError(ErrorCode.UNSUPPORTED, "long-term memory is turned off on this server")
    if not await um.forget(ctx.user_id, req.item_id):
        raise HandlerError(ErrorCode.NOT_FOUND, f"no memory item {req.item_id!r}")
    return MemoryForgetReply(req.item_id)
