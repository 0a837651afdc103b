"""Malformed model replies and error texts: a nameless tool call and an empty answer cut by max_tokens
are errors, duplicate tool-call ids are made unique everywhere, a context-length 400 is not sent
twice, a stream cut before any text is retried as a "stream cut", and no part of the key is echoed.
The real openai client talks to the scripted endpoint over loopback."""
from __future__ import annotations

import pytest

from server.agent.base import AgentError
from server.agent.config import AgentConfig
from server.agent.llm_support import scrub_key
from server.agent.openai_agent import OpenAIAgent
from server.agent.transcript import history_to_openai
from server.memory.context import sanitize
from server.tools import ToolRegistry, ToolsConfig
from storage.models import ChatMessage
from testkit.scripted_llm import Reply, ScriptedLLM, ToolCallSpec

from .conftest import API_KEY, llm_config, make_request


def _fragments(text: str, key: str, n: int = 8) -> list[str]:
    return [key[i:i + n] for i in range(len(key) - n + 1) if key[i:i + n] in text]


async def test_a_tool_call_without_a_name_is_llm_error(llm, make_agent, sink):
    llm.push(Reply(chunks=[{"role": "assistant", "content": None},
                           {"tool_calls": [{"index": 0, "id": "z1", "type": "function",
                                            "function": {"arguments": "{}"}}]}], finish_reason="tool_calls"),
             Reply.text("never sent"))
    with pytest.raises(AgentError) as err:
        await make_agent().run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_ERROR"
    assert err.value.message == (f"the model endpoint 127.0.0.1:{llm.port} sent a malformed stream: "
                                 "tool call 0 (id 'z1') has no function name")
    assert len(llm.requests) == 1 and sink.of("tool_call") == []


async def test_only_reasoning_then_length_is_an_error_naming_max_tokens(llm, make_agent, sink):
    llm.push(Reply(chunks=[{"role": "assistant", "reasoning_content": "thinking " * 50}], finish_reason="length"))
    with pytest.raises(AgentError) as err:
        await make_agent(max_tokens=64).run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_ERROR"
    assert err.value.message == (f"the model endpoint 127.0.0.1:{llm.port} stopped at the max_tokens limit (64) "
                                 "before writing any answer (a reasoning model may have spent it thinking): "
                                 "raise [llm] max_tokens")


async def test_text_cut_by_length_is_still_an_answer(llm, make_agent, sink):
    llm.push(Reply.text("a long answ", finish_reason="length"))
    result = await make_agent().run_turn(make_request("hi"), sink)
    assert result.content == "a long answ" and result.finish_reason == "length"


async def test_duplicate_and_reused_call_ids_are_replaced_consistently(llm, make_agent, sink):
    llm.push(Reply.tools(ToolCallSpec("dup", "clock", "{}"), ToolCallSpec("dup", "clock", "{}")),
             Reply.tools(ToolCallSpec("dup", "clock", "{}")),          # reused in the next step
             Reply.text("ok"))
    result = await make_agent().run_turn(make_request("time?"), sink)

    ids = [c.id for c in result.tool_calls]
    assert ids[0] == "dup" and len(set(ids)) == 3 and all(i.startswith("call_") for i in ids[1:])
    assert [c.id for c in sink.of("tool_result")] == ids
    second = llm.requests[1].body["messages"]
    assert [c["id"] for c in second[2]["tool_calls"]] == ids[:2]
    assert [m["tool_call_id"] for m in second[3:5]] == ids[:2]
    third = llm.requests[2].body["messages"]
    assert [c["id"] for c in third[5]["tool_calls"]] == ids[2:] and third[6]["tool_call_id"] == ids[2]
    # the next turn's prompt, rebuilt from the stored message, keeps all three calls
    stored = ChatMessage(id=2, role="assistant", content=result.content, tool_calls=result.tool_calls)
    rebuilt = sanitize(history_to_openai([ChatMessage(id=1, role="user", content="time?"), stored]))
    assert [m["tool_call_id"] for m in rebuilt if m["role"] == "tool"] == ids


async def test_a_context_length_400_is_not_sent_again_without_stream_options(llm, make_agent, sink):
    llm.push(Reply.fail(400, "This model's maximum context length is 8192 tokens"), Reply.text("never sent"))
    agent = make_agent()
    with pytest.raises(AgentError) as err:
        await agent.run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_ERROR"
    assert "HTTP 400" in err.value.message and "maximum context length is 8192 tokens" in err.value.message
    assert len(llm.requests) == 1 and llm.pending == 1
    assert agent._stream_usage is True


async def test_an_unexplained_400_still_tries_without_stream_options(llm, make_agent, sink):
    llm.push(Reply.fail(400, "Extra inputs are not permitted"), Reply.text("fine"))
    result = await make_agent().run_turn(make_request("hi"), sink)
    assert result.content == "fine" and "stream_options" not in llm.requests[1].body


async def test_an_abrupt_cut_before_any_text_is_retried_as_a_stream_cut(llm, make_agent, sink):
    llm.push(Reply.cut_stream(abrupt=True), Reply.text("whole"))
    result = await make_agent(retries=3).run_turn(make_request("hi"), sink)
    assert result.content == "whole"
    retry = [d for _, d in sink.details if d and d.startswith("retrying")]
    assert len(retry) == 1 and retry[0].startswith("retrying 1/3 in ") and retry[0].endswith(" s (stream cut)")


def test_scrub_key_removes_every_run_of_eight_or_more_characters_of_the_key():
    key = "sk-live-SECRETKEY-0123456789abcdef"
    assert scrub_key(f"key {key}.", key) == "key ***."
    assert scrub_key(f"provided: {key[:20]} / sk-live-****cdef", key) == "provided: *** / *******cdef"
    assert scrub_key(f"middle {key[9:21]}!", key) == "middle ***!"
    assert scrub_key("short sk-live 0123456 abcdef stays", key) == "short sk-live 0123456 abcdef stays"
    assert scrub_key("nothing here", None) == "nothing here"
    assert scrub_key("tiny key abc", "abc") == "tiny key ***"


async def test_a_key_prefix_echoed_by_the_endpoint_is_scrubbed(llm, make_agent, sink, caplog):
    caplog.set_level("DEBUG")
    llm.push(Reply.fail(401, f"Incorrect API key provided: {API_KEY[:14]}****; also {API_KEY[5:17]}"))
    with pytest.raises(AgentError) as err:
        await make_agent().run_turn(make_request("hi"), sink)
    assert "HTTP 401" in err.value.message and "Incorrect API key provided: ***" in err.value.message
    assert _fragments(err.value.message, API_KEY) == [] and _fragments(caplog.text, API_KEY) == []


class _EchoingModels(ScriptedLLM):
    """GET /v1/models fails with 401 and echoes the whole key and a prefix of it."""

    async def _list_models(self, writer) -> bool:
        await self._send_json(writer, 401, {"error": {"message": f"bad key {API_KEY}, starts {API_KEY[:12]}"}})
        return True


async def test_a_key_echoed_by_a_failing_model_list_is_not_logged(caplog):
    caplog.set_level("DEBUG")
    async with _EchoingModels() as llm:
        agent = OpenAIAgent(llm_config(llm.base_url), AgentConfig(), ToolRegistry(ToolsConfig()))
        try:
            assert await agent.catalog.refresh() == ["scripted-model"]
        finally:
            await agent.aclose()
    assert "HTTP 401" in agent.catalog.last_error and "model list of the endpoint not available" in caplog.text
    assert _fragments(agent.catalog.last_error, API_KEY) == [] and _fragments(caplog.text, API_KEY) == []
