"""Ping, models (per session) and stats (docs/protocol.md §5.5-5.7)."""
from __future__ import annotations

import time
from typing import Any

from protocol import ErrorCode
from protocol.messages import ModelList, ModelSwitch, Ping, Stats
from server.context import RequestContext
from server.errors import HandlerError
from server.handlers.common import agent_info, target_session
from server.timeutil import iso_now


def ping(ctx: RequestContext, req: Ping) -> dict[str, Any]:
    """Answered inline (no task) with PONG."""
    return {"time": iso_now()}


async def model_list(ctx: RequestContext, req: ModelList) -> dict[str, Any]:
    svc = ctx.services
    agent = svc.agent
    rec = await target_session(ctx, req.session_id)
    return {"models": [{"name": m, "offline": bool(agent.offline), "default": m == agent.default_model}
                       for m in agent.models()],
            "current": svc.sessions.model_of(rec)}


async def model_switch(ctx: RequestContext, req: ModelSwitch) -> dict[str, Any]:
    svc = ctx.services
    offered = svc.agent.models()
    if req.model not in offered:
        raise HandlerError(ErrorCode.UNKNOWN_MODEL,
                           f"model {req.model!r} is not offered (available: {', '.join(offered)})")
    rec = await target_session(ctx, req.session_id)
    rec = await svc.store.set_model(rec.session_id, req.model)
    await svc.sessions.publish_event("model", rec)
    return {"session_id": rec.session_id, "model": req.model}


async def stats(ctx: RequestContext, req: Stats) -> dict[str, Any]:
    svc = ctx.services
    n = svc.counters
    return {"uptime_s": round(time.monotonic() - n.started_monotonic, 3), "clients": len(svc.connections),
            "sessions_loaded": svc.sessions_loaded(), "turns_total": svc.runner.turns_total,
            "turns_running": svc.runner.turns_running, "refused_total": n.refusals.total,
            "slow_consumers_total": n.slow_consumers, "agent": agent_info(ctx), "version": svc.version}
