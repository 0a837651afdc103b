"""Regenerate and edit (docs/protocol.md §5.4, docs/server.md "Regenerate and edit").

Nothing is rewritten or removed: the messages being replaced are kept, marked
``metadata.superseded``, and left out of the model's context and of default history pages. Both run
only in an idle session (a running or queued turn: QUEUE_FULL), under the session's lane lock, so
no other turn can slip in between the marking and the new turn.
"""
from __future__ import annotations

from dataclasses import replace

from protocol import ErrorCode
from protocol.messages import ChatEdit, ChatRegenerate
from protocol.replies import ChatRedoReply
from server.context import RequestContext
from server.errors import HandlerError
from server.handlers.common import target_session
from server.sessions import auto_title
from storage.models import ChatMessage, SessionRecord, now_iso

PAGE = 200          # messages read per step while walking back from the newest


async def _tail_from(store, session_id: str, stop) -> list[ChatMessage]:
    """The live (not superseded) messages from the newest back to the first one for which
    ``stop(m)`` is true, ascending, that one first; [] when none matches."""
    out: list[ChatMessage] = []
    before = None
    while True:
        page = await store.page(session_id, before=before, limit=PAGE)
        for m in reversed(page.messages):
            if m.metadata.get("superseded"):
                continue
            out.append(m)
            if stop(m):
                out.reverse()
                return out
        if not page.has_more:
            return []
        before = page.next_before


async def _supersede(store, session_id: str, msgs: list[ChatMessage]) -> tuple[int, ...]:
    at = now_iso()
    for m in msgs:
        await store.update(session_id, replace(m, metadata={**m.metadata, "superseded": True, "superseded_at": at}))
    return tuple(m.id for m in msgs)


async def chat_regenerate(ctx: RequestContext, req: ChatRegenerate) -> ChatRedoReply:
    """Answer the last user message again; the answers after it are superseded (a summary covering
    them is taken back first, as for an edit)."""
    svc = ctx.services
    rec = await target_session(ctx, req.session_id)
    done: list[tuple[int, ...]] = []

    async def prepare(rec: SessionRecord) -> ChatMessage:
        tail = await _tail_from(svc.store, rec.session_id, lambda m: m.role == "user")
        if not tail:
            raise HandlerError(ErrorCode.INVALID_MESSAGE, "there is no message to answer again in this session")
        await svc.sessions.before_supersede(rec.session_id, rec.user_id, tail[1:])
        done.append(await _supersede(svc.store, rec.session_id, tail[1:]))
        svc.sessions.forget(rec.session_id)
        return tail[0]

    turn, _ = await svc.runner.submit(ctx.port, ctx.user_id, rec.session_id, "", req.id, prepare=prepare)
    return ChatRedoReply(turn.turn_id, turn.session_id, turn.user_message_obj(), done[0])


async def chat_edit(ctx: RequestContext, req: ChatEdit) -> ChatRedoReply:
    """Replace user message ``message_id`` by ``text`` and answer it: that message and everything
    after it are superseded, the new one is stored with ``metadata.edited_from``. What the memory
    layer made of the superseded messages is taken back first (``SessionService.before_supersede``),
    and an automatic title made from the edited message is made again from the new text."""
    svc = ctx.services
    cap = ctx.limits.max_text_chars
    if len(req.text) > cap:
        raise HandlerError(ErrorCode.INVALID_MESSAGE,
                           f"field 'text': expected at most {cap} characters, got {len(req.text)}")
    rec = await target_session(ctx, req.session_id)
    done: list[tuple[int, ...]] = []

    async def prepare(rec: SessionRecord) -> ChatMessage:
        tail = await _tail_from(svc.store, rec.session_id, lambda m: m.id <= req.message_id)
        if not tail or tail[0].id != req.message_id or tail[0].role != "user":
            raise HandlerError(ErrorCode.NOT_FOUND, f"no user message {req.message_id} to edit in this session "
                               "(it must be visible and not already replaced)")
        await svc.sessions.before_supersede(rec.session_id, rec.user_id, tail)
        done.append(await _supersede(svc.store, rec.session_id, tail))
        svc.sessions.forget(rec.session_id)
        if rec.title_auto and rec.title == auto_title(tail[0].content):   # the title was made from it
            await svc.store.rename(rec.session_id, auto_title(req.text), auto=True)
        return await svc.store.append(rec.session_id, "user", req.text, metadata={"edited_from": req.message_id})

    turn, _ = await svc.runner.submit(ctx.port, ctx.user_id, rec.session_id, req.text, req.id, prepare=prepare)
    return ChatRedoReply(turn.turn_id, turn.session_id, turn.user_message_obj(), done[0])
