"""Shared fixtures for agent tests: a recording TurnSink, requests, and a scripted LLM server."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import pytest

from server.agent.base import BuiltContext, TurnRequest
from server.agent.config import AgentConfig, LLMConfig
from server.agent.openai_agent import OpenAIAgent
from server.tools import ToolRegistry, ToolsConfig
from storage.models import ChatMessage, ToolCall
from testkit.scripted_llm import ScriptedLLM

API_KEY = "sk-test-0123456789abcdef"


class RecordingSink:
    """A TurnSink that records every event in order; tests can wait for a condition on it."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.details: list[tuple[str, str | None]] = []   # every status with its detail
        self._changed = asyncio.Condition()

    async def _record(self, kind: str, payload: Any) -> None:
        async with self._changed:
            self.events.append((kind, payload))
            self._changed.notify_all()

    async def status(self, status: str, detail: str | None = None) -> None:
        self.details.append((status, detail))
        await self._record("status", status)

    async def tool_call(self, call: ToolCall) -> None:
        await self._record("tool_call", ToolCall.from_dict(call.to_dict()))

    async def tool_result(self, call: ToolCall) -> None:
        await self._record("tool_result", ToolCall.from_dict(call.to_dict()))

    async def delta(self, text: str) -> None:
        await self._record("delta", text)

    async def notice(self, level: str, code: str, message: str) -> None:
        await self._record("notice", (level, code, message))

    def of(self, kind: str) -> list[Any]:
        return [p for k, p in self.events if k == kind]

    @property
    def text(self) -> str:
        return "".join(self.of("delta"))

    @property
    def kinds(self) -> list[str]:
        return [k if k != "status" else f"status:{p}" for k, p in self.events]

    async def wait_for(self, predicate, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(lambda: predicate(self))


def make_request(text: str, context: list[dict[str, Any]] | None = None, model: str = "scripted-model",
                 user_id: str = "alice", session_id: str = "s_test") -> TurnRequest:
    messages = context if context is not None else [{"role": "system", "content": "sys"},
                                                    {"role": "user", "content": text}]
    return TurnRequest(session_id=session_id, user_id=user_id, model=model, turn_id="t_1",
                       user_message=ChatMessage(id=1, role="user", content=text),
                       context=BuiltContext(messages=messages, metadata={}))


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()


@pytest.fixture
async def llm() -> AsyncIterator[ScriptedLLM]:
    async with ScriptedLLM() as server:
        yield server


@pytest.fixture
def registry() -> ToolRegistry:
    return ToolRegistry(ToolsConfig(cpu_sample_s=0.05))


def llm_config(base_url: str, **overrides: Any) -> LLMConfig:
    d: dict[str, Any] = {"base_url": base_url, "model": "scripted-model", "request_timeout_s": 5.0,
                         "retries": 2, "retry_backoff_s": 0.01, "retry_max_delay_s": 2.0}
    d.update(overrides)
    return LLMConfig.from_dict(d, env={"NPLT_LLM_API_KEY": API_KEY})


@pytest.fixture
async def make_agent(llm: ScriptedLLM, registry: ToolRegistry):
    agents: list[OpenAIAgent] = []

    def factory(agent_cfg: AgentConfig | None = None, tools: ToolRegistry | None = None, **llm_overrides: Any):
        agent = OpenAIAgent(llm_config(llm.base_url, **llm_overrides), agent_cfg or AgentConfig(),
                            tools or registry)
        agents.append(agent)
        return agent

    yield factory
    for a in agents:
        await a.aclose()
