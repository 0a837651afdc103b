"""Helpers for the end-to-end tests: the real server wiring (agent from config, real memory layer)
on 127.0.0.1:0, one chat turn over real TCP, and checks of a turn's event sequence.
"""
from __future__ import annotations

import json
import re
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

from protocol import Message, MsgType
from server.app import Server
from testkit.scripted_llm import ScriptedLLM
from testkit.server import V3Client, answer_text, make_config

T = MsgType
CJK = re.compile(r"[\u3400-\u9fff]")
TURN_DEADLINE = 30.0
API_KEY = "sk-e2e-0123456789abcdef"
MODEL, OTHER_MODEL = "scripted-a", "scripted-b"


@asynccontextmanager
async def real_server(tmp_path: Path, **sections: dict[str, Any]) -> AsyncIterator[tuple[Server, tuple[str, int]]]:
    """A server built by the production wiring: no agent or memory injected.

    ``sections`` are config tables (``llm={...}``, ``tools={...}``, ``summarization={...}``). Without an
    ``llm`` section the factory picks the OfflineAgent; the memory layer is the real MemoryManager.
    """
    cfg = make_config(tmp_path, sections={"llm": {}, **sections})
    srv = Server(cfg)
    host, port = await srv.start()
    try:
        yield srv, (host, port)
    finally:
        await srv.stop()


@asynccontextmanager
async def llm_server(tmp_path: Path, endpoint_models: list[str] | None = None,
                     **llm: Any) -> AsyncIterator[tuple[Server, tuple[str, int], ScriptedLLM]]:
    """The production wiring with the LLM section pointing at a scripted endpoint on loopback.

    Summarization is off so that no background summary call takes a scripted reply meant for a turn.
    ``endpoint_models``: what GET /models answers, set before the server (whose agent fetches it at once)
    starts.
    """
    async with ScriptedLLM(model=MODEL) as scripted:
        if endpoint_models is not None:
            scripted.models = endpoint_models
        section = {"base_url": scripted.base_url, "api_key": API_KEY, "model": MODEL, "models": [OTHER_MODEL],
                   "request_timeout_s": 5.0, "retries": 2, "retry_backoff_s": 0.01, "retry_max_delay_s": 0.05,
                   **llm}
        async with real_server(tmp_path, llm=section, summarization={"enabled": False}) as (srv, addr):
            yield srv, addr, scripted


async def chat(client: V3Client, text: str, **extra: Any) -> tuple[dict[str, Any], list[Message]]:
    """Send one chat message; returns (the CHAT_TEXT reply, every event of its turn in order)."""
    rid = client.next_id()
    reply = await client.call(T.CHAT_TEXT, id=rid, text=text, **extra)
    events = await client.turn_events(reply["turn_id"], timeout=TURN_DEADLINE)
    for ev in events:
        assert ev.body["re"] == rid and ev.body["turn_id"] == reply["turn_id"], ev.body
        assert ev.body["session_id"] == reply["session_id"]
    return reply, events


def names(events: list[Message]) -> list[str]:
    """Event names with statuses spelled out, consecutive deltas collapsed: compact sequence checks."""
    out: list[str] = []
    for ev in events:
        name = MsgType(ev.type).name
        if ev.type == T.TURN_STATUS:
            name = f"STATUS:{ev.body['status']}"
        if not (out and out[-1] == name == "ANSWER_DELTA"):
            out.append(name)
    return out


def calls_of(events: list[Message], msg_type: int) -> list[dict[str, Any]]:
    return [ev.body["call"] for ev in events if ev.type == msg_type]


def check_turn(events: list[Message], text: str, *, tools: int | None = None) -> dict[str, Any]:
    """The shape every completed turn has; returns the stored assistant message from TURN_END.

    TURN_START (with the user message) first, TURN_END last; each TOOL_CALL is "running" and comes
    before the TOOL_RESULT of the same id; deltas have contiguous offsets and add up to the stored
    answer; a "generating" status precedes the first delta.
    """
    assert events[0].type == T.TURN_START and events[0].body["user_message"]["content"] == text
    assert events[0].body["user_message"]["role"] == "user"
    end = events[-1]
    assert end.type == T.TURN_END, end.body
    assert sum(ev.type in (T.TURN_START, T.TURN_END, T.TURN_ERROR) for ev in events) == 2
    assert events[1].type == T.TURN_STATUS and events[1].body["status"] == "thinking"
    started = calls_of(events, T.TOOL_CALL)
    finished = calls_of(events, T.TOOL_RESULT)
    if tools is not None:
        assert len(started) == len(finished) == tools, names(events)
    position = {(ev.type, ev.body["call"]["id"]): i for i, ev in enumerate(events) if "call" in ev.body}
    for call in started:
        assert call["status"] == "running" and call["result"] == "" and call["duration"] == 0
        assert position[(T.TOOL_CALL, call["id"])] < position[(T.TOOL_RESULT, call["id"])]
    for call in finished:
        assert call["status"] in ("success", "error", "timeout") and call["duration"] >= 0
    first_delta = next(i for i, ev in enumerate(events) if ev.type == T.ANSWER_DELTA)
    before = [ev.body["status"] for ev in events[:first_delta] if ev.type == T.TURN_STATUS]
    assert before[-1] == "generating", names(events)
    message = end.body["message"]
    assert answer_text(events) == message["content"] and message["content"]
    assert message["role"] == "assistant"
    return message


async def last_messages(client: V3Client, n: int = 2) -> list[dict[str, Any]]:
    """The newest ``n`` stored messages of the current session, read back over the protocol."""
    page = await client.call(T.HISTORY_REQUEST, limit=n)
    return page["messages"]


async def check_stored(client: V3Client, events: list[Message]) -> dict[str, Any]:
    """The history page holds the user message and the assistant message with every finished ToolCall
    (in the order the calls were announced, results exactly as TOOL_RESULT reported them)."""
    user, assistant = await last_messages(client)
    assert user["role"] == "user" and user == events[0].body["user_message"]
    assert assistant == events[-1].body["message"]
    stored = assistant["tool_calls"]
    assert [c["id"] for c in stored] == [c["id"] for c in calls_of(events, T.TOOL_CALL)]   # the order asked
    finished = {c["id"]: c for c in calls_of(events, T.TOOL_RESULT)}                        # the order done
    assert stored == [finished[c["id"]] for c in stored]
    return assistant


def result_of(call: dict[str, Any]) -> Any:
    return json.loads(call["result"])
