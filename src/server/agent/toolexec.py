"""Running one step's tool calls through the registry with the sink events both agents emit."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from server.agent.base import TurnSink
from server.tools import ToolContext, ToolRegistry
from server.tools.units import to_json
from storage.models import ToolCall

#: the result of a call a cancel stopped before it finished (JSON, like every tool result: it is
#: replayed to the model in later turns; it used to be the bare string "interrupted"). The turn runner
#: gives it to every call still running when the turn ends cancelled (``Turn.finished_calls``): the
#: ToolCall the sink was handed here is the one it stores.
CANCELLED_RESULT = to_json({"error": "not finished: the turn was cancelled"})


@dataclass(slots=True)
class CallRequest:
    """A tool call as the model (or the offline intent parser) asked for it; with ``error`` it is
    refused before it runs (e.g. a name over ``[llm] max_tool_name_chars``) and gets that error."""
    id: str | None
    name: str
    arguments: str | dict[str, Any]
    error: str | None = None


async def run_tool_step(registry: ToolRegistry, sink: TurnSink, requests: list[CallRequest], ctx: ToolContext,
                        step: int, timeout: float | None = None) -> list[ToolCall]:
    """Announce every call (status, tool_call), run them concurrently, report each tool_result.

    At most ``tools.max_calls_per_step`` calls run, ``tools.max_parallel_calls`` at a time (so one turn
    cannot take every worker thread); each call beyond the first ``max_calls_per_step`` is not run and
    gets an error result saying so (every call still gets its result), as does a request with an
    ``error``. Returns the finished ToolCalls in the order requested. Never raises for a tool failure.
    """
    cfg = registry.config
    pending = [registry.pending(r.name, r.arguments, r.id, step) for r in requests]
    await sink.status("tool_call", ", ".join(p.tool_name for p in pending))
    for p in pending:
        await sink.tool_call(p)
    running = asyncio.Semaphore(cfg.max_parallel_calls)

    async def one(p: ToolCall, req: CallRequest) -> ToolCall:
        async with running:
            done = await registry.run(req.name, req.arguments, ctx, call_id=p.id, step=step, timeout=timeout)
        done.timestamp = p.timestamp
        await sink.tool_result(done)
        return done

    async def refused(p: ToolCall, error: str) -> ToolCall:
        p.status = "error"
        p.result = to_json({"error": error})
        await sink.tool_result(p)
        return p

    too_many = (f"not run: this step asked for {len(requests)} tool calls and at most {cfg.max_calls_per_step} "
                "run per step (tools.max_calls_per_step); call it again in a later step if it is still needed")
    return list(await asyncio.gather(*(refused(p, r.error) if r.error is not None
                                       else one(p, r) if i < cfg.max_calls_per_step else refused(p, too_many)
                                       for i, (p, r) in enumerate(zip(pending, requests)))))
