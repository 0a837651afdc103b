"""Ping, models (per session) and stats (docs/protocol.md §5.5-5.7)."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from protocol.messages import ModelList, ModelSwitch, Ping, Stats
from server.errors import HandlerError
from server.handlers.common import target_session
from server.handlers.hello import agent_info
from server.timeutil import iso_now

if TYPE_CHECKING:  # pragma: no cover
    from server.connection import ServerConnection


def ping(conn: ServerConnection, req: Ping) -> dict[str, Any]:
    """Answered inline (no task) with PONG."""
    return {"time": iso_now()}


async def model_list(conn: ServerConnection, req: ModelList) -> dict[str, Any]:
    agent = conn.server.agent
    rec = await target_session(conn, req.session_id)
    return {"models": [{"name": m, "offline": bool(agent.offline), "default": m == agent.default_model}
                       for m in agent.models()],
            "current": conn.server.sessions.model_of(rec)}


async def model_switch(conn: ServerConnection, req: ModelSwitch) -> dict[str, Any]:
    srv = conn.server
    offered = srv.agent.models()
    if req.model not in offered:
        raise HandlerError("UNKNOWN_MODEL", f"model {req.model!r} is not offered (available: {', '.join(offered)})")
    rec = await target_session(conn, req.session_id)
    rec = await srv.store.set_model(rec.session_id, req.model)
    await srv.sessions.publish_event("model", rec)
    return {"session_id": rec.session_id, "model": req.model}


async def stats(conn: ServerConnection, req: Stats) -> dict[str, Any]:
    srv = conn.server
    return {"uptime_s": round(time.monotonic() - srv.started_monotonic, 3), "clients": len(srv.connections),
            "sessions_loaded": srv.sessions_loaded(), "turns_total": srv.runner.turns_total,
            "turns_running": srv.runner.turns_running, "refused_total": srv.refusals.total,
            "slow_consumers_total": srv.slow_consumers, "agent": agent_info(conn), "version": srv.version}
