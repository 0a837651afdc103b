"""The turn runner and pipeline (session 32), over real TCP against the scripted OpenAI-compatible
endpoint (the production wiring: OpenAI agent, real MemoryManager):

* a MODEL_SWITCH applies to a turn already queued (the model is the session's when the turn
  starts, as its system prompt is), not the model of when it was enqueued;
* a cancelled or failed answer's trace ("why this answer") still names the model, the tool calls
  made so far and the finish reason (``generate``), and its route says the agent had not chosen one.
"""
from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from client.tui.why import why_lines
from protocol import MsgType as T
from server.agent.base import BuiltContext
from server.app import Server
from server.pipeline import Answer, TurnState, persist_step
from storage.models import ChatMessage, ToolCall
from testkit.scripted_llm import Reply, StreamedOnlyLLM, ToolCallSpec
from testkit.server import V3Client, make_config



@asynccontextmanager
async def scripted_server(tmp_path: Path):
    async with StreamedOnlyLLM(model="scripted-a", side_text="A title.") as llm:
        cfg = make_config(tmp_path, sections={
            "llm": {"base_url": llm.base_url, "api_key": "sk-test-0123456789", "model": "scripted-a",
                    "models": ["scripted-b"], "models_from_endpoint": False, "request_timeout_s": 5.0,
                    "retries": 0},
            "summarization": {"enabled": False}})
        srv = Server(cfg)
        addr = await srv.start()
        try:
            yield srv, addr, llm
        finally:
            await srv.stop()


def _delta_of(turn_id: str, text: str):
    return lambda m: m.type == T.ANSWER_DELTA and m.body.get("turn_id") == turn_id and text in m.body.get("text", "")


async def test_a_model_switch_applies_to_a_turn_already_queued(tmp_path):
    async with scripted_server(tmp_path) as (srv, addr, llm):
        a = await V3Client.connect(addr)
        b = await V3Client.connect(addr, session_id=a.session_id)
        llm.push(Reply.stalled("Thinking "), Reply.text("answer to second"))
        first = await a.call(T.CHAT_TEXT, text="first question")
        second = await a.call(T.CHAT_TEXT, text="second question (queued)")
        assert second["queued"] == 1 and second["user_message"]["id"] is None   # waits: nothing stored yet
        await a.wait_for(_delta_of(first["turn_id"], "Thinking"))     # the first runs (on scripted-a)
        assert llm.requests[0].body["model"] == "scripted-a"
        # another connection switches the session's model while the second turn waits
        assert (await b.call(T.MODEL_SWITCH, model="scripted-b"))["model"] == "scripted-b"
        await b.call(T.CHAT_CANCEL, turn_id=first["turn_id"])
        events = await a.turn_events(second["turn_id"])
        start, end = events[0], events[-1]
        assert start.type == T.TURN_START and start.body["model"] == "scripted-b"
        assert end.type == T.TURN_END, end.body
        assert [r.body["model"] for r in llm.requests] == ["scripted-a", "scripted-b"]
        meta = end.body["message"]["metadata"]
        assert meta["model"] == "scripted-b" and meta["context"]["pipeline"]["generate"]["model"] == "scripted-b"
        # the model of the turn that was running when the switch came stays its own
        history = (await a.call(T.HISTORY_REQUEST))["messages"]
        assert [(m["role"], m["metadata"].get("model")) for m in history if m["role"] == "assistant"] == \
            [("assistant", "scripted-a"), ("assistant", "scripted-b")]
        await a.close()
        await b.close()


async def test_a_cancelled_answer_records_its_model_tool_calls_and_finish(tmp_path):
    async with scripted_server(tmp_path) as (srv, addr, llm):
        c = await V3Client.connect(addr)
        llm.push(Reply.tools(ToolCallSpec("k1", "clock", "{}"), text="Let me check. "),
                 Reply.stalled("Partial ", "answer "))
        reply = await c.call(T.CHAT_TEXT, text="what time is it on the server")
        await c.wait_for(_delta_of(reply["turn_id"], "answer"))
        await c.call(T.CHAT_CANCEL)
        end = (await c.turn_events(reply["turn_id"]))[-1]
        assert end.type == T.TURN_END and end.body["finish_reason"] == "cancelled"
        for trace in (end.body["context"]["pipeline"], end.body["message"]["metadata"]["context"]["pipeline"]):
            assert trace["generate"] == {"model": "scripted-a", "finish_reason": "cancelled", "tool_calls": ["clock"]}
            assert trace["route"]["decision"] == "chat" and "decided_by" not in trace["route"]
            assert "the agent had not chosen a route when the turn was cancelled" in trace["route"]["reason"]
            assert trace["persist"]["finish_reason"] == "cancelled"
        stored = (await c.call(T.HISTORY_REQUEST))["messages"][-1]
        assert stored["metadata"]["context"]["pipeline"]["generate"]["tool_calls"] == ["clock"]
        assert "Model: scripted-a · finish: cancelled · tools: clock" in why_lines(stored["metadata"])
        await c.close()


async def test_a_failed_answer_records_its_model_tool_calls_and_finish(tmp_path):
    async with scripted_server(tmp_path) as (srv, addr, llm):
        c = await V3Client.connect(addr)
        llm.push(Reply.tools(ToolCallSpec("k1", "clock", "{}"), text="Let me check. "),
                 Reply.fail(400, "the model does not like this"))
        reply = await c.call(T.CHAT_TEXT, text="what time is it on the server")
        end = (await c.turn_events(reply["turn_id"]))[-1]
        assert end.type == T.TURN_ERROR, end.body
        meta = end.body["partial_message"]["metadata"]
        trace = meta["context"]["pipeline"]
        assert meta["finish_reason"] == "error"
        assert trace["generate"] == {"model": "scripted-a", "finish_reason": "error", "tool_calls": ["clock"]}
        assert "when the turn was ended by an error" in trace["route"]["reason"]
        assert "Model: scripted-a · finish: error · tools: clock" in why_lines(meta)
        await c.close()


# -- the pipeline alone: which route an unfinished turn records ---------------------------------

def _state(route: dict[str, Any] | None = None) -> TurnState:
    msg = ChatMessage(1, "user", "q", "2026-11-27T00:00:00+00:00")
    state = TurnState("s1", "u1", "m-1", "t1", msg)
    state.record("route", decision="chat", reason="no router configured")
    state.context = BuiltContext(messages=[], metadata={"pipeline": state.trace, **({"route": route} if route else {})})
    state.generating = True
    return state


async def _persist_unfinished(state: TurnState, calls: list[ToolCall], finish: str) -> dict[str, Any]:
    state.answer = Answer("partial", calls, finish, {})

    async def save(s: TurnState) -> str:
        return "stored"
    await persist_step(save)(state)
    assert state.stored == "stored"
    return state.trace


async def test_an_unfinished_turn_adopts_the_route_the_agent_had_decided():
    # the offline agent records its route before it answers: a cancel keeps it
    trace = await _persist_unfinished(_state({"route": "knowledge", "method": "rule", "reason": "named the documents"}),
                                      [], "cancelled")
    assert trace["route"] == {"decision": "knowledge", "method": "rule", "reason": "named the documents",
                              "decided_by": "agent"}
    assert trace["generate"] == {"model": "m-1", "finish_reason": "cancelled", "tool_calls": []}


async def test_an_unfinished_turn_that_searched_the_documents_took_the_knowledge_route():
    call = ToolCall("k1", "search_knowledge", {"query": "vpn"}, "[]", "success")
    state = _state()
    trace = await _persist_unfinished(state, [call], "error")
    assert trace["route"]["decision"] == "knowledge" and trace["route"]["decided_by"] == "agent"
    assert state.route == "knowledge"
    assert trace["retrieve"] == {"passages": [], "via": "search_knowledge tool", "searches": 1}
    assert trace["generate"]["tool_calls"] == ["search_knowledge"] and trace["generate"]["finish_reason"] == "error"


async def test_a_turn_cancelled_before_the_agent_ran_records_no_generate():
    state = _state()
    state.generating = False
    trace = await _persist_unfinished(state, [], "cancelled")
    assert "generate" not in trace and trace["route"] == {"decision": "chat", "reason": "no router configured"}
    assert trace["persist"]["finish_reason"] == "cancelled"
