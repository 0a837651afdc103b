"""Helpers shared by the handlers: the current-or-given session, page-size checks, search replies
that fit, a running turn."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

from protocol import ErrorCode
from protocol.fields import Addressed
from protocol.objects import AgentInfo, TurnState
from server.context import RequestContext
from server.errors import HandlerError
from server.fit import fit_items
from server.wire import encode_reply
from storage.models import SessionRecord

R = TypeVar("R", bound=Addressed)


async def target_session(ctx: RequestContext, session_id: str | None) -> SessionRecord:
    """The given session (or the connection's current one), checked to belong to the user."""
    session_id = session_id or ctx.session_id
    if session_id is None:   # HELLO of a user without sessions: none until the first message
        raise HandlerError(ErrorCode.NOT_FOUND, "no current session: send a message (it creates one) "
                                                "or SESSION_NEW first")
    return await ctx.services.sessions.owned(ctx.user_id, session_id)


def fewer_hits(ctx: RequestContext, rid: Any, reply: R) -> R:
    """A search reply (``hits``, best first) whose JSON is over ``max_message_size`` holds only the
    best hits that fit, marked ``truncated`` (docs/protocol.md §3, "Size")."""
    hits = reply.hits  # type: ignore[attr-defined]
    n = fit_items(encode_reply(rid, reply), "hits", ctx.limits.max_message_size)
    return reply if n == len(hits) else replace(reply, hits=hits[:n], truncated=True)


def check_limit(ctx: RequestContext, limit: int | None, default: int) -> int:
    """The page size: ``default`` when absent (never over ``max_page_size``), else at most that."""
    cap = ctx.limits.max_page_size
    if limit is None:
        return min(default, cap)
    if limit > cap:
        raise HandlerError(ErrorCode.INVALID_MESSAGE, f"field 'limit': expected an integer in 1..{cap}, got {limit}")
    return limit


async def running_turn(ctx: RequestContext, session_id: str) -> TurnState | None:
    """The session's running turn for a reattaching reply: this node's, else (several nodes on
    PostgreSQL) the state the node that runs it sends back (``server.cluster_state``)."""
    svc = ctx.services
    state = svc.runner.running_state(session_id)
    if state is None and svc.cluster is not None and session_id in svc.cluster.remote_turns:
        ctx.port.hold_events()      # what arrives meanwhile follows the reply (the client drops by
        state = await svc.cluster.remote_state.state_elsewhere(session_id)   # offset what it holds)
    return state


def agent_info(ctx: RequestContext) -> AgentInfo:
    agent = ctx.services.agent
    return AgentInfo(agent.name, bool(agent.offline), agent.default_model)
