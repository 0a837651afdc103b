"""Session 34, the real-LLM agent across turns: a real server over TCP (v3 client) with the OpenAI
agent against a scripted OpenAI-compatible endpoint on loopback.

* A tool call cut at max_tokens (arguments not JSON) no longer poisons the session on a vLLM-like
  endpoint that JSON-parses every historical call's arguments: the stored call keeps the raw text,
  and every later request sends a JSON object for it (before, every later turn failed with
  LLM_ERROR HTTP 400 "Unterminated string").
* A tool call a cancel stops is stored with a JSON error result, and replayed so in the next turn
  (before: the bare string "interrupted").
"""
from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson

from protocol import MsgType as T
from server.agent.transcript import UNFINISHED_RESULT, history_to_openai
from server.app import Server
from storage.models import ChatMessage, ToolCall
from testkit.scripted_llm import Recorded, Reply, StreamedOnlyLLM, ToolCallSpec
from testkit.server import V3Client, make_config

CUT_ARGS = '{"sort_by": "cpu", "name": "ngi'


class StrictStreamedLLM(StreamedOnlyLLM):
    """vLLM-like: a streamed request holding a historical tool call whose arguments are not a JSON
    object is answered 400 with the parser's message (vLLM json-parses them all)."""

    def __init__(self) -> None:
        super().__init__(model="scripted-a", side_text="A title.")
        self.rejected: list[str] = []
        self.strict = True

    async def _respond(self, req: Recorded, writer: Any) -> bool:
        if req.body.get("stream") and self.strict:
            for m in req.body.get("messages") or ():
                for tc in m.get("tool_calls") or ():
                    try:
                        ok, why = isinstance(json.loads(tc["function"]["arguments"]), dict), "not an object"
                    except ValueError as e:
                        ok, why = False, str(e)
                    if not ok:
                        self.rejected.append(why)
                        await self._send_json(writer, 400, {"error": {"message": why, "type": "BadRequestError"}})
                        return True
        return await super()._respond(req, writer)


@asynccontextmanager
async def scripted_server(tmp_path: Path):
    async with StrictStreamedLLM() as llm:
        cfg = make_config(tmp_path, sections={
            "llm": {"base_url": llm.base_url, "api_key": "sk-test-0123456789", "model": "scripted-a",
                    "models_from_endpoint": False, "request_timeout_s": 5.0, "retries": 0},
            "summarization": {"enabled": False}})
        srv = Server(cfg)
        addr = await srv.start()
        try:
            yield srv, addr, llm
        finally:
            await srv.stop()


async def _chat(c: V3Client, text: str) -> Any:
    reply = await c.call(T.CHAT_TEXT, text=text)
    return (await c.turn_events(reply["turn_id"]))[-1]


async def test_a_call_cut_at_max_tokens_does_not_fail_the_later_turns(tmp_path):
    async with scripted_server(tmp_path) as (srv, addr, llm):
        c = await V3Client.connect(addr)
        llm.strict = False      # (the first turn's own follow-up: tests/agent/test_s34_llm_wire.py)
        llm.push(Reply.tools(ToolCallSpec("t1", "processes", CUT_ARGS)), Reply.text("I could not list them."))
        end = await _chat(c, "which nginx processes use the most cpu?")
        assert end.type == T.TURN_END, end.body
        llm.strict = True       # the later turns replay the stored call
        [call] = end.body["message"]["tool_calls"]
        assert call["status"] == "error" and call["arguments"] == {"_raw_arguments": CUT_ARGS}
        for text, answer in (("ok, just tell me the time", "It is noon."), ("hello?", "Hello.")):
            llm.push(Reply.text(answer))
            end = await _chat(c, text)
            assert end.type == T.TURN_END, end.body
            assert end.body["message"]["content"] == answer
        assert llm.rejected == []
        # the last request replays the call: as a JSON object holding the raw text, with its error result
        msgs = llm.requests[-1].body["messages"]
        [issued] = [m for m in msgs if m.get("tool_calls")]
        assert json.loads(issued["tool_calls"][0]["function"]["arguments"]) == {"invalid_arguments": CUT_ARGS}
        result = msgs[msgs.index(issued) + 1]
        assert result["tool_call_id"] == "t1" and "not valid JSON" in orjson.loads(result["content"])["error"]
        await c.close()


async def test_a_call_stopped_by_a_cancel_is_stored_and_replayed_as_a_json_error(tmp_path):
    async with scripted_server(tmp_path) as (srv, addr, llm):
        entered, release = asyncio.Event(), asyncio.Event()

        async def stuck_search(user_id, query, session_id=None, k=5):   # history_search that never answers
            entered.set()
            await release.wait()
            return []

        srv.agent.registry.search = stuck_search
        c = await V3Client.connect(addr)
        llm.push(Reply.tools(ToolCallSpec("h1", "history_search", '{"query": "nginx"}'),
                             ToolCallSpec("k1", "clock", "{}"), text="Checking. "))
        reply = await c.call(T.CHAT_TEXT, text="what did we say about nginx, and what time is it?")
        await c.wait_for(lambda m: m.type == T.TOOL_RESULT and m.body["call"]["tool_name"] == "clock")
        async with asyncio.timeout(10):
            await entered.wait()
        await c.call(T.CHAT_CANCEL)
        end = (await c.turn_events(reply["turn_id"]))[-1]
        release.set()
        assert end.type == T.TURN_END and end.body["finish_reason"] == "cancelled"
        calls = {x["id"]: x for x in end.body["message"]["tool_calls"]}
        assert calls["k1"]["status"] == "success"
        stopped = calls["h1"]
        assert stopped["status"] == "error"
        assert orjson.loads(stopped["result"]) == {"error": "not finished: the turn was cancelled"}
        stored = (await c.call(T.HISTORY_REQUEST))["messages"][-1]
        assert {x["id"]: x["result"] for x in stored["tool_calls"]}["h1"] == stopped["result"]

        llm.push(Reply.text("fine"))
        end = await _chat(c, "next after cancel")
        assert end.type == T.TURN_END, end.body
        msgs = llm.requests[-1].body["messages"]
        replayed = {m["tool_call_id"]: m["content"] for m in msgs if m["role"] == "tool"}
        assert orjson.loads(replayed["h1"]) == {"error": "not finished: the turn was cancelled"}
        assert "utc" in orjson.loads(replayed["k1"])
        await c.close()


def test_a_legacy_bare_interrupted_result_is_replayed_as_json():
    call = ToolCall(id="x1", tool_name="processes", arguments={}, result="interrupted", status="error",
                    duration=0.0, step=0)
    ok = ToolCall(id="x2", tool_name="clock", arguments={}, result='{"utc":"now"}', status="success",
                  duration=0.0, step=0)
    out = history_to_openai([ChatMessage(id=1, role="user", content="q"),
                             ChatMessage(id=2, role="assistant", content="", tool_calls=[call, ok],
                                         metadata={"partial": True})])
    assert [(m["tool_call_id"], m["content"]) for m in out[2:]] == [("x1", UNFINISHED_RESULT), ("x2", '{"utc":"now"}')]
    assert all(isinstance(orjson.loads(m["content"]), dict) for m in out[2:])
