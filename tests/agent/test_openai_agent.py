"""OpenAIAgent with the real openai client against a scripted OpenAI-compatible server on loopback."""
from __future__ import annotations

import asyncio
import json
import socket

import orjson
import pytest

from server.agent.base import AgentError
from server.agent.config import AgentConfig
from server.agent.openai_agent import FINAL_ANSWER_PROMPT, OpenAIAgent
from server.tools import ToolRegistry, ToolsConfig
from testkit.scripted_llm import Reply, ToolCallSpec

from .conftest import API_KEY, RecordingSink, llm_config, make_request

USAGE = {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}


async def test_text_deltas_relayed_in_order_with_usage(llm, make_agent, sink, registry):
    llm.push(Reply.text("Hel", "lo, ", "world", usage=USAGE))
    agent = make_agent()
    req = make_request("hi")
    result = await agent.run_turn(req, sink)

    assert sink.of("delta") == ["Hel", "lo, ", "world"]
    assert result.content == "Hello, world"
    assert result.finish_reason == "stop"
    assert result.tool_calls == []
    assert result.usage == {"llm_calls": 1, "prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}
    assert sink.kinds[:2] == ["status:thinking", "status:generating"]
    sent = llm.requests[0]
    assert sent.body["messages"] == req.context.messages
    assert sent.body["model"] == "scripted-model"
    assert sent.body["stream"] is True and sent.body["stream_options"] == {"include_usage": True}
    assert sent.body["tool_choice"] == "auto"
    assert [t["function"]["name"] for t in sent.body["tools"]] == [n for n in registry.names if n not in registry.disabled]
    assert sent.headers["authorization"] == f"Bearer {API_KEY}"


async def test_model_switch_uses_request_model(llm, make_agent, sink):
    llm.push(Reply.text("ok"))
    await make_agent(models=["other-model"]).run_turn(make_request("hi", model="other-model"), sink)
    assert llm.requests[0].body["model"] == "other-model"


async def test_tool_call_split_across_chunks_is_assembled_and_run(llm, make_agent, sink):
    llm.push(Reply.tools(ToolCallSpec("call_a", "sys_monitor", '{"metric": "memory"}', pieces=5), usage=USAGE),
             Reply.text("Memory is fine.", usage=USAGE))
    result = await make_agent().run_turn(make_request("memory?"), sink)

    assert result.content == "Memory is fine."
    assert result.usage["total_tokens"] == 28 and result.usage["llm_calls"] == 2
    [call] = result.tool_calls
    assert (call.id, call.tool_name, call.arguments, call.status, call.step) == \
        ("call_a", "sys_monitor", {"metric": "memory"}, "success", 0)
    assert "total" in orjson.loads(call.result)["memory"]
    assert sink.kinds == ["status:thinking", "status:tool_call", "tool_call", "tool_result", "status:thinking",
                          "status:generating", "delta"]
    assert sink.of("tool_call")[0].status == "running" and sink.of("tool_call")[0].result == ""

    second = llm.requests[1].body["messages"]
    assert second[:2] == make_request("memory?").context.messages
    assert second[2] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "sys_monitor", "arguments": '{"metric": "memory"}'}}]}
    assert second[3] == {"role": "tool", "tool_call_id": "call_a", "content": call.result}


async def test_parallel_tool_calls_run_concurrently(llm, make_agent, sink):
    barrier = asyncio.Barrier(2)
    seen: list[tuple] = []

    async def search(user_id, query, session_id=None, k=5):
        seen.append((user_id, query, session_id, k))
        async with asyncio.timeout(5):
            await barrier.wait()       # only passes when both calls are in flight at once
        return [{"session_id": "s_1", "snippet": f"about {query}"}]

    tools = ToolRegistry(ToolsConfig(), search=search)
    llm.push(Reply.tools(ToolCallSpec("c1", "history_search", '{"query": "nginx"}'),
                         ToolCallSpec("c2", "history_search", '{"query": "redis", "limit": 2}')),
             Reply.text("done"))
    result = await make_agent(tools=tools).run_turn(make_request("x"), sink)

    assert [c.status for c in result.tool_calls] == ["success", "success"]
    assert [c.id for c in result.tool_calls] == ["c1", "c2"]
    assert sorted(seen) == [("alice", "nginx", None, 5), ("alice", "redis", None, 2)]
    assert sink.kinds[1:5] == ["status:tool_call", "tool_call", "tool_call", "tool_result"]
    tool_msgs = [m for m in llm.requests[1].body["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["c1", "c2"]
    assert "about redis" in tool_msgs[1]["content"]


async def test_text_before_tool_calls_then_answer_are_separated(llm, make_agent, sink):
    llm.push(Reply.tools(ToolCallSpec("c1", "clock", "{}"), text="Checking the clock."), Reply.text("It is noon."))
    result = await make_agent().run_turn(make_request("time?"), sink)
    assert result.content == "Checking the clock.\n\nIt is noon."
    assert sink.text == result.content
    assert llm.requests[1].body["messages"][2]["content"] == "Checking the clock."


async def test_malformed_tool_arguments_go_back_to_the_model(llm, make_agent, sink):
    llm.push(Reply.tools(ToolCallSpec("bad", "sys_monitor", '{"metric": cpu')),
             Reply.tools(ToolCallSpec("bad2", "sys_monitor", '{"metric": "gpu"}')),
             Reply.tools(ToolCallSpec("bad3", "no_such_tool", "{}")),
             Reply.text("Sorry."))
    result = await make_agent().run_turn(make_request("cpu"), sink)

    assert [c.status for c in result.tool_calls] == ["error", "error", "error"]
    assert [c.step for c in result.tool_calls] == [0, 1, 2]
    errors = [orjson.loads(c.result)["error"] for c in result.tool_calls]
    assert errors[0].startswith("arguments are not valid JSON")
    assert errors[1] == "argument 'metric': expected one of 'cpu', 'memory', 'disk', 'network', 'load', " \
                        "'uptime', 'all', got 'gpu'"
    assert errors[2].startswith("unknown tool 'no_such_tool'")
    msgs = llm.requests[1].body["messages"]
    assert json.loads(msgs[2]["tool_calls"][0]["function"]["arguments"]) == {"invalid_arguments": '{"metric": cpu'}
    assert "not valid JSON" in msgs[3]["content"]
    assert result.content == "Sorry." and result.finish_reason == "stop"


async def test_max_iterations_forces_a_final_answer_without_tools(llm, make_agent, sink):
    llm.push(Reply.tools(ToolCallSpec("c1", "clock", "{}")), Reply.tools(ToolCallSpec("c2", "clock", "{}")),
             Reply.text("Best effort answer."))
    result = await make_agent(AgentConfig(max_iterations=2)).run_turn(make_request("loop"), sink)

    assert result.finish_reason == "max_iterations"
    assert result.content == "Best effort answer."
    assert [(c.id, c.step) for c in result.tool_calls] == [("c1", 0), ("c2", 1)]
    assert len(llm.requests) == 3
    final = llm.requests[2].body
    assert final["tool_choice"] == "none"
    assert final["messages"][-1] == {"role": "user", "content": FINAL_ANSWER_PROMPT}
    assert result.metadata["steps"] == 3


async def test_429_with_retry_after_then_success(llm, make_agent, sink):
    llm.push(Reply.fail(429, "slow down", headers={"retry-after": "0.2"}), Reply.text("ok"))
    result = await make_agent().run_turn(make_request("hi"), sink)
    assert result.content == "ok"
    assert len(llm.requests) == 2
    assert llm.requests[1].at - llm.requests[0].at >= 0.19   # retry-after honoured (a lower bound)


async def test_500_is_retried_then_succeeds(llm, make_agent, sink):
    llm.push(Reply.fail(500), Reply.fail(503), Reply.text("recovered"))
    result = await make_agent(retries=2).run_turn(make_request("hi"), sink)
    assert result.content == "recovered" and len(llm.requests) == 3


async def test_persistent_500_fails_with_host_and_status_never_the_key(llm, make_agent, sink, caplog):
    caplog.set_level("DEBUG")
    llm.push(*[Reply.fail(500, f"backend exploded for key {API_KEY}")] * 3)
    with pytest.raises(AgentError) as err:
        await make_agent(retries=2).run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_ERROR"
    assert f"127.0.0.1:{llm.port}" in err.value.message and "HTTP 500" in err.value.message
    assert "after 3 attempts" in err.value.message
    assert API_KEY not in err.value.message and API_KEY not in str(err.value)
    assert "retry 2/2" in caplog.text and API_KEY not in caplog.text
    assert len(llm.requests) == 3


async def test_401_is_not_retried(llm, make_agent, sink):
    llm.push(Reply.fail(401, "invalid api key"), Reply.text("never sent"))
    with pytest.raises(AgentError) as err:
        await make_agent().run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_ERROR" and "HTTP 401" in err.value.message
    assert "NPLT_LLM_API_KEY" in err.value.message
    assert len(llm.requests) == 1


async def test_stalled_stream_times_out_after_partial_text(llm, make_agent, sink):
    llm.push(Reply.stalled("partial "), Reply.text("must not be retried"))
    with pytest.raises(AgentError) as err:
        await make_agent(request_timeout_s=0.3).run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_TIMEOUT"
    assert f"127.0.0.1:{llm.port}" in err.value.message
    assert sink.text == "partial "
    assert len(llm.requests) == 1 and llm.pending == 1


async def test_unreachable_endpoint_is_llm_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]          # closed when the block ends: nothing listens there
    agent = OpenAIAgent(llm_config(f"http://127.0.0.1:{port}/v1", retries=1), AgentConfig(),
                        ToolRegistry(ToolsConfig()))
    try:
        with pytest.raises(AgentError) as err:
            await agent.run_turn(make_request("hi"), RecordingSink())
    finally:
        await agent.aclose()
    assert err.value.code == "LLM_ERROR"
    assert err.value.message == f"cannot connect to the model endpoint 127.0.0.1:{port} (after 2 attempts)"


async def test_error_event_inside_the_stream(llm, make_agent, sink):
    llm.push(Reply(raw_events=[json.dumps({"error": {"message": "model overloaded", "type": "server_error"}})]))
    with pytest.raises(AgentError) as err:
        await make_agent(retries=0).run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_ERROR" and "model overloaded" in err.value.message


async def test_stream_options_rejected_falls_back_and_remembers(llm, make_agent, sink):
    llm.push(Reply.fail(400, "Unrecognized request argument supplied: stream_options"), Reply.text("one"),
             Reply.text("two"))
    agent = make_agent()
    assert (await agent.run_turn(make_request("a"), sink)).content == "one"
    assert (await agent.run_turn(make_request("b"), RecordingSink())).content == "two"
    assert "stream_options" in llm.requests[0].body
    assert "stream_options" not in llm.requests[1].body and "stream_options" not in llm.requests[2].body


async def test_cancel_mid_stream_keeps_partial_deltas(llm, make_agent, sink):
    llm.push(Reply.stalled("first ", "second "))
    task = asyncio.create_task(make_agent().run_turn(make_request("hi"), sink))
    await sink.wait_for(lambda s: s.text == "first second ")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sink.of("delta") == ["first ", "second "]
    assert not [k for k in sink.kinds if k.startswith("notice")]


async def test_complete_is_one_non_streamed_call_with_retries(llm, make_agent):
    llm.push(Reply.fail(502), Reply.text("A summary."))
    agent = make_agent()
    msgs = [{"role": "user", "content": "summarize"}]
    assert await agent.complete(msgs, model="m2") == "A summary."
    body = llm.requests[1].body
    assert body["messages"] == msgs and body["model"] == "m2" and not body.get("stream")
    assert "tools" not in body


async def test_models_and_identity(llm, make_agent):
    agent = make_agent(models=["alt-1", "scripted-model", "alt-2"])
    assert agent.models() == ["scripted-model", "alt-1", "alt-2"]
    assert agent.default_model == "scripted-model" and agent.offline is False
    assert API_KEY not in repr(agent) and API_KEY not in repr(agent.llm)
