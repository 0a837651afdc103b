"""Provider faults end as clear errors, never as answers: the real openai client against the scripted
server cutting the stream, answering HTML with 200, sending malformed SSE, stalling, rate limiting."""
from __future__ import annotations

import json

import pytest

from server.agent.base import AgentError
from testkit.scripted_llm import Reply, ToolCallSpec

from .conftest import make_request


def _chunk(delta: dict, finish: str | None = None) -> str:
    return json.dumps({"id": "c", "object": "chat.completion.chunk",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


async def test_stream_cut_cleanly_after_text_is_llm_error_with_the_text_kept(llm, make_agent, sink):
    llm.push(Reply.cut_stream("half of ", "an answer"), Reply.text("must not be retried"))
    with pytest.raises(AgentError) as err:
        await make_agent().run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_ERROR"
    assert err.value.message == (f"the stream from the model endpoint 127.0.0.1:{llm.port} ended before the "
                                 "answer was complete (no finish_reason nor [DONE])")
    assert sink.text == "half of an answer"          # what streamed reaches the turn runner as partial
    assert len(llm.requests) == 1 and llm.pending == 1


async def test_stream_cut_abruptly_after_text_is_llm_error(llm, make_agent, sink):
    llm.push(Reply.cut_stream("half ", abrupt=True))
    with pytest.raises(AgentError) as err:
        await make_agent().run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_ERROR" and "lost mid-answer" in err.value.message
    assert sink.text == "half "


async def test_stream_cut_before_any_text_is_retried_and_reported(llm, make_agent, sink):
    llm.push(Reply.cut_stream(), Reply.text("whole"))
    result = await make_agent(retries=3).run_turn(make_request("hi"), sink)
    assert result.content == "whole" and result.finish_reason == "stop"
    retry = [d for s, d in sink.details if d and d.startswith("retrying")]
    assert len(retry) == 1 and retry[0].startswith("retrying 1/3 in ") and retry[0].endswith(" s (stream cut)")


async def test_finish_reason_without_done_is_a_whole_answer(llm, make_agent, sink):
    reply = Reply(raw_events=[_chunk({"role": "assistant", "content": "all "}), _chunk({"content": "there"}),
                              _chunk({}, "stop")])
    reply.cut = "clean"
    llm.push(reply)
    result = await make_agent().run_turn(make_request("hi"), sink)
    assert result.content == "all there" and result.finish_reason == "stop"


async def test_html_with_200_is_llm_error_naming_the_content_type(llm, make_agent, sink):
    llm.push(Reply.html(), Reply.text("never sent"))
    with pytest.raises(AgentError) as err:
        await make_agent().run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_ERROR"
    assert "HTTP 200 with content type text/html instead of an event stream" in err.value.message
    assert "captive portal" not in err.value.message
    assert sink.text == "" and sink.of("delta") == []
    assert len(llm.requests) == 1                    # not retried: a page in the way does not go away


async def test_json_error_body_with_200_keeps_the_servers_message(llm, make_agent, sink):
    reply = Reply.html(json.dumps({"error": {"message": "quota exhausted"}}))
    reply.content_type = "application/json"
    llm.push(reply)
    with pytest.raises(AgentError) as err:
        await make_agent().run_turn(make_request("hi"), sink)
    assert "content type application/json" in err.value.message and "quota exhausted" in err.value.message


async def test_a_stream_without_a_content_type_is_read_as_sse(llm, make_agent, sink):
    events = [_chunk({"role": "assistant", "content": "untyped "}), _chunk({"content": "but fine"}, "stop")]
    reply = Reply.html("".join(f"data: {e}\n\n" for e in events) + "data: [DONE]\n\n")
    reply.content_type = ""
    llm.push(reply)
    result = await make_agent().run_turn(make_request("hi"), sink)
    assert result.content == "untyped but fine" and result.finish_reason == "stop"


async def test_html_with_200_for_a_summary_is_llm_error(llm, make_agent):
    llm.push(Reply.html())
    with pytest.raises(AgentError) as err:
        await make_agent().complete([{"role": "user", "content": "summarize"}])
    assert err.value.code == "LLM_ERROR" and "not a chat completion" in err.value.message


async def test_malformed_sse_is_llm_error_with_the_text_kept(llm, make_agent, sink):
    llm.push(Reply.malformed("good ", "start"))
    with pytest.raises(AgentError) as err:
        await make_agent().run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_ERROR"
    assert "sent a malformed stream: a stream event is not JSON" in err.value.message
    assert sink.text == "good start" and len(llm.requests) == 1


async def test_stall_before_any_text_is_llm_timeout(llm, make_agent, sink):
    llm.push(Reply.stalled())
    with pytest.raises(AgentError) as err:
        await make_agent(request_timeout_s=0.3).run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_TIMEOUT"
    assert err.value.message == (f"the model endpoint 127.0.0.1:{llm.port} stopped sending mid-stream: "
                                 "nothing came for 0.3 s")
    assert sink.text == "" and len(llm.requests) == 1       # a timeout is not retried


async def test_429_retry_after_is_waited_and_each_retry_reported(llm, make_agent, sink):
    llm.push(Reply.fail(429, "slow down", headers={"retry-after": "0.2"}),
             Reply.fail(429, "slow down", headers={"retry-after": "0.2"}), Reply.text("ok"))
    result = await make_agent(retries=3).run_turn(make_request("hi"), sink)
    assert result.content == "ok"
    assert llm.requests[2].at - llm.requests[1].at >= 0.19
    assert [d for _, d in sink.details] == [None, "retrying 1/3 in 0.2 s (HTTP 429)", None,
                                            "retrying 2/3 in 0.2 s (HTTP 429)", None, None]
    assert [s for s, _ in sink.details] == ["thinking"] * 5 + ["generating"]


async def test_persistent_429_error_counts_the_attempts(llm, make_agent, sink):
    llm.push(*[Reply.fail(429, "slow down", headers={"retry-after": "0"})] * 3)
    with pytest.raises(AgentError) as err:
        await make_agent(retries=2).run_turn(make_request("hi"), sink)
    assert err.value.attempts == 3 and "after 3 attempts" in err.value.message


async def test_two_megabytes_of_tool_arguments_reach_the_tool_and_the_next_call(llm, make_agent, sink):
    spec = ToolCallSpec.huge("call_big", "sys_monitor", 2 << 20)
    llm.push(Reply.tools(spec), Reply.text("done"))
    result = await make_agent().run_turn(make_request("memory?"), sink)
    assert result.content == "done"
    [call] = result.tool_calls
    assert call.id == "call_big" and len(call.arguments["note"]) > 2_000_000
    sent = llm.requests[1].body["messages"][2]["tool_calls"][0]["function"]["arguments"]
    assert sent == spec.arguments
