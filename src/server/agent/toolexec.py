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
#: replayed to the model in later turns; it used to be the bare string "interrupted")
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
    Cancelled (the turn was), every call announced and not finished yet (the ``running`` ToolCall
    the sink was given, which the turn runner stores with the partial answer) becomes an error with
    ``CANCELLED_RESULT`` before the cancel goes on.
    """
    pending = [registry.pending(r.name, r.arguments, r.id, step) for r in requests]
    finished: set[int] = set()     # (positions in ``pending``)
    try:
        return await _run(registry, sink, requests, pending, finished, ctx, step, timeout)
    except asyncio.CancelledError:
        for i, p in enumerate(pending):
            if i not in finished:
                p.status, p.result = "error", CANCELLED_RESULT
        raise


async def _run(registry: ToolRegistry, sink: TurnSink, requests: list[CallRequest], pending: list[ToolCall],
               finished: set[int], ctx: ToolContext, step: int, timeout: float | None) -> list[ToolCall]:
    cfg = registry.config
    await sink.status("tool_call", ", ".join(p.tool_name for p in pending))
    for p in pending:
        await sink.tool_call(p)
    running = asyncio.Semaphore(cfg.max_parallel_calls)

    async def one(i: int, p: ToolCall, req: CallRequest) -> ToolCall:
        async with running:
            done = await registry.run(req.name, req.arguments, ctx, call_id=p.id, step=step, timeout=timeout)
        done.timestamp = p.timestamp
        finished.add(i)
        await sink.tool_result(done)
        return done

    async def refused(i: int, p: ToolCall, error: str) -> ToolCall:
        p.status = "error"
        p.result = to_json({"error": error})
        finished.add(i)
        await sink.tool_result(p)
        return p

    too_many = (f"not run: this step asked for {len(requests)} tool calls and at most {cfg.max_calls_per_step} "
                "run per step (tools.max_calls_per_step); call it again in a later step if it is still needed")
    return list(await asyncio.gather(*(refused(i, p, r.error) if r.error is not None
                                       else one(i, p, r) if i < cfg.max_calls_per_step else refused(i, p, too_many)
                                       for i, (p, r) in enumerate(zip(pending, requests)))))
