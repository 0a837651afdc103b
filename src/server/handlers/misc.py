"""Ping, models (per session) and stats (docs/protocol.md §5.5-5.7)."""
from __future__ import annotations

import time
from protocol import ErrorCode
from protocol.messages import ModelList, ModelSwitch, Ping, Stats
from protocol.objects import ModelInfo
from protocol.replies import ModelListReply, ModelSwitchReply, Pong, StatsReply
from server.context import RequestContext
from server.errors import HandlerError
from server.handlers.common import agent_info, target_session
from server.timeutil import iso_now


def ping(ctx: RequestContext, req: Ping) -> Pong:
    """Answered inline (no task) with PONG."""
    return Pong(iso_now())


async def model_list(ctx: RequestContext, req: ModelList) -> ModelListReply:
    svc = ctx.services
    agent = svc.agent
    if req.session_id is None and ctx.session_id is None:   # no session yet: the next one's model
        current = agent.default_model
    else:
        current = svc.sessions.model_of(await target_session(ctx, req.session_id))
    return ModelListReply(tuple(ModelInfo(m, bool(agent.offline), m == agent.default_model) for m in agent.models()),
                          current)


async def model_switch(ctx: RequestContext, req: ModelSwitch) -> ModelSwitchReply:
    svc = ctx.services
    offered = svc.agent.models()
    if req.model not in offered:
        raise HandlerError(ErrorCode.UNKNOWN_MODEL,
                           f"model {req.model!r} is not offered (available: {', '.join(offered)})")
    rec = await target_session(ctx, req.session_id)
    rec = await svc.store.set_model(rec.session_id, req.model)
    await svc.sessions.publish_event("model", rec)
    return ModelSwitchReply(rec.session_id, req.model)


async def stats(ctx: RequestContext, req: Stats) -> StatsReply:
    svc = ctx.services
    n = svc.counters
    return StatsReply(round(time.monotonic() - n.started_monotonic, 3), len(svc.connections), svc.sessions_loaded(),
                      svc.runner.turns_total, svc.runner.turns_running, n.refusals.total, n.slow_consumers,
                      agent_info(ctx), svc.version)
