"""Provider faults over a real server: the production wiring, the real openai client against the
scripted endpoint, a v3 client on loopback. A fault ends the turn in TURN_ERROR with a stable code;
what streamed before is stored as a partial answer, and nothing else is stored as an answer."""
from __future__ import annotations

import json

from e2e_testlib import API_KEY, MODEL, OTHER_MODEL, T, chat, last_messages, llm_server, names
from testkit.scripted_llm import Reply, ToolCallSpec
from testkit.server import V3Client, poll

STREAMED_THEN_ERROR = ["TURN_START", "STATUS:thinking", "STATUS:generating", "ANSWER_DELTA", "TURN_ERROR"]


async def _partial_after(tmp_path, reply: Reply, code: str, **llm) -> tuple[dict, dict]:
    async with llm_server(tmp_path, **llm) as (_, addr, scripted):
        c = await V3Client.connect(addr)
        scripted.push(reply)
        sent, events = await chat(c, "tell me")
        assert names(events) == STREAMED_THEN_ERROR
        end = events[-1].body
        assert end["code"] == code and "127.0.0.1" in end["message"] and API_KEY not in end["message"]
        partial = end["partial_message"]
        assert partial["metadata"]["partial"] is True and partial["metadata"]["error"] == code
        user, stored = await last_messages(c)
        assert user == sent["user_message"] and stored == partial
        await c.close()
        return end, partial


async def test_cut_stream_is_llm_error_and_the_streamed_text_is_partial(tmp_path):
    end, partial = await _partial_after(tmp_path, Reply.cut_stream("the first ", "half"), "LLM_ERROR")
    assert "ended before the answer was complete" in end["message"]
    assert partial["content"] == "the first half"
    assert partial["metadata"].get("finish_reason") != "stop"


async def test_abrupt_cut_is_llm_error_with_partial(tmp_path):
    end, partial = await _partial_after(tmp_path, Reply.cut_stream("some ", abrupt=True), "LLM_ERROR")
    assert "lost mid-answer" in end["message"] and partial["content"] == "some "


async def test_malformed_sse_is_llm_error_with_partial(tmp_path):
    end, partial = await _partial_after(tmp_path, Reply.malformed("good ", "start"), "LLM_ERROR")
    assert "malformed stream" in end["message"] and partial["content"] == "good start"


async def test_html_200_is_llm_error_naming_the_content_type_and_nothing_is_stored(tmp_path):
    async with llm_server(tmp_path) as (_, addr, scripted):
        c = await V3Client.connect(addr)
        scripted.push(Reply.html())
        sent, events = await chat(c, "hello?")
        assert names(events) == ["TURN_START", "STATUS:thinking", "TURN_ERROR"]
        end = events[-1].body
        assert end["code"] == "LLM_ERROR" and "content type text/html" in end["message"]
        failed = end["partial_message"]                     # the page is no answer: an empty failed one
        assert failed["content"] == "" and failed["metadata"]["error"] == "LLM_ERROR"
        assert failed["metadata"]["error_message"] == end["message"]
        assert await last_messages(c) == [sent["user_message"], failed]
        await c.close()


async def test_429_retry_is_shown_then_the_answer_comes(tmp_path):
    async with llm_server(tmp_path, retry_max_delay_s=1.0) as (_, addr, scripted):
        c = await V3Client.connect(addr)
        scripted.push(Reply.fail(429, "slow down", headers={"retry-after": "0.3"}), Reply.text("fine"))
        _, events = await chat(c, "hello?")
        details = [e.body.get("detail") for e in events if e.type == T.TURN_STATUS]
        assert "retrying 1/2 in 0.3 s (HTTP 429)" in details
        assert events[-1].type == T.TURN_END and events[-1].body["message"]["content"] == "fine"
        assert scripted.requests[1].at - scripted.requests[0].at >= 0.29
        await c.close()


async def _huge_arguments_turn(tmp_path, specs: list) -> tuple[list, dict]:
    async with llm_server(tmp_path) as (srv, addr, scripted):
        c = await V3Client.connect(addr)
        scripted.push(Reply.tools(*specs), Reply.text("The arguments were too big to use."))
        _, events = await chat(c, "check memory")
        end = events[-1]
        assert end.type == T.TURN_END, end.body
        message = end.body["message"]
        [_, stored] = await last_messages(c)
        assert stored["id"] == message["id"] and stored["metadata"]["truncated"] is True
        limit = srv.config.storage.max_message_bytes
        assert len(json.dumps(stored, ensure_ascii=False).encode()) <= limit
        await c.close()
        return events, stored


async def test_two_megabytes_of_tool_arguments_are_stored_cut_to_fit(tmp_path):
    _, stored = await _huge_arguments_turn(tmp_path, [ToolCallSpec.huge("call_big", "sys_monitor", 2 << 20)])
    [call] = stored["tool_calls"]
    assert call["id"] == "call_big" and call["arguments"]["truncated"] is True
    assert "cut to fit max_message_bytes" in call["arguments"]["partial"]
    assert stored["content"] == "The arguments were too big to use."


async def test_two_calls_of_600_kb_are_stored_cut_to_fit(tmp_path):
    specs = [ToolCallSpec.huge(f"call_{i}", "sys_monitor", 600_000) for i in range(2)]
    _, stored = await _huge_arguments_turn(tmp_path, specs)
    assert [c["id"] for c in stored["tool_calls"]] == ["call_0", "call_1"]
    assert all(c["arguments"]["truncated"] is True for c in stored["tool_calls"])


async def test_model_list_merges_the_endpoint_models_and_never_waits(tmp_path):
    async with llm_server(tmp_path) as (_, addr, scripted):
        scripted.models = [MODEL, "remote-large", "remote-small"]
        c = await V3Client.connect(addr)
        names_now = [m["name"] for m in (await c.call(T.MODEL_LIST))["models"]]
        assert names_now[:2] == [MODEL, OTHER_MODEL]               # the configured ones, at once

        async def merged() -> bool:
            got = [m["name"] for m in (await c.call(T.MODEL_LIST))["models"]]
            return got == [MODEL, OTHER_MODEL, "remote-large", "remote-small"]
        await poll(merged)
        assert (await c.call(T.MODEL_SWITCH, model="remote-small"))["model"] == "remote-small"
        scripted.push(Reply.text("small model here"))
        _, events = await chat(c, "hi")
        assert events[-1].type == T.TURN_END and scripted.requests[-1].body["model"] == "remote-small"
        await c.close()
