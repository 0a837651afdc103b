"""A turn's own tool steps fit the context budget: before each follow-up request the results of this
turn are cut (oldest first, ids and pairs kept, marked), and when even that cannot fit the tool loop
ends with a last call without tools (finish reason ``context_budget``). The real openai client talks
to the scripted endpoint over loopback; the last test runs a real server with a 7000-token window
(its tool schemas take ~2,900 of it)."""
from __future__ import annotations

import json
from typing import Any, Callable

from protocol import MsgType as T
from server.agent.base import BuiltContext
from server.agent.config import AgentConfig
from server.agent.llm_support import BUDGET_CUT_NOTE, TurnPrompt
from server.agent.openai_agent import BUDGET_ANSWER_PROMPT, FINAL_ANSWER_PROMPT, OpenAIAgent
from server.app import Server
from server.memory.tokens import ApproxTokenCounter
from server.tools import ToolRegistry, ToolsConfig
from testkit.scripted_llm import Recorded, Reply, ScriptedLLM, ToolCallSpec
from testkit.server import V3Client, make_config

from .conftest import RecordingSink, llm_config, make_request

COUNTER = ApproxTokenCounter()
MARK = "cut to fit the context budget"


def _tokens(body: dict[str, Any]) -> int:
    return COUNTER.count_messages(body["messages"])


def _assert_pairs(messages: list[dict[str, Any]]) -> None:
    """Every assistant tool_calls message is followed by exactly its results, in order; no orphan."""
    i = 0
    while i < len(messages):
        m = messages[i]
        assert m["role"] != "tool", f"orphan tool message at {i}"
        i += 1
        if m["role"] == "assistant" and m.get("tool_calls"):
            ids = [c["id"] for c in m["tool_calls"]]
            results = [r["tool_call_id"] for r in messages[i:i + len(ids)]]
            assert results == ids and all(r["role"] == "tool" for r in messages[i:i + len(ids)])
            i += len(ids)


def _search_tools() -> ToolRegistry:
    """history_search answering 20 long, distinct hits (about 6,000 characters per call)."""
    async def search(user_id, query, session_id=None, k=5):
        return [{"session_id": f"s_{i}", "snippet": " ".join(f"word{i}x{j}" for j in range(60))} for i in range(k)]
    return ToolRegistry(ToolsConfig(), search=search)


def _calls(step: int, n: int) -> Reply:
    return Reply.tools(*[ToolCallSpec(f"s{step}_{i}", "history_search", '{"query": "disk", "limit": 20}')
                         for i in range(n)])


class _Looping(ScriptedLLM):
    """Calls tools (``step_reply(n)``, n: the request number) until told to answer without tools."""

    def __init__(self, step_reply: Callable[[int], Reply]) -> None:
        super().__init__()
        self.step_reply = step_reply

    async def _respond(self, req: Recorded, writer) -> bool:
        if not req.body.get("stream"):
            self.push(Reply.text("A summary."))
        elif req.body.get("tool_choice") == "none":
            self.push(Reply.text("Best effort."))
        else:
            self.push(self.step_reply(len(self.requests) - 1))
        return await super()._respond(req, writer)


def test_turn_prompt_cuts_this_turns_oldest_results_first_and_keeps_them_whole_for_storage():
    base = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    meta: dict[str, Any] = {"budget_tokens": 700}
    prompt = TurnPrompt(BuiltContext(base, meta), COUNTER)
    assert prompt.messages() is base                       # the first request: the built context as it is
    results = []
    for step in range(2):
        call = {"id": f"c{step}", "type": "function", "function": {"name": "clock", "arguments": "{}"}}
        result = {"role": "tool", "tool_call_id": f"c{step}", "content": " ".join(f"w{step}n{i}" for i in range(300))}
        results.append(dict(result))
        prompt.add_step({"role": "assistant", "content": None, "tool_calls": [call]}, [result])
    sent = prompt.messages()
    assert sent is not None and 690 <= COUNTER.count_messages(sent) <= 700     # cut just enough
    _assert_pairs(sent)
    old, new = sent[3], sent[5]
    kept, note = old["content"].rsplit("\n", 1)
    assert old["tool_call_id"] == "c0" and kept and results[0]["content"].startswith(kept)
    assert note == BUDGET_CUT_NOTE.format(n=len(results[0]["content"]) - len(kept))
    assert new == results[1]                               # the newest result still fits whole
    assert [s[1][0] for s in prompt.steps] == results      # what is stored stays whole
    record = meta["tool_exchange"]
    assert record["budget_tokens"] == 700 and record["follow_up_requests"] == 1
    assert record["prompt_tokens_max"] == COUNTER.count_messages(sent)
    assert record["cut"] == [{"what": "tool results", "count": 1, "ids": ["c0"],
                              "why": "over the prompt budget: this turn's results cut, oldest first"}]


def test_turn_prompt_without_a_budget_sends_everything():
    base = [{"role": "user", "content": "go"}]
    prompt = TurnPrompt(BuiltContext(base, {}), COUNTER)
    step = [{"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function",
                                                                    "function": {"name": "clock", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "x " * 10_000}]
    prompt.add_step(step[0], step[1:])
    assert prompt.messages() == base + step


async def test_follow_up_requests_stay_within_the_budget(llm, make_agent, sink):
    llm.push(_calls(0, 3), _calls(1, 3), Reply.text("Found it."))
    req = make_request("what did I say about disks?")
    req.context.metadata["budget_tokens"] = 1500
    result = await make_agent(tools=_search_tools()).run_turn(req, sink)

    assert result.finish_reason == "stop" and result.content == "Found it."
    assert len(llm.requests) == 3
    for r in llm.requests:
        assert _tokens(r.body) <= 1500, _tokens(r.body)
        _assert_pairs(r.body["messages"])
    last = llm.requests[2].body["messages"]
    cut = [m for m in last if m["role"] == "tool" and MARK in m["content"]]
    assert cut and cut[0]["tool_call_id"] == "s0_0"        # the oldest first
    assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == [f"s{s}_{i}" for s in range(2) for i in range(3)]
    assert all(len(c.result) > 5000 and MARK not in c.result for c in result.tool_calls)   # stored whole
    record = req.context.metadata["tool_exchange"]
    assert record["follow_up_requests"] == 2 and record["budget_tokens"] == 1500
    assert record["prompt_tokens_max"] == max(_tokens(r.body) for r in llm.requests[1:])
    assert record["cut"][0]["what"] == "tool results" and record["cut"][0]["ids"][0] == "s0_0"
    assert "ended" not in record


async def test_steps_that_no_longer_fit_end_the_loop_with_a_last_call_without_tools():
    req = make_request("search everything")
    req.context.metadata["budget_tokens"] = 600
    sink = RecordingSink()
    async with _Looping(lambda n: _calls(n, 6)) as llm:
        agent = OpenAIAgent(llm_config(llm.base_url), AgentConfig(max_iterations=6), _search_tools())
        try:
            result = await agent.run_turn(req, sink)
        finally:
            await agent.aclose()

    assert result.finish_reason == "context_budget" and result.content == "Best effort."
    final = llm.requests[-1].body
    assert final["tool_choice"] == "none" and final["messages"][-1] == {"role": "user", "content": BUDGET_ANSWER_PROMPT}
    assert 2 <= len(llm.requests) - 1 < 6                  # the loop ended before max_iterations
    for r in llm.requests:
        assert _tokens(r.body) <= 600, _tokens(r.body)
        _assert_pairs(r.body["messages"])
    assert ("thinking", "context budget reached; answering") in sink.details
    record = req.context.metadata["tool_exchange"]
    assert record["ended"].startswith("the tool results no longer fit")
    assert record["prompt_tokens_max"] == max(_tokens(r.body) for r in llm.requests[1:]) <= 600
    assert [c["what"] for c in record["cut"]] == ["tool results", "tool steps"]


async def test_max_iterations_last_call_is_fitted_too(llm, make_agent, sink):
    llm.push(_calls(0, 1), _calls(1, 1), Reply.text("Done."))
    req = make_request("search")
    req.context.metadata["budget_tokens"] = 400
    result = await make_agent(AgentConfig(max_iterations=2), tools=_search_tools()).run_turn(req, sink)
    assert result.finish_reason == "max_iterations"
    final = llm.requests[-1].body
    assert final["messages"][-1] == {"role": "user", "content": FINAL_ANSWER_PROMPT}
    assert all(_tokens(r.body) <= 400 for r in llm.requests)


async def test_a_real_server_with_a_7000_token_window_keeps_every_request_within_its_budget(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    big = files / "big.log"
    big.write_text("".join(f"{i:04d} worker{i} handled request{i} in {i % 97} ms status ok\n" for i in range(200)))
    args = json.dumps({"path": str(big)})
    read_twice = lambda n: Reply.tools(ToolCallSpec(f"r{n}_a", "read_file", args),   # noqa: E731
                                       ToolCallSpec(f"r{n}_b", "read_file", args))
    async with _Looping(read_twice) as llm:
        cfg = make_config(tmp_path, sections={
            "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": llm.model, "retries": 0},
            "context": {"max_input_tokens": 7000, "reserve_output_tokens": 1024},
            "tools": {"file_roots": [str(files)]}})
        srv = Server(cfg)
        addr = await srv.start()
        try:
            assert srv.services.agent.counter is srv.services.memory.counter   # one count for the prompt and the steps
            c = await V3Client.connect(addr)
            reply = await c.call(T.CHAT_TEXT, text="read big.log again and again")
            events = await c.turn_events(reply["turn_id"], timeout=30)
            await c.close()
        finally:
            await srv.stop()
    end = [m.body for m in events if m.type == T.TURN_END]
    assert end, [m.body for m in events if m.type == T.TURN_ERROR]
    ctx = end[0]["context"]
    budget = ctx["budget_tokens"]
    assert budget == 7000 - 1024 - ctx["tool_schema_tokens"]     # for the messages: the schemas are reserved
    chats = [r.body for r in llm.requests if r.body.get("stream")]
    assert len(chats) >= 3
    for body in chats:
        assert _tokens(body) <= budget, _tokens(body)
        _assert_pairs(body["messages"])
    assert any(m["role"] == "tool" and MARK in m["content"] for m in chats[-1]["messages"])
    record = ctx["tool_exchange"]
    assert record["budget_tokens"] == budget and 0 < record["prompt_tokens_max"] <= budget
    assert record["cut"][0]["what"] == "tool results" and record["cut"][0]["ids"][0] == "r0_a"
    stored = end[0]["message"]["tool_calls"]
    assert stored and all(MARK not in c["result"] and "0199 worker199" in c["result"] for c in stored)
