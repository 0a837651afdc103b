"""The tool schemas every model request carries are reserved from the prompt budget: the memory layer
fits the built context into ``context.max_input_tokens - context.reserve_output_tokens`` less the
schemas' tokens, so messages + tools of every request stay within the window (before, a session
whose history filled the budget sent the schemas on top: a real endpoint answers 400
context-length-exceeded). The end-to-end test runs a real server against the scripted
OpenAI-compatible endpoint over loopback and counts each received request with the server's counter."""
from __future__ import annotations

from typing import Any

import orjson

from protocol import MsgType as T
from server.agent.base import tool_schema_tokens
from server.agent.config import AgentConfig
from server.agent.offline import OfflineAgent
from server.agent.openai_agent import FINAL_ANSWER_PROMPT, OpenAIAgent
from server.app import Server
from server.basic_memory import BasicMemory
from server.memory import MemoryConfig, MemoryManager
from server.memory.config import MIN_PROMPT_BUDGET
from server.memory.context import message_budget
from server.memory.tokens import ApproxTokenCounter
from server.pipeline import TurnState, recall_step
from server.tools import ToolRegistry, ToolsConfig
from storage import AsyncHistoryStore, StorageConfig
from testkit.scripted_llm import Recorded, Reply, ScriptedLLM, ToolCallSpec
from testkit.server import V3Client, make_config

from .conftest import llm_config

WINDOW, RESERVE_OUT = 6000, 1000
BUDGET = WINDOW - RESERVE_OUT
TOOL_TURN = "what time is it on the server?"


def _long(tag: str, words: int) -> str:
    return " ".join(f"{tag}w{j}" for j in range(words))


def _request_tokens(counter: Any, body: dict[str, Any]) -> int:
    """What a request sends, as the server counts it: the messages plus the tools as JSON."""
    tools = orjson.dumps(body["tools"]).decode() if body.get("tools") else ""
    return counter.count_messages(body["messages"]) + (counter.count(tools) if tools else 0)


class _Endpoint(ScriptedLLM):
    """Answers every streamed request with a long text; on the tool question it calls ``clock``
    (twice, one step each: with ``max_iterations = 2`` the turn ends with a last call without tools)."""

    async def _respond(self, req: Recorded, writer) -> bool:
        messages = req.body.get("messages") or []
        if not req.body.get("stream"):
            self.push(Reply.text("A summary."))
        elif req.body.get("tool_choice") != "none" and any(m.get("content") == TOOL_TURN for m in messages[-3:]):
            self.push(Reply.tools(ToolCallSpec(f"c{len(self.requests)}", "clock", "{}")))
        else:
            self.push(Reply.text(_long(f"a{len(self.requests)}", 200)))
        return await super()._respond(req, writer)


async def test_every_request_of_a_long_session_fits_the_window_with_its_tool_schemas(tmp_path):
    async with _Endpoint() as llm:
        cfg = make_config(tmp_path, sections={
            "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": llm.model, "retries": 0},
            "agent": {"max_iterations": 2},
            "summarization": {"enabled": False},
            "tools": {"file_roots": [str(tmp_path)], "log_roots": [str(tmp_path)]},   # every tool offered
            "context": {"max_input_tokens": WINDOW, "reserve_output_tokens": RESERVE_OUT}})
        srv = Server(cfg)
        addr = await srv.start()
        try:
            counter = srv.services.memory.counter
            c = await V3Client.connect(addr)
            ends = []
            for i in range(8):                       # about 650 tokens a turn: the history fills the budget
                reply = await c.call(T.CHAT_TEXT, text=f"Note {i}: " + _long(f"u{i}", 120))
                ends.append((await c.turn_events(reply["turn_id"], timeout=30))[-1])
            reply = await c.call(T.CHAT_TEXT, text=TOOL_TURN)
            ends.append((await c.turn_events(reply["turn_id"], timeout=30))[-1])
            await c.close()
        finally:
            await srv.stop()
    assert all(e.type == T.TURN_END for e in ends), [e.body for e in ends if e.type != T.TURN_END]
    chats = [r.body for r in llm.requests if r.body.get("stream")]
    assert all(body.get("tools") for body in chats)            # the last call (tool_choice none) sends them too
    assert chats[-1]["tool_choice"] == "none" and chats[-1]["messages"][-1]["content"] == FINAL_ANSWER_PROMPT
    schemas = counter.count(orjson.dumps(chats[-1]["tools"]).decode())
    assert schemas > 1000                                      # what nothing counted before
    sizes = [_request_tokens(counter, body) for body in chats]
    assert max(sizes) > BUDGET - 300                           # the history really fills the window
    assert all(n <= BUDGET for n in sizes), (sizes, BUDGET)
    ctx = ends[-1].body["context"]
    assert ctx["tool_schema_tokens"] == schemas and ctx["budget_tokens"] == BUDGET - schemas
    assert ctx["turns_dropped"] > 0 and ctx["prompt_tokens_estimate"] <= ctx["budget_tokens"]
    recall = ctx["pipeline"]["recall"]
    assert recall["tool_schema_tokens"] == schemas and recall["budget_tokens"] == BUDGET - schemas
    assert ctx["tool_exchange"]["prompt_tokens_max"] <= ctx["budget_tokens"]


async def _session(store: AsyncHistoryStore, turns: int) -> tuple[str, Any]:
    sid = (await store.create("alice")).session_id
    for i in range(turns):
        await store.append(sid, "user", f"Question {i}: " + _long(f"q{i}", 60))
        await store.append(sid, "assistant", _long(f"r{i}", 60))
    return sid, await store.append(sid, "user", "and now?")


async def test_build_context_reserves_the_schemas_and_records_them(tmp_path):
    store = AsyncHistoryStore(StorageConfig(root=str(tmp_path / "history"), durability="batched"))
    cfg = MemoryConfig.from_dict({"summarization": {"enabled": False},
                                  "context": {"max_input_tokens": 2048, "reserve_output_tokens": 512}})
    mm = MemoryManager(cfg, store, OfflineAgent(AgentConfig(), ToolRegistry(ToolsConfig())), None, "SYS",
                       token_counter=ApproxTokenCounter())
    try:
        sid, new = await _session(store, 12)
        plain = await mm.build_context(sid, "alice", new, "m")
        ctx = await mm.build_context(sid, "alice", new, "m", reserve_tokens=700)
        m = ctx.metadata
        assert plain.metadata["budget_tokens"] == 1536 and plain.metadata["tool_schema_tokens"] == 0
        assert m["budget_tokens"] == 1536 - 700 and m["tool_schema_tokens"] == 700 and "budget_floored" not in m
        assert m["prompt_tokens_estimate"] <= m["budget_tokens"] < plain.metadata["prompt_tokens_estimate"]
        assert m["turns_kept"] < plain.metadata["turns_kept"] and ctx.messages[-1]["content"] == "and now?"

        # schemas that leave less than MIN_PROMPT_BUDGET: the floor, said in the metadata and the trace
        floored = await mm.build_context(sid, "alice", new, "m", reserve_tokens=5000)
        f = floored.metadata
        assert f["budget_tokens"] == MIN_PROMPT_BUDGET and f["budget_floored"] is True
        assert f["tool_schema_tokens"] == 5000 and f["prompt_tokens_estimate"] <= MIN_PROMPT_BUDGET
        assert floored.messages[-1]["content"] == "and now?"
        state = TurnState(sid, "alice", "m", "t_1", new, tool_schema_tokens=5000)
        await recall_step(mm)(state)
        assert state.trace["recall"]["tool_schema_tokens"] == 5000 and state.trace["recall"]["budget_floored"]
        assert state.trace["recall"]["budget_tokens"] == MIN_PROMPT_BUDGET

        basic = await BasicMemory(store, "SYS").build_context(sid, "alice", new, "m", reserve_tokens=42)
        assert basic.metadata["tool_schema_tokens"] == 42 and "budget_tokens" not in basic.metadata
    finally:
        await mm.aclose()
        await store.close()


def test_message_budget_takes_the_reserve_off_down_to_the_floor():
    assert message_budget(3000, 0) == (3000, False)
    assert message_budget(3000, 1000) == (2000, False)
    assert message_budget(3000, 3000 - MIN_PROMPT_BUDGET) == (MIN_PROMPT_BUDGET, False)
    assert message_budget(3000, 2900) == (MIN_PROMPT_BUDGET, True)
    assert message_budget(100, 50) == (100, True)          # a budget under the floor is never raised


class _CountingCounter(ApproxTokenCounter):
    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def count(self, text: str) -> int:
        self.texts.append(text)
        return super().count(text)


async def test_agents_say_what_their_schemas_cost(llm):
    registry = ToolRegistry(ToolsConfig())
    counter = _CountingCounter()
    agent = OpenAIAgent(llm_config(llm.base_url), AgentConfig(), registry, counter=counter)
    try:
        wire = orjson.dumps(await registry.schemas_for("alice")).decode()
        n = await agent.tool_schema_tokens("alice")
        assert n == ApproxTokenCounter().count(wire) and counter.texts == [wire]
        assert await tool_schema_tokens(agent, "bob") == n and counter.texts == [wire]    # counted once
        agent.counter = other = _CountingCounter()            # the server wires in the memory layer's counter
        assert await agent.tool_schema_tokens("alice") == n and other.texts == [wire]
        assert agent.count_schemas([]) == 0
    finally:
        await agent.aclose()
    assert await tool_schema_tokens(OfflineAgent(AgentConfig(), registry), "alice") == 0
    assert await tool_schema_tokens(object(), "alice") == 0          # an agent that does not say: nothing reserved

