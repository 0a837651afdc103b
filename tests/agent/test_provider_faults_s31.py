"""Provider faults of review s31, with the real openai client against a scripted endpoint on loopback
(and, where the wire matters, a real server): a stream kept open by keep-alives or empty deltas ends
at the idle or step limit, megabyte tool names and call ids are bounded where the reply is
assembled, empty and content-filtered answers are errors, a step's text is replayed where it was
said, and an out-of-range usage number does not fail the answer."""
from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from protocol import MsgType as T
from server.agent import fit_message as fit_module
from server.agent.base import AgentError
from server.agent.config import AgentConfig, LLMConfig
from server.agent.fit_message import encoded_size, fit_assistant_message
from server.agent.llm_support import Usage
from server.agent.tool_calls import ToolCallAssembler
from server.agent.openai_agent import OpenAIAgent
from server.agent.transcript import history_to_openai
from server.app import Server
from server.tools import ToolRegistry, ToolsConfig
from storage.models import ChatMessage, ToolCall
from testkit.scripted_llm import Reply, ScriptedLLM, ToolCallSpec
from testkit.server import V3Client, make_config, poll

from .conftest import llm_config, make_request

FILLERS = {
    "comment": b": keep-alive\n\n",
    "empty": b'data: {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": null}]}\n\n',
    "reasoning": b'data: {"choices": [{"index": 0, "delta": {"reasoning_content": "hmm "}, "finish_reason": null}]}\n\n',
    "text": b'data: {"choices": [{"index": 0, "delta": {"content": "."}, "finish_reason": null}]}\n\n',
}


@dataclass
class Endless(Reply):
    """A stream: the text ``chunks``, then a ``filler`` event every ``every`` s, ``count`` times (None:
    until the client goes away), then (if it gets there) ``answer`` and a normal end."""
    filler: str = "comment"
    every: float = 0.02
    count: int | None = None
    answer: str = ""


class EndlessLLM(ScriptedLLM):
    """The scripted endpoint, plus ``Endless`` replies; ``dropped`` is set when a client closes one."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = asyncio.Event()

    async def _send_stream(self, writer, req, reply) -> bool:
        if not isinstance(reply, Endless):
            return await super()._send_stream(writer, req, reply)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        try:
            for event in self._events(req, reply)[:-1]:        # the text, without the finish chunk
                await self._chunk(writer, f"data: {event}\n\n".encode())
            sent = 0
            while reply.count is None or sent < reply.count:
                await self._chunk(writer, FILLERS[reply.filler])
                sent += 1
                with contextlib.suppress(TimeoutError):       # the endpoint's pace, not a synchronisation
                    await asyncio.wait_for(self._stopping.wait(), reply.every)
                if self._stopping.is_set():
                    return False
            tail = Reply.text(reply.answer) if reply.answer else Reply(chunks=[])
            for event in self._events(req, tail)[1:]:
                await self._chunk(writer, f"data: {event}\n\n".encode())
            await self._chunk(writer, b"data: [DONE]\n\n")
            await self._chunk(writer, b"")
            return True
        except ConnectionError:
            self.dropped.set()
            return False


@pytest.fixture
async def llm():
    async with EndlessLLM() as server:
        yield server


def _chunk(delta: dict, finish: str | None = None, **extra) -> str:
    return json.dumps({"id": "c", "object": "chat.completion.chunk",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra})


# -- 1. a stream that never finishes ------------------------------------------------------------------


@pytest.mark.parametrize("filler", ["comment", "empty"])
async def test_keep_alives_without_progress_end_at_the_idle_limit(llm, make_agent, sink, filler):
    llm.push(Endless(chunks=[{"content": "so far"}], filler=filler))
    agent = make_agent(stream_idle_timeout_s=1.0, request_timeout_s=5)
    with pytest.raises(AgentError) as err:
        await agent.run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_TIMEOUT"
    assert err.value.message == (f"the model endpoint 127.0.0.1:{llm.port} kept the stream open but sent nothing "
                                 "of the answer for 1 s ([llm] stream_idle_timeout_s)")
    assert sink.text == "so far"                       # what streamed reaches the turn runner as the partial
    async with asyncio.timeout(5):
        await llm.dropped.wait()                       # the HTTP connection to the endpoint is closed
    assert len(llm.requests) == 1                      # a timeout is not retried


async def test_a_stream_that_keeps_sending_text_ends_at_the_step_limit(llm, make_agent, sink):
    llm.push(Endless(filler="text"))
    agent = make_agent(stream_idle_timeout_s=5, step_timeout_s=0.6)
    with pytest.raises(AgentError) as err:
        await agent.run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_TIMEOUT"
    assert err.value.message == (f"the model endpoint 127.0.0.1:{llm.port} did not finish its answer within 0.6 s "
                                 "([llm] step_timeout_s)")
    assert sink.text.startswith("...")


async def test_reasoning_deltas_are_progress(llm, make_agent, sink):
    # thinking for longer than the idle limit, then the answer: a reasoning model is not cut off
    llm.push(Endless(filler="reasoning", every=0.05, count=16, answer="thought it through"))
    result = await make_agent(stream_idle_timeout_s=1.5).run_turn(make_request("hi"), sink)
    assert result.content == "thought it through" and result.finish_reason == "stop"


class _TricklingJSON(ScriptedLLM):
    """A non-streamed completion whose body comes one space a time, forever."""

    async def _respond(self, req, writer) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n")
        while not self._stopping.is_set():
            writer.write(b" ")
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 0.02)
        return False


async def test_a_summary_call_is_bounded_by_the_step_limit():
    async with _TricklingJSON() as slow:
        agent = OpenAIAgent(llm_config(slow.base_url, step_timeout_s=0.5), AgentConfig(), ToolRegistry(ToolsConfig()))
        try:
            with pytest.raises(AgentError) as err:
                await agent.complete([{"role": "user", "content": "summarize"}])
        finally:
            await agent.aclose()
    assert err.value.code == "LLM_TIMEOUT" and "within 0.5 s ([llm] step_timeout_s)" in err.value.message


def test_the_limits_are_settings_with_safe_defaults():
    cfg = LLMConfig.from_dict({}, env={})
    assert (cfg.stream_idle_timeout_s, cfg.step_timeout_s) == (60.0, 1800.0)
    assert (cfg.max_tool_name_chars, cfg.max_tool_call_id_chars) == (64, 256)


@contextlib.asynccontextmanager
async def _llm_server(tmp_path: Path, **llm_overrides):
    async with EndlessLLM() as scripted:
        llm = {"base_url": scripted.base_url, "api_key": "sk-test-0123456789", "model": "scripted-model",
               "request_timeout_s": 5.0, "retries": 1, "retry_backoff_s": 0.01, **llm_overrides}
        srv = Server(make_config(tmp_path, sections={"llm": llm, "summarization": {"enabled": False}}))
        addr = await srv.start()
        try:
            yield srv, addr, scripted
        finally:
            await srv.stop()


async def test_a_client_gone_on_an_endless_stream_frees_the_turn(tmp_path):
    async with _llm_server(tmp_path, stream_idle_timeout_s=1.0) as (srv, addr, scripted):
        scripted.push(Endless(chunks=[{"content": "partial "}]))
        c = await V3Client.connect(addr)
        sid = c.session_id
        await c.call(T.CHAT_TEXT, text="check the disks")
        await c.wait_for(lambda m: m.type == T.ANSWER_DELTA)
        await c.close()                                # the client goes away mid-turn

        other = await V3Client.connect(addr, session_id=sid, new_session=False)
        async def idle() -> bool:
            return (await other.call(T.STATS))["turns_running"] == 0
        await poll(idle, timeout=10, what="the turn to end")
        async with asyncio.timeout(5):
            await scripted.dropped.wait()              # and its connection to the endpoint is closed
        page = await other.call(T.HISTORY_REQUEST, limit=10)
        user, answer = page["messages"][-2:]
        assert user["role"] == "user" and answer["role"] == "assistant"
        assert answer["content"] == "partial " and answer["metadata"]["error"] == "LLM_TIMEOUT"
        assert answer["metadata"]["partial"] is True
        # the session's queue and the user's turn slot are free: the next turn runs
        scripted.push(Reply.text("next answer"))
        r = await other.call(T.CHAT_TEXT, text="and now?")
        events = await other.turn_events(r["turn_id"])
        assert events[-1].type == T.TURN_END and events[-1].body["message"]["content"] == "next answer"
        await other.close()


# -- 2. megabyte tool names and call ids --------------------------------------------------------------


async def test_a_megabyte_tool_name_is_an_unknown_tool_and_the_turn_goes_on(llm, make_agent, sink):
    llm.push(Reply.tools(ToolCallSpec("h1", "x" * 3_000_000, "{}")), Reply.text("hugename done"))
    result = await make_agent().run_turn(make_request("hi"), sink)
    assert result.content == "hugename done"
    [call] = result.tool_calls
    assert call.tool_name == "x" * 64 and call.status == "error" and call.id == "h1"
    error = json.loads(call.result)["error"]
    assert error.startswith("unknown tool: the name sent is 3000000 characters long, over the 64 a tool name "
                            "may have (available: ") and "clock" in error
    assert [c.tool_name for c in sink.of("tool_call")] == ["x" * 64]
    sent = llm.requests[1].body["messages"][2]["tool_calls"][0]
    assert sent["function"]["name"] == "x" * 64 and sent["id"] == "h1"
    stored = fit_assistant_message(result.content, result.tool_calls, result.metadata, 1 << 20)
    assert not stored.cut and stored.content == "hugename done"


async def test_a_long_name_that_starts_like_a_real_tool_is_not_run(llm, make_agent, sink):
    llm.push(Reply.tools(ToolCallSpec("c1", "search_knowledge" + "x" * 100, "{}")), Reply.text("ok"))
    result = await make_agent(max_tool_name_chars=16).run_turn(make_request("hi"), sink)
    [call] = result.tool_calls            # cut to a real tool's name, yet not run
    assert call.tool_name == "search_knowledge" and call.status == "error" and "116 characters long" in call.result


async def test_a_megabyte_call_id_is_replaced_everywhere(llm, make_agent, sink):
    llm.push(Reply.tools(ToolCallSpec("i" * 3_000_000, "clock", "{}")), Reply.text("hugeid done"))
    result = await make_agent().run_turn(make_request("hi"), sink)
    [call] = result.tool_calls
    assert call.id.startswith("call_") and call.status == "success"
    assert [c.id for c in sink.of("tool_call")] == [call.id] == [c.id for c in sink.of("tool_result")]
    follow_up = llm.requests[1].body["messages"]
    assert follow_up[2]["tool_calls"][0]["id"] == call.id and follow_up[3]["tool_call_id"] == call.id
    stored = fit_assistant_message(result.content, result.tool_calls, result.metadata, 1 << 20)
    assert not stored.cut and stored.content == "hugeid done"


def test_arguments_sent_in_many_pieces_are_joined_once():
    """``+=`` on the slot's text copied all of it at every piece (quadratic in the pieces): they are
    kept as a list and joined when the calls are taken."""
    a = ToolCallAssembler()
    a.add([{"index": 0, "id": "c1", "function": {"name": "read_file", "arguments": ""}}])
    pieces = [f'{{"path": "/var/log/{i}"}}'[:7] for i in range(3000)]
    for piece in pieces:
        a.add([{"index": 0, "function": {"arguments": piece}}])
    assert a._slots[0].arguments == "" and len(a._slots[0].pieces) == 3000    # nothing copied yet
    (call,) = a.calls()
    assert call.arguments == "".join(pieces) and call.pieces == []
    assert a.calls()[0].arguments == "".join(pieces)                          # taken twice: the same


def test_the_assembler_bounds_names_sent_in_pieces_and_long_ids_without_an_index():
    a = ToolCallAssembler(max_name_chars=64, max_id_chars=256)
    for i in range(1000):                      # 10 MB of name in 1,000 pieces: kept bounded as it comes
        a.add([{"index": 0, "id": "n1", "function": {"name": "yv"[i % 2] * 10_000}}])
    long_id = "z" * 10_000
    b = ToolCallAssembler(max_name_chars=64, max_id_chars=256)
    for cid in (long_id, "w" * 10_000):        # two calls with long ids and no index: two slots
        b.add([{"id": cid, "function": {"name": "clock", "arguments": ""}}])
        b.add([{"id": cid, "function": {"arguments": "{}"}}])
    [call] = a.calls()
    assert call.name == "y" * 64 and call.name_chars == 10_000_000
    calls = b.calls()
    assert [c.arguments for c in calls] == ["{}", "{}"]
    assert all(c.id.startswith("call_") and len(c.id) < 64 for c in calls) and calls[0].id != calls[1].id


def test_after_calls_are_dropped_the_answer_is_fitted_again():
    # a call that cannot fit even with empty texts (its id alone is 2 MB): it is dropped, the answer stays whole
    call = ToolCall(id="i" * (2 << 20), tool_name="clock", arguments={}, result='{"utc": "now"}', step=0)
    fitted = fit_assistant_message("hugeid done", [call], {"model": "m"}, 1 << 20)
    assert fitted.content == "hugeid done" and fitted.tool_calls == []
    assert fitted.metadata == {"model": "m", "truncated": True, "tool_calls_dropped": 1}


def test_dropping_many_calls_encodes_the_message_a_few_times_only(monkeypatch):
    encodes = []
    real = fit_module.encoded_size

    def counting(*args):
        encodes.append(1)
        return real(*args)
    monkeypatch.setattr(fit_module, "encoded_size", counting)
    calls = [ToolCall(id=f"call_{i}", tool_name="clock", arguments={}, result="r" * 100, step=0) for i in range(3000)]
    fitted = fit_assistant_message("answer", calls, {}, 16_384)
    assert 0 < len(fitted.tool_calls) < 3000
    assert fitted.metadata["tool_calls_dropped"] == 3000 - len(fitted.tool_calls)
    assert encoded_size(fitted.content, fitted.tool_calls, fitted.metadata) <= 16_384
    assert len(encodes) < 60                   # bisection, not one encoding per dropped call


async def test_hugename_over_the_wire_stores_the_answer(tmp_path):
    async with _llm_server(tmp_path) as (srv, addr, scripted):
        scripted.push(Reply.tools(ToolCallSpec("h1", "x" * 3_000_000, "{}")), Reply.text("hugename done"))
        c = await V3Client.connect(addr)
        r = await c.call(T.CHAT_TEXT, text="hi")
        events = await c.turn_events(r["turn_id"], timeout=30)
        assert events[-1].type == T.TURN_END, events[-1].body
        assert [e.body["call"]["tool_name"] for e in events if e.type == T.TOOL_CALL] == ["x" * 64]
        page = await c.call(T.HISTORY_REQUEST, limit=10)
        assert [(m["role"], m["content"]) for m in page["messages"]] == [("user", "hi"),
                                                                        ("assistant", "hugename done")]
        assert page["messages"][1]["tool_calls"][0]["tool_name"] == "x" * 64
        await c.close()


# -- 3. empty and content-filtered answers -------------------------------------------------------------


async def test_content_filter_without_text_is_llm_error(llm, make_agent, sink):
    llm.push(Reply.text(finish_reason="content_filter"))
    with pytest.raises(AgentError) as err:
        await make_agent().run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_ERROR"
    assert err.value.message == (f"the model endpoint 127.0.0.1:{llm.port} withheld the answer: its content "
                                 "filter stopped it (finish_reason content_filter)")


async def test_content_filter_after_some_text_is_llm_error_with_the_text_kept(llm, make_agent, sink):
    llm.push(Reply.text("The first half", finish_reason="content_filter"))
    with pytest.raises(AgentError) as err:
        await make_agent().run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_ERROR" and "content filter" in err.value.message
    assert sink.text == "The first half"


async def test_a_stream_of_usage_only_is_an_empty_answer_error(llm, make_agent, sink):
    usage = {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}
    llm.push(Reply(raw_events=[json.dumps({"id": "c", "choices": []}), json.dumps({"id": "c", "choices": [],
                                                                                   "usage": usage})]))
    with pytest.raises(AgentError) as err:
        await make_agent().run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_ERROR"
    assert err.value.message == (f"the model endpoint 127.0.0.1:{llm.port} sent an empty answer: no text and no "
                                 "tool call (finish_reason none)")


async def test_an_empty_stop_is_an_empty_answer_error(llm, make_agent, sink):
    llm.push(Reply.text())
    with pytest.raises(AgentError) as err:
        await make_agent().run_turn(make_request("hi"), sink)
    assert err.value.message.endswith("sent an empty answer: no text and no tool call (finish_reason stop)")


async def test_tool_calls_on_the_last_call_without_tools_are_an_error(llm, make_agent, sink):
    llm.push(Reply.tools(ToolCallSpec("g0", "clock", "{}")), Reply.tools(ToolCallSpec("g1", "clock", "{}")))
    with pytest.raises(AgentError) as err:
        await make_agent(AgentConfig(max_iterations=1)).run_turn(make_request("hi"), sink)
    assert llm.requests[1].body["tool_choice"] == "none"
    assert err.value.code == "LLM_ERROR"
    assert err.value.message == (f"the model endpoint 127.0.0.1:{llm.port} answered the last request, which "
                                 "allows no more tool calls (tool_choice \"none\"), with tool calls and no text")
    assert [c.id for c in sink.of("tool_result")] == ["g0"]      # the calls that ran reach the partial answer


async def test_empty_answer_over_the_wire_is_a_turn_error_stored_as_such(tmp_path):
    async with _llm_server(tmp_path) as (srv, addr, scripted):
        scripted.push(Reply.text(finish_reason="content_filter"))
        c = await V3Client.connect(addr)
        r = await c.call(T.CHAT_TEXT, text="hi")
        events = await c.turn_events(r["turn_id"])
        assert events[-1].type == T.TURN_ERROR and events[-1].body["code"] == "LLM_ERROR"
        page = await c.call(T.HISTORY_REQUEST, limit=10)
        answer = page["messages"][-1]
        assert answer["role"] == "assistant" and answer["metadata"]["finish_reason"] == "error"
        await c.close()


# -- 4. a step's text replayed where it was said ----------------------------------------------------------


async def test_text_said_with_tool_calls_is_replayed_in_its_step(llm, make_agent, sink):
    llm.push(Reply.tools(ToolCallSpec("ca1", "clock", "{}"), text="Let me check the clock."),
             Reply.tools(ToolCallSpec("ca2", "clock", "{}")),
             Reply.text("It is time."))
    req = make_request("what time")
    result = await make_agent().run_turn(req, sink)
    assert result.content == "Let me check the clock.\n\nIt is time."
    stored = ChatMessage(id=2, role="assistant", content=result.content, tool_calls=result.tool_calls,
                         metadata=orjson.loads(orjson.dumps(result.metadata)))   # as stored
    replay = history_to_openai([req.user_message, stored])
    within = llm.requests[2].body["messages"][1:]           # what the model got in the turn (after system)
    assert replay == [*within, {"role": "assistant", "content": "It is time."}]
    assert replay[1]["content"] == "Let me check the clock." and replay[3]["content"] is None


def test_a_message_whose_text_does_not_match_its_record_replays_as_before():
    calls = [ToolCall(id="a", tool_name="clock", arguments={}, result="{}", step=0)]
    for content in ("Let me check.\n[... cut to fit max_message_bytes: 5 more characters]", "edited"):
        msg = ChatMessage(id=2, role="assistant", content=content, tool_calls=calls,
                          metadata={"step_text": [[0, 0, 13], [1, 15, 26]]})
        out = history_to_openai([msg])
        assert out[0]["content"] is None and out[-1] == {"role": "assistant", "content": content}


# -- 5. usage is bookkeeping ----------------------------------------------------------------------------


async def test_an_out_of_range_usage_number_does_not_fail_the_answer(llm, make_agent, sink):
    bad = ('{"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}], '
           '"usage": {"prompt_tokens": "12", "completion_tokens": 1e400, "total_tokens": 1e308}}')
    llm.push(Reply(raw_events=[bad]))
    result = await make_agent().run_turn(make_request("hi"), sink)
    assert result.content == "ok" and result.finish_reason == "stop"
    assert result.usage == {"llm_calls": 1, "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    orjson.dumps(result.usage)                          # storable


async def test_odd_text_is_still_a_malformed_stream(llm, make_agent, sink):
    bad = '{"choices": [{"index": 0, "delta": {"content": "\\ud800"}, "finish_reason": "stop"}], "usage": {}}'
    llm.push(Reply(raw_events=[bad]))
    with pytest.raises(AgentError) as err:
        await make_agent().run_turn(make_request("hi"), sink)
    assert "a stream event is not JSON" in err.value.message


def test_usage_counts_only_sane_numbers():
    usage = Usage()
    usage.add({"prompt_tokens": 7, "completion_tokens": float("inf"), "total_tokens": 10 ** 30})
    usage.add({"prompt_tokens": -3, "completion_tokens": 2.0, "total_tokens": True})
    assert usage.to_dict() == {"llm_calls": 2, "prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 0}
