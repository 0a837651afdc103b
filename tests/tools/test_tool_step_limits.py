"""Bounds on one step's tool calls, the result cap and the unknown-tool message.

- A model asking for hundreds of parallel calls in one step had them all run at once on the shared
  worker threads (review p4: another user's single call waited 7-9 s). At most
  ``tools.max_calls_per_step`` run, ``tools.max_parallel_calls`` at a time; the others get an error
  result, so every tool call id still gets its tool message, in order.
- ``max_result_chars`` was exceeded: the cut JSON text was encoded again as a string (quotes doubled,
  4000 -> 5094 characters, review p9).
- "unknown tool" listed tools the user was not offered (search_knowledge without documents).
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson
import pytest

from server.agent.base import BuiltContext, TurnRequest
from server.agent.config import AgentConfig, LLMConfig
from server.agent.openai_agent import OpenAIAgent
from server.agent.toolexec import CallRequest, run_tool_step
from server.tools import ToolContext, ToolRegistry, ToolsConfig
from server.tools.units import fit_json, to_json
from storage.models import ChatMessage, ToolCall
from testkit.scripted_llm import Reply, ScriptedLLM, ToolCallSpec
from testkit.server import poll

CTX = ToolContext("alice", "s_1")


class Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    async def status(self, status: str, detail: str | None = None) -> None:
        self.events.append(("status", status))

    async def tool_call(self, call: ToolCall) -> None:
        self.events.append(("tool_call", call.id))

    async def tool_result(self, call: ToolCall) -> None:
        self.events.append(("tool_result", (call.id, call.status)))

    async def delta(self, text: str) -> None:
        self.events.append(("delta", text))

    async def notice(self, level: str, code: str, message: str) -> None:
        self.events.append(("notice", code))

    def of(self, kind: str) -> list[Any]:
        return [p for k, p in self.events if k == kind]


async def test_calls_beyond_the_step_limit_are_not_run_and_say_why():
    tools = ToolRegistry(ToolsConfig(max_calls_per_step=3))
    sink = Sink()
    requests = [CallRequest(f"c{i}", "clock", {}) for i in range(7)]
    done = await run_tool_step(tools, sink, requests, CTX, step=0)
    assert [d.id for d in done] == [f"c{i}" for i in range(7)]            # every call, in the order asked
    assert [d.status for d in done] == ["success"] * 3 + ["error"] * 4
    error = orjson.loads(done[-1].result)["error"]
    assert "7 tool calls" in error and "at most 3" in error and "tools.max_calls_per_step" in error
    assert sink.of("tool_call") == [f"c{i}" for i in range(7)]
    assert sorted(sink.of("tool_result")) == sorted((d.id, d.status) for d in done)


async def test_one_step_runs_at_most_max_parallel_calls_at_once():
    tools = ToolRegistry(ToolsConfig(max_parallel_calls=2))
    release, running, peak = asyncio.Event(), [0], [0]

    async def blocking(args: dict[str, Any], ctx: ToolContext) -> Any:
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await release.wait()
        running[0] -= 1
        return {"ok": True}

    tools._tools["clock"].handler = blocking
    step = asyncio.create_task(run_tool_step(tools, Sink(), [CallRequest(f"c{i}", "clock", {}) for i in range(6)],
                                             CTX, step=0))
    await poll(lambda: running[0] == 2, what="two calls running")
    assert peak[0] == 2                     # (without the bound all six start before any ends: peak 6 below)
    release.set()
    done = await step
    assert [d.id for d in done] == [f"c{i}" for i in range(6)] and {d.status for d in done} == {"success"}
    assert peak[0] == 2


async def test_a_flood_of_calls_keeps_the_tool_pairs_on_the_wire():
    """The model (a real HTTP endpoint on loopback) asks for 20 calls in one step: the next request
    carries 20 tool messages, one per id, in order; 16 ran, 4 say they were not run."""
    async with ScriptedLLM() as llm:
        llm.push(Reply.tools(*[ToolCallSpec(f"call_{i}", "clock", "{}") for i in range(20)]), Reply.text("done"))
        cfg = LLMConfig.from_dict({"base_url": llm.base_url, "model": "scripted-model", "retries": 0},
                                  env={"NPLT_LLM_API_KEY": "sk-test-0123456789abcdef"})
        agent = OpenAIAgent(cfg, AgentConfig(), ToolRegistry(ToolsConfig()))
        try:
            req = TurnRequest(session_id="s_1", user_id="alice", model="scripted-model", turn_id="t_1",
                              user_message=ChatMessage(id=1, role="user", content="flood"),
                              context=BuiltContext(messages=[{"role": "user", "content": "flood"}], metadata={}))
            result = await agent.run_turn(req, Sink())
        finally:
            await agent.aclose()
        assert result.content == "done"
        sent = [m for m in llm.requests[-1].body["messages"] if m["role"] == "tool"]
        assert [m["tool_call_id"] for m in sent] == [f"call_{i}" for i in range(20)]
        errors = ["max_calls_per_step" in json.loads(m["content"]).get("error", "") for m in sent]
        assert errors == [False] * 16 + [True] * 4


async def test_a_capped_result_fits_and_is_not_encoded_twice():
    async def search(user_id, query, session_id=None, k=5):
        return [{"snippet": '"port" "value" ' * 20, "title": f'"t{i}"'} for i in range(k)]

    tools = ToolRegistry(ToolsConfig(max_result_chars=1000), search=search)
    call = await tools.run("history_search", {"query": "port", "limit": 20}, CTX)
    assert call.status == "success" and len(call.result) <= 1000
    data = orjson.loads(call.result)
    assert data["truncated"] is True and data["cut"]["max_result_chars"] == 1000 and "partial" not in data
    assert data["query"] == "port" and data["hits"]                           # the structure is kept
    assert data["hits"][0]["snippet"].startswith('"port" "value"') and data["hits"][0]["snippet"].endswith("…")
    assert data["cut"]["texts_cut_to"] >= 64 and 0 < data["cut"]["lists_cut_to"] < 20
    assert '\\\\"' not in call.result                                          # quotes escaped once, not twice


async def test_a_capped_result_cuts_texts_first():
    async def search(user_id, query, session_id=None, k=5):
        return [{"snippet": '"port" "value" ' * 40} for _ in range(4)]

    tools = ToolRegistry(ToolsConfig(max_result_chars=1000), search=search)
    call = await tools.run("history_search", {"query": "port"}, CTX)
    assert call.status == "success" and len(call.result) <= 1000
    data = orjson.loads(call.result)
    assert len(data["hits"]) == 4 and "lists_cut_to" not in data["cut"]
    cut = data["cut"]["texts_cut_to"]
    assert 64 <= cut < 300 and [len(h["snippet"]) for h in data["hits"]] == [cut + 1] * 4


def test_a_result_too_large_to_cut_is_an_error_naming_the_limit():
    text = to_json({f"field_{i}": i for i in range(200)})       # nothing to cut: no text, no list
    fitted = fit_json(text, 512)
    assert len(fitted) <= 512 and "tools.max_result_chars is 512" in orjson.loads(fitted)["error"]


class Knowledge:
    def __init__(self, has: bool) -> None:
        self.has = has

    async def has_documents(self, user_id: str) -> bool:
        return self.has

    async def search(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []


@pytest.mark.parametrize("has_documents", [False, True])
async def test_unknown_tool_lists_only_the_tools_offered(has_documents):
    tools = ToolRegistry(ToolsConfig(), knowledge=Knowledge(has_documents))
    offered = [s["function"]["name"] for s in await tools.schemas_for("alice")]
    assert ("search_knowledge" in offered) is has_documents
    call = await tools.run("nope", {}, CTX)
    assert call.status == "error"
    assert orjson.loads(call.result)["error"] == f"unknown tool 'nope' (available: {', '.join(offered)})"
