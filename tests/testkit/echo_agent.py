"""EchoAgent: a deterministic server.agent.base.Agent for server tests and benchmarks.

It answers ``echo: <text>`` streamed in ``chunks`` deltas. Commands at the start of the user text:

- ``!tool ...``   call a fake tool (TOOL_CALL then TOOL_RESULT) before answering
- ``!block ...``  stream the first half, then wait until ``release()`` (cancel / disconnect tests)
- ``!fail ...``   stream the first half, then raise AgentError("LLM_ERROR")
- ``!failnow``    raise AgentError("LLM_TIMEOUT") before streaming anything
- ``!big N``      answer N characters ("x" * N) in 1000-character deltas
- ``!tokens N``   answer N deltas of "tok " (throughput benchmarks)
"""
from __future__ import annotations

import asyncio
from typing import Any

from protocol import ErrorCode
from server.agent.base import AgentError, TurnRequest, TurnResult, TurnSink
from storage.models import ToolCall


class EchoAgent:
    name = "echo"
    offline = True
    default_model = "echo"

    def __init__(self, *, chunks: int = 3, models: tuple[str, ...] = ("echo", "echo-large")) -> None:
        self.chunks = max(1, chunks)
        self._models = list(models)
        self.requests: list[TurnRequest] = []
        self.blocked = 0                 # turns currently waiting in "!block"
        self.started = 0                 # turns whose run_turn began
        self.completions = 0
        self.closed = False
        self._gate = asyncio.Event()
        self._changed = asyncio.Condition()

    def models(self) -> list[str]:
        return list(self._models)

    def release(self) -> None:
        """Let every blocked turn (and every later "!block" turn) finish."""
        self._gate.set()

    async def wait_blocked(self, n: int = 1, timeout: float = 10.0) -> None:
        """Wait until at least ``n`` turns are blocked."""
        await self._wait(lambda: self.blocked >= n, timeout)

    async def wait_started(self, n: int, timeout: float = 10.0) -> None:
        await self._wait(lambda: self.started >= n, timeout)

    async def _wait(self, pred: Any, timeout: float) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(pred), timeout)

    async def _bump(self, attr: str, delta: int) -> None:
        async with self._changed:
            setattr(self, attr, getattr(self, attr) + delta)
            self._changed.notify_all()

    async def run_turn(self, req: TurnRequest, sink: TurnSink) -> TurnResult:
        self.requests.append(req)
        await self._bump("started", 1)
        text = req.user_message.content
        calls: list[ToolCall] = []
        await sink.status("thinking")
        if text.startswith("!failnow"):
            raise AgentError(ErrorCode.LLM_TIMEOUT, "scripted timeout before any output")
        if text.startswith("!tool"):
            call = ToolCall(id=f"call_{len(self.requests)}", tool_name="fake_tool", arguments={"q": text[5:].strip()},
                            status="running")
            await sink.status("tool_call", "fake_tool")
            await sink.tool_call(call)
            done = ToolCall(id=call.id, tool_name=call.tool_name, arguments=call.arguments, result="42",
                            status="success", duration=0.001, timestamp=call.timestamp)
            await sink.tool_result(done)
            calls.append(done)
        await sink.status("generating")
        if text.startswith("!big") or text.startswith("!tokens"):
            n = int(text.split()[1])
            piece, count = ("x" * 1000, -(-n // 1000)) if text.startswith("!big") else ("tok ", n)
            answer_parts = []
            for i in range(count):
                p = piece if not text.startswith("!big") else piece[: min(1000, n - i * 1000)]
                answer_parts.append(p)
                await sink.delta(p)
            self.completions += 1
            return TurnResult("".join(answer_parts), calls, {"completion_tokens": count}, "stop", {})
        answer = f"echo: {text}"
        size = -(-len(answer) // self.chunks)
        parts = [answer[i:i + size] for i in range(0, len(answer), size)]
        half = max(1, len(parts) // 2)
        for p in parts[:half]:
            await sink.delta(p)
        if text.startswith("!block"):
            await self._bump("blocked", 1)
            try:
                await self._gate.wait()
            finally:
                self.blocked -= 1
        if text.startswith("!fail"):
            raise AgentError(ErrorCode.LLM_ERROR, "scripted failure after partial output")
        for p in parts[half:]:
            await sink.delta(p)
        self.completions += 1
        usage = {"prompt_tokens": len(text.split()), "completion_tokens": len(answer.split()),
                 "total_tokens": len(text.split()) + len(answer.split())}
        return TurnResult(answer, calls, usage, "stop", {"agent": "echo"})

    async def complete(self, messages: list[dict[str, Any]], model: str | None = None) -> str:
        return "summary: " + " | ".join(str(m.get("content", ""))[:40] for m in messages[-4:])

    async def aclose(self) -> None:
        self.closed = True
