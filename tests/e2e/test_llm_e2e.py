"""The OpenAI-compatible agent end to end: production wiring (the factory picks OpenAIAgent from the
[llm] section), the real openai client against the scripted SSE server, real tools, the real memory
layer, and a v3 client over loopback TCP.
"""
from __future__ import annotations

import json

import psutil
import pytest

from e2e_testlib import (API_KEY, MODEL, OTHER_MODEL, T, calls_of, chat, check_stored, check_turn, last_messages,
                         llm_server, names, result_of)
from server.tools.units import fmt_bytes
from testkit.scripted_llm import Reply, ToolCallSpec
from testkit.server import ReplyError, V3Client

TEXT_TURN = ["TURN_START", "STATUS:thinking", "STATUS:generating", "ANSWER_DELTA", "TURN_END"]
# no tools.log_roots / file_roots: read_log and the file tools are not offered
TOOL_NAMES = {"sys_monitor", "processes", "network_check", "history_search", "clock", "offer_download", "user_memory"}


def deltas(events: list) -> list[str]:
    return [e.body["text"] for e in events if e.type == T.ANSWER_DELTA]


def normalized(messages: list[dict]) -> list[dict]:
    """Chat messages with tool-call arguments parsed (JSON text may differ in spacing only)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


async def test_streamed_deltas_reach_the_client_in_order(tmp_path):
    pieces = [f"part {i}, " for i in range(15)] + ["中文也可以。", " done."]
    async with llm_server(tmp_path) as (_, addr, llm):
        c = await V3Client.connect(addr)
        agent = {"name": "openai-compatible", "offline": False, "model": MODEL}
        assert c.hello["agent"] == agent and (await c.call(T.STATS))["agent"] == agent
        models = await c.call(T.MODEL_LIST)
        assert [(m["name"], m["default"]) for m in models["models"]] == [(MODEL, True), (OTHER_MODEL, False)]
        llm.push(Reply.text(*pieces, usage={"prompt_tokens": 321, "completion_tokens": 17, "total_tokens": 338}))
        _, events = await chat(c, "tell me a story")
        assert names(events) == TEXT_TURN
        assert events[0].body["model"] == MODEL
        assert deltas(events) == pieces                               # every delta, in order, unmerged
        message = check_turn(events, "tell me a story", tools=0)
        assert message["content"] == "".join(pieces)
        assert events[-1].body["usage"]["completion_tokens"] == 17 and events[-1].body["finish_reason"] == "stop"
        stored = await check_stored(c, events)
        assert stored["metadata"]["model"] == MODEL and stored["metadata"]["usage"]["prompt_tokens"] == 321
        [req] = llm.requests
        body = req.body
        assert req.headers["authorization"] == f"Bearer {API_KEY}"
        assert body["model"] == MODEL and body["stream"] is True
        assert body["messages"][0]["role"] == "system"
        assert body["messages"][-1] == {"role": "user", "content": "tell me a story"}
        assert {t["function"]["name"] for t in body["tools"]} == TOOL_NAMES
        await c.close()


async def test_tool_call_step_runs_real_tools_and_the_next_turn_gets_the_exact_transcript(tmp_path):
    specs = [ToolCallSpec("call_mem", "sys_monitor", '{"metric": "memory"}', pieces=4),
             ToolCallSpec("call_clock", "clock", "{}", pieces=1)]
    async with llm_server(tmp_path) as (srv, addr, llm):
        assert type(srv.memory).__name__ == "MemoryManager"
        c = await V3Client.connect(addr)
        llm.push(Reply.tools(*specs), Reply.text("Memory ", "looks fine."))
        _, events = await chat(c, "how is memory doing?")
        assert names(events) == ["TURN_START", "STATUS:thinking", "STATUS:tool_call", "TOOL_CALL", "TOOL_CALL",
                                 "TOOL_RESULT", "TOOL_RESULT", "STATUS:thinking", "STATUS:generating",
                                 "ANSWER_DELTA", "TURN_END"]
        message = check_turn(events, "how is memory doing?", tools=2)
        assert message["content"] == "Memory looks fine."
        running = calls_of(events, T.TOOL_CALL)
        assert [(r["id"], r["tool_name"], r["arguments"]) for r in running] == [
            ("call_mem", "sys_monitor", {"metric": "memory"}), ("call_clock", "clock", {})]
        done = {r["id"]: r for r in calls_of(events, T.TOOL_RESULT)}
        assert all(r["status"] == "success" and r["step"] == 0 for r in done.values())
        assert result_of(done["call_mem"])["memory"]["total"] == fmt_bytes(psutil.virtual_memory().total)
        assert "utc" in result_of(done["call_clock"])
        stored = await check_stored(c, events)
        assert [t["id"] for t in stored["tool_calls"]] == ["call_mem", "call_clock"]

        # Within the turn the model got its own calls and their results back ...
        first_turn = llm.requests[1].body["messages"]
        user_at = first_turn.index({"role": "user", "content": "how is memory doing?"})
        transcript = first_turn[user_at + 1:]
        assert [m["role"] for m in transcript] == ["assistant", "tool", "tool"]
        assert [m["tool_call_id"] for m in transcript[1:]] == ["call_mem", "call_clock"]
        assert [m["content"] for m in transcript[1:]] == [done["call_mem"]["result"], done["call_clock"]["result"]]

        # ... and the next turn's prompt, rebuilt from storage, holds exactly the same exchange.
        llm.push(Reply.text("Still fine."))
        _, events2 = await chat(c, "and now?")
        check_turn(events2, "and now?", tools=0)
        second = llm.requests[2].body["messages"]
        assert second[0]["role"] == "system"
        assert normalized(second[1:]) == normalized([
            {"role": "user", "content": "how is memory doing?"}, *transcript,
            {"role": "assistant", "content": "Memory looks fine."}, {"role": "user", "content": "and now?"}])
        assert events2[-1].body["context"]["turns_kept"] == 1
        await c.close()


async def test_rate_limited_then_success(tmp_path):
    async with llm_server(tmp_path) as (_, addr, llm):
        c = await V3Client.connect(addr)
        llm.push(Reply.fail(429, "slow down", headers={"retry-after": "0"}), Reply.text("after ", "the retry"))
        _, events = await chat(c, "hello?")
        # the retry is reported as a status detail, then the plain status comes back
        assert names(events) == ["TURN_START", "STATUS:thinking", "STATUS:thinking", "STATUS:thinking",
                                 "STATUS:generating", "ANSWER_DELTA", "TURN_END"]
        assert [e.body.get("detail") for e in events if e.type == T.TURN_STATUS][:3] == \
            [None, "retrying 1/2 in 0 s (HTTP 429)", None]
        assert check_turn(events, "hello?", tools=0)["content"] == "after the retry"
        assert len(llm.requests) == 2 and llm.requests[0].body == llm.requests[1].body   # the same call again
        await c.close()


async def test_stalled_stream_times_out_and_keeps_what_was_said(tmp_path):
    async with llm_server(tmp_path, request_timeout_s=0.5) as (_, addr, llm):
        c = await V3Client.connect(addr)
        llm.push(Reply.stalled("partial ", "answer"))      # every piece, then neither finish nor [DONE]
        reply, events = await chat(c, "this will stall")
        assert names(events) == ["TURN_START", "STATUS:thinking", "STATUS:generating", "ANSWER_DELTA", "TURN_ERROR"]
        end = events[-1].body
        assert end["code"] == "LLM_TIMEOUT" and "127.0.0.1" in end["message"] and API_KEY not in end["message"]
        partial = end["partial_message"]
        assert partial["content"] == "partial answer" == "".join(deltas(events))
        assert partial["metadata"]["partial"] is True and partial["metadata"]["error"] == "LLM_TIMEOUT"
        assert len(llm.requests) == 1                   # text went out: the step is not retried
        user, assistant = await last_messages(c)
        assert user == reply["user_message"] and assistant == partial
        await c.close()


async def test_malformed_tool_arguments_are_returned_to_the_model(tmp_path):
    specs = [ToolCallSpec("call_bad", "network_check", '{"host": "127.0.0.1", "port": 80', pieces=3),
             ToolCallSpec("call_range", "network_check", '{"host": "127.0.0.1", "port": 70000}', pieces=2)]
    async with llm_server(tmp_path) as (_, addr, llm):
        c = await V3Client.connect(addr)
        llm.push(Reply.tools(*specs), Reply.text("Both calls were rejected."))
        _, events = await chat(c, "check port 80")
        message = check_turn(events, "check port 80", tools=2)
        assert events[-1].body["finish_reason"] == "stop" and message["content"] == "Both calls were rejected."
        done = {r["id"]: r for r in calls_of(events, T.TOOL_RESULT)}
        assert done["call_bad"]["status"] == done["call_range"]["status"] == "error"
        assert "not valid JSON" in result_of(done["call_bad"])["error"]
        assert result_of(done["call_range"])["error"] == "argument 'port': expected an integer in 1..65535, got 70000"
        fed_back = [m for m in llm.requests[1].body["messages"] if m["role"] == "tool"]
        assert fed_back == [{"role": "tool", "tool_call_id": i, "content": done[i]["result"]}
                            for i in ("call_bad", "call_range")]
        stored = await check_stored(c, events)
        assert stored["tool_calls"][0]["arguments"] == {"_raw_arguments": '{"host": "127.0.0.1", "port": 80'}
        await c.close()


async def test_cancel_mid_stream_saves_the_partial_answer(tmp_path):
    async with llm_server(tmp_path) as (_, addr, llm):
        c = await V3Client.connect(addr)
        llm.push(Reply.stalled("first ", "second"), Reply.text("next turn works"))
        rid = c.next_id()
        reply = await c.call(T.CHAT_TEXT, id=rid, text="stream then hang")
        last = await c.wait_for(lambda m: m.type == T.ANSWER_DELTA and m.body["text"] == "second")
        cancelled = await c.call(T.CHAT_CANCEL)
        assert cancelled["turn_id"] == reply["turn_id"] and cancelled["cancelled"] is True
        events = sorted(await c.turn_events(reply["turn_id"]) + [last], key=lambda m: m.seq)
        end = events[-1].body
        assert events[-1].type == T.TURN_END and end["finish_reason"] == "cancelled"
        assert end["message"]["content"] == "first second" == "".join(deltas(events))
        assert end["message"]["metadata"]["partial"] is True
        user, assistant = await last_messages(c)
        assert user == reply["user_message"] and assistant == end["message"]
        _, events = await chat(c, "again")
        assert check_turn(events, "again", tools=0)["content"] == "next turn works"
        await c.close()


async def test_model_switch_applies_to_one_session_only(tmp_path):
    async with llm_server(tmp_path) as (_, addr, llm):
        c = await V3Client.connect(addr)
        first = c.session_id
        with pytest.raises(ReplyError) as refused:
            await c.call(T.MODEL_SWITCH, model="no-such-model")
        assert refused.value.code == "UNKNOWN_MODEL"
        switched = await c.call(T.MODEL_SWITCH, model=OTHER_MODEL)
        assert (switched["session_id"], switched["model"]) == (first, OTHER_MODEL)

        async def turn(text: str) -> str:
            llm.push(Reply.text("ok"))
            _, events = await chat(c, text)
            check_turn(events, text, tools=0)
            assert events[0].body["model"] == events[-1].body["message"]["metadata"]["model"]
            return llm.requests[-1].body["model"]

        assert await turn("in the switched session") == OTHER_MODEL
        await c.call(T.SESSION_NEW, title="second")
        assert (await c.call(T.MODEL_LIST))["current"] == MODEL
        assert await turn("in a new session") == MODEL
        await c.call(T.SESSION_SWITCH, session_id=first)
        assert (await c.call(T.MODEL_LIST))["current"] == OTHER_MODEL
        assert await turn("back in the first session") == OTHER_MODEL
        await c.close()
