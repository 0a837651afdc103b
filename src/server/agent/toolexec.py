"""Running one step's tool calls through the registry with the sink events both agents emit."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from server.agent.base import TurnSink
from server.tools import ToolContext, ToolRegistry
from storage.models import ToolCall


@dataclass(slots=True)
class CallRequest:
    """A tool call as the model (or the offline intent parser) asked for it."""
    id: str | None
    name: str
    arguments: str | dict[str, Any]


async def run_tool_step(registry: ToolRegistry, sink: TurnSink, requests: list[CallRequest], ctx: ToolContext,
                        step: int, timeout: float | None = None) -> list[ToolCall]:
    """Announce every call (status, tool_call), run them concurrently, report each tool_result.

    Returns the finished ToolCalls in the order requested. Never raises for a tool failure.
    """
    pending = [registry.pending(r.name, r.arguments, r.id, step) for r in requests]
    await sink.status("tool_call", ", ".join(p.tool_name for p in pending))
    for p in pending:
        await sink.tool_call(p)

    async def one(p: ToolCall, req: CallRequest) -> ToolCall:
        done = await registry.run(req.name, req.arguments, ctx, call_id=p.id, step=step, timeout=timeout)
        done.timestamp = p.timestamp
        await sink.tool_result(done)
        return done

    return list(await asyncio.gather(*(one(p, r) for p, r in zip(pending, requests))))
