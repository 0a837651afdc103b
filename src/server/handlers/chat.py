"""Chat requests (docs/protocol.md §5.4): send (stored, then streamed as turn events) and cancel."""
from __future__ import annotations

from protocol import ErrorCode
from protocol.messages import ChatCancel, ChatSend
from protocol.replies import ChatCancelReply, ChatSendReply
from server.context import RequestContext
from server.errors import HandlerError
from server.handlers.common import target_session


async def chat_send(ctx: RequestContext, req: ChatSend) -> ChatSendReply:
    """The user message is stored (fsynced) before this reply when the session is idle: a storage
    failure answers STORAGE_ERROR and nothing is acknowledged."""
    cap = ctx.limits.max_text_chars
    if len(req.text) > cap:
        raise HandlerError(ErrorCode.INVALID_MESSAGE,
                           f"field 'text': expected at most {cap} characters, got {len(req.text)}")
    session_id = req.session_id or ctx.session_id
    if req.new_session or session_id is None:   # a session is created by its first message
        session_id = await _first_message_session(ctx)
    turn, ahead = await ctx.services.runner.submit(ctx.port, ctx.user_id, session_id, req.text, req.id)
    return ChatSendReply(turn.turn_id, turn.session_id, turn.user_message_obj(), ahead)


async def _first_message_session(ctx: RequestContext) -> str:
    """The session a first message goes to (``new_session``, or a connection without a session):
    the user's empty untitled session when there is one (this connection's own included) that has
    no system prompt or model of its own (one set up like that waits for its own first message),
    else a new one. The connection switches to it."""
    sessions = ctx.services.sessions
    rec = await sessions.empty_session(ctx.user_id)
    if rec is None or rec.system_prompt is not None or rec.model is not None:
        rec = await sessions.create(ctx.user_id)
        await sessions.publish_event("created", rec)
    ctx.attach(rec.session_id)
    return rec.session_id


async def chat_cancel(ctx: RequestContext, req: ChatCancel) -> ChatCancelReply:
    """Cancel the running turn of a session, or the turn ``turn_id`` (found in any of the user's
    sessions when no ``session_id`` is given; a queued one is withdrawn)."""
    runner = ctx.services.runner
    if req.turn_id is not None and req.session_id is None:
        turn = runner.find(req.turn_id)
        if turn is None or turn.user_id != ctx.user_id:
            return await _cancel_elsewhere(ctx, None, req.turn_id,
                                           HandlerError(ErrorCode.NO_ACTIVE_TURN, f"no active turn {req.turn_id!r}"))
        session_id = turn.session_id
    else:
        session_id = (await target_session(ctx, req.session_id)).session_id
    try:
        turn = runner.cancel(session_id, req.turn_id)
    except HandlerError as exc:
        if exc.code != ErrorCode.NO_ACTIVE_TURN:
            raise
        return await _cancel_elsewhere(ctx, session_id, req.turn_id, exc)
    return ChatCancelReply(turn.turn_id, True, turn.started_at is None)


async def _cancel_elsewhere(ctx: RequestContext, session_id: str | None, turn_id: str | None,
                            not_here: HandlerError) -> ChatCancelReply:
    """Cluster (PostgreSQL storage): the turn may run or wait on another node (server.cluster_cancel);
    ``not_here`` is raised when no node has it (at once when nothing runs in the session elsewhere)."""
    cluster = ctx.services.cluster
    if cluster is None or (turn_id is None and session_id not in cluster.remote_turns):
        raise not_here
    done = await cluster.remote_cancel.cancel_elsewhere(ctx.user_id, session_id, turn_id)
    if done is None:
        raise not_here
    return ChatCancelReply(done[0], True, done[1])
