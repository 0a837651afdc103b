"""Typed replies and events (protocol.replies, protocol.server_events, protocol.objects).

Round trips are exact (property tests through real JSON), bodies as the server writes them today
decode and encode back to the same keys in the same order, and every invalid field is named.
"""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Any

import orjson
from pathlib import Path
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import EVENT_CODES, REQUEST_CODES, ErrorCode, MsgType, ProtocolError
from protocol.objects import (AgentInfo, ChatMessage, MemoryItem, ModelInfo, QueuedTurn, SearchHit, SessionInfo, Summary,
                              ToolCall, TurnState)
from protocol.replies import (REPLY_TYPES, ChatCancelReply, ChatSendReply, ErrorReply, HelloReply,
                              HistoryExportReply, HistoryPageReply, HistorySearchReply, MemoryForgetReply,
                              MemoryListReply, ModelListReply,
                              ModelSwitchReply, Pong, Reply, SessionClearReply, SessionDeleteReply,
                              SessionListReply, SessionReply, SessionSwitchReply, StatsReply, decode_reply)
from protocol.server_events import (EVENT_TYPES, AnswerDelta, Notice, ServerEvent, SessionEvent, ToolCallEvent,
                                    ToolResultEvent, TurnEnd, TurnError, TurnStart, TurnStatus, decode_event)

SRC = Path(__file__).resolve().parents[2] / "src"

# ---------------------------------------------------------------- strategies
text = st.text(max_size=12)
ident = st.text(min_size=1, max_size=12)
count = st.integers(0, 2**53)
request_id = st.one_of(st.integers(0, 2**53), st.text(min_size=1, max_size=64))
re = st.one_of(st.none(), request_id)
number = st.one_of(st.integers(0, 10**9), st.floats(allow_nan=False, allow_infinity=False, width=64))
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), text)
json_obj = st.dictionaries(text, st.one_of(json_leaf, st.lists(json_leaf, max_size=3)), max_size=3)
opt = st.none

tool_calls = st.builds(ToolCall, ident, ident, json_obj, text, st.sampled_from(["running", "success", "error"]),
                       number, text, st.integers(0, 50))
messages = st.builds(ChatMessage, st.one_of(st.none(), count), st.sampled_from(["user", "assistant", "tool"]),
                     text, text, st.lists(tool_calls, max_size=2).map(tuple), json_obj)
summaries = st.builds(Summary, text, count, text, text, st.one_of(st.none(), count))
sessions = st.builds(SessionInfo, ident, text, text, text, count, text, st.one_of(st.none(), text),
                     st.booleans(), st.one_of(st.none(), summaries))
turn_states = st.builds(TurnState, ident, ident, messages, st.sampled_from(["thinking", "generating"]), text,
                        st.lists(tool_calls, max_size=2).map(tuple), text,
                        st.lists(st.builds(QueuedTurn, ident, messages), max_size=2).map(tuple))
agents = st.builds(AgentInfo, text, st.booleans(), text)
kw = {"re": re, "truncated": st.booleans()}

REPLIES: list[st.SearchStrategy[Any]] = [
    st.builds(HelloReply, text, count, text, sessions, st.booleans(), st.one_of(st.none(), turn_states),
              json_obj, st.lists(text, max_size=3).map(tuple), st.one_of(st.none(), agents), **kw),
    st.builds(SessionListReply, st.lists(sessions, max_size=2).map(tuple), st.booleans(),
              st.one_of(st.none(), text), **kw),
    st.builds(SessionReply, sessions, **kw),
    st.builds(SessionSwitchReply, sessions, st.one_of(st.none(), turn_states), **kw),
    st.builds(SessionDeleteReply, ident, sessions, **kw),
    st.builds(SessionClearReply, sessions, count, **kw),
    st.builds(HistoryPageReply, ident, st.lists(messages, max_size=3).map(tuple), st.booleans(),
              st.one_of(st.none(), st.integers(1, 2**53)), count, **kw),
    st.builds(HistorySearchReply, st.lists(st.builds(SearchHit, ident, text, count, text, text, text, number),
                                           max_size=2).map(tuple), **kw),
    st.builds(HistoryExportReply, ident, st.sampled_from(["markdown", "json"]), text, **kw),
    st.builds(ChatSendReply, ident, ident, messages, count, **kw),
    st.builds(ChatCancelReply, ident, st.booleans(), st.booleans(), **kw),
    st.builds(ModelListReply, st.lists(st.builds(ModelInfo, text, st.booleans(), st.booleans()),
                                       max_size=3).map(tuple), text, **kw),
    st.builds(ModelSwitchReply, ident, text, **kw),
    st.builds(StatsReply, number, count, count, count, count, count, count, agents, text, **kw),
    st.builds(MemoryListReply, st.booleans(), st.lists(st.builds(MemoryItem, ident, st.sampled_from(
        ["fact", "preference"]), text, ident, count, text, text), max_size=2).map(tuple), **kw),
    st.builds(MemoryForgetReply, ident, **kw),
    st.builds(Pong, text, **kw),
    st.builds(ErrorReply, st.sampled_from(list(ErrorCode)), text, st.booleans(), **kw),
]
EVENTS: list[st.SearchStrategy[Any]] = [
    st.builds(TurnStart, ident, ident, messages, text, **kw),
    st.builds(TurnStatus, ident, ident, st.sampled_from(["thinking", "tool_call", "generating"]),
              st.one_of(st.none(), text), **kw),
    st.builds(ToolCallEvent, ident, ident, tool_calls, **kw),
    st.builds(ToolResultEvent, ident, ident, tool_calls, **kw),
    st.builds(AnswerDelta, ident, ident, text, count, **kw),
    st.builds(TurnEnd, ident, ident, st.one_of(st.none(), messages), json_obj,
              st.sampled_from(["stop", "length", "max_iterations", "cancelled"]), json_obj,
              st.one_of(st.none(), messages), st.booleans(), **kw),
    st.builds(TurnError, ident, ident, st.sampled_from(list(ErrorCode)), text, st.one_of(st.none(), messages), **kw),
    st.builds(SessionEvent, st.sampled_from(["created", "renamed", "updated"]), sessions, **kw),
    st.builds(Notice, st.sampled_from(["info", "warning"]), ident, text, st.one_of(st.none(), ident), **kw),
]


def through_json(body: dict[str, Any]) -> dict[str, Any]:
    return orjson.loads(orjson.dumps(body))


# ---------------------------------------------------------------- round trips
@given(st.one_of(*REPLIES, *EVENTS))
def test_decode_of_encode_is_the_same_object_through_json(obj: Any) -> None:
    body = through_json(obj.encode())
    again = type(obj).decode(body)
    assert again == obj
    assert again.encode() == body
    assert list(again.encode()) == list(body)  # same keys, same order


@given(st.one_of(*REPLIES, *EVENTS), json_obj)
def test_unknown_fields_are_ignored(obj: Any, extra: dict[str, Any]) -> None:
    body = obj.encode()
    known = set(body)
    noisy = {**{k: v for k, v in extra.items() if k not in known}, **body}
    assert type(obj).decode(noisy) == obj


@given(st.one_of(*EVENTS))
def test_decode_event_uses_the_registry(event: ServerEvent) -> None:
    assert decode_event(event.TYPE, through_json(event.encode())) == event


@given(st.one_of(*REPLIES))
def test_truncated_is_encoded_only_when_set(reply: Reply) -> None:
    body = reply.encode()
    assert ("truncated" in body) == reply.truncated
    if reply.truncated:
        assert list(body)[-1] == "truncated"
    assert list(body)[0] == "re"


def test_re_is_a_keyword_field_that_can_be_set_later() -> None:
    reply = ModelSwitchReply("s1", "offline")
    assert reply.encode() == {"re": None, "session_id": "s1", "model": "offline"}
    assert dataclasses.replace(reply, re=7).encode() == {"re": 7, "session_id": "s1", "model": "offline"}
    delta = AnswerDelta("s1", "t1", "hi", 0)
    assert dataclasses.replace(delta, re="r-1").encode()["re"] == "r-1"


def test_objects_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Pong("now").time = "later"  # type: ignore[misc]


# ---------------------------------------------------------------- today's bodies, exactly
MSG = {"id": 3, "role": "user", "content": "hello", "timestamp": "2026-11-22T10:15:00+00:00", "tool_calls": [],
       "metadata": {}}
QUEUED = {"id": None, "role": "user", "content": "later", "timestamp": "2026-11-22T10:15:00+00:00",
          "tool_calls": [], "metadata": {"queued": True}}
CALL = {"id": "call_1", "tool_name": "sys_monitor", "arguments": {"metric": "cpu"}, "result": "",
        "status": "running", "duration": 0, "timestamp": "2026-11-22T10:15:00+00:00", "step": 0}
INFO = {"session_id": "s_1", "title": "Chat", "created_at": "c", "updated_at": "u", "message_count": 2,
        "preview": "hello", "model": "offline", "running": False,
        "summary": {"text": "sum", "covers_from_id": 1, "covers_to_id": 40, "created_at": "c", "model": "m"}}
STATE = {"turn_id": "t_1", "session_id": "s_1", "user_message": MSG, "status": "generating", "content": "so far",
         "tool_calls": [{**CALL, "result": "42%", "status": "success", "duration": 0.012}], "started_at": "x",
         "queued": [{"turn_id": "t_2", "user_message": QUEUED}]}
AGENT = {"name": "offline", "offline": True, "model": "offline"}

TODAY: list[tuple[type, dict[str, Any]]] = [
    (HelloReply, {"re": 1, "server": "nplt-assistant/0.1.0", "proto": 3, "user": "local", "session": INFO,
                  "session_restored": True, "running_turn": STATE, "limits": {"max_message_size": 8388608},
                  "capabilities": ["sessions", "chat"], "agent": AGENT}),
    (SessionListReply, {"re": 2, "sessions": [{**INFO, "summary": None}], "has_more": True, "next_before": "cur"}),
    (SessionReply, {"re": "a", "session": INFO}),
    (SessionSwitchReply, {"re": 3, "session": INFO, "running_turn": None}),
    (SessionDeleteReply, {"re": 4, "session_id": "s_0", "current": INFO}),
    (SessionClearReply, {"re": 5, "session": INFO, "cleared": 4}),
    (HistoryPageReply, {"re": 6, "session_id": "s_1", "messages": [MSG], "has_more": False, "next_before": 3,
                        "total": 1}),
    (HistorySearchReply, {"re": 7, "hits": [{"session_id": "s_1", "title": "Chat", "message_id": 3, "role": "user",
                                             "snippet": "[hello]", "timestamp": "x", "score": -1.5}]}),
    (HistoryExportReply, {"re": 8, "session_id": "s_1", "format": "markdown", "content": "# Chat"}),
    (ChatSendReply, {"re": 9, "turn_id": "t_2", "session_id": "s_1", "user_message": QUEUED, "queued": 1}),
    (ChatCancelReply, {"re": 10, "turn_id": "t_2", "cancelled": True, "withdrawn": True}),
    (ModelListReply, {"re": 11, "models": [{"name": "offline", "offline": True, "default": True}],
                      "current": "offline"}),
    (ModelSwitchReply, {"re": 12, "session_id": "s_1", "model": "offline"}),
    (StatsReply, {"re": 13, "uptime_s": 1.25, "clients": 1, "sessions_loaded": 1, "turns_total": 0,
                  "turns_running": 0, "refused_total": 0, "slow_consumers_total": 0, "agent": AGENT,
                  "version": "0.1.0"}),
    (Pong, {"re": 14, "time": "x"}),
    (ErrorReply, {"re": None, "code": "SHUTTING_DOWN", "message": "bye", "fatal": True}),
    (TurnStart, {"re": 9, "session_id": "s_1", "turn_id": "t_1", "user_message": MSG, "model": "offline"}),
    (TurnStatus, {"re": None, "session_id": "s_1", "turn_id": "t_1", "status": "thinking"}),
    (TurnStatus, {"re": None, "session_id": "s_1", "turn_id": "t_1", "status": "tool_call", "detail": "sys"}),
    (ToolCallEvent, {"re": None, "session_id": "s_1", "turn_id": "t_1", "call": CALL}),
    (ToolResultEvent, {"re": None, "session_id": "s_1", "turn_id": "t_1",
                       "call": {**CALL, "result": "ok", "status": "success", "duration": 0.5}}),
    (AnswerDelta, {"re": 9, "session_id": "s_1", "turn_id": "t_1", "text": "Hi", "offset": 0}),
    (TurnEnd, {"re": 9, "session_id": "s_1", "turn_id": "t_1", "message": {**MSG, "role": "assistant"},
               "usage": {"total_tokens": 3}, "finish_reason": "stop", "context": {"turns_kept": 1}}),
    (TurnEnd, {"re": None, "session_id": "s_1", "turn_id": "t_2", "message": None, "user_message": QUEUED,
               "usage": {}, "finish_reason": "cancelled", "context": {}, "withdrawn": True}),
    (TurnError, {"re": 9, "session_id": "s_1", "turn_id": "t_1", "code": "LLM_ERROR", "message": "down",
                 "partial_message": None}),
    (SessionEvent, {"re": None, "kind": "renamed", "session": INFO}),
    (Notice, {"re": None, "level": "warning", "code": "SUMMARY_FAILED", "message": "fell back",
              "session_id": "s_1"}),
    (AnswerDelta, {"re": 9, "session_id": "s_1", "turn_id": "t_1", "text": "cut", "offset": 0, "truncated": True}),
    (MemoryListReply, {"re": 15, "enabled": True, "items": [
        {"id": "m1", "kind": "fact", "text": "prod DB host is db-prod-42", "session_id": "s_1", "message_id": 3,
         "created_at": "2026-11-20T10:15:00+00:00", "source": "rules"}]}),
    (MemoryForgetReply, {"re": 16, "item_id": "m1"}),
]


@pytest.mark.parametrize("cls,body", TODAY, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(TODAY)])
def test_todays_bodies_encode_back_exactly(cls: type, body: dict[str, Any]) -> None:
    obj = cls.decode(body)
    assert orjson.dumps(obj.encode()) == orjson.dumps(body)  # byte for byte: same keys, order, values


def test_decoded_values_are_typed() -> None:
    hello = HelloReply.decode(TODAY[0][1])
    assert isinstance(hello.session, SessionInfo) and isinstance(hello.session.summary, Summary)
    assert hello.running_turn is not None and hello.running_turn.queued[0].user_message.queued
    assert hello.running_turn.tool_calls[0].result == "42%"
    assert hello.capabilities == ("sessions", "chat") and hello.agent == AgentInfo("offline", True, "offline")
    err = ErrorReply.decode(TODAY[15][1])
    assert err.code is ErrorCode.SHUTTING_DOWN and err.error().fatal
    assert TurnError.decode(TODAY[24][1]).code is ErrorCode.LLM_ERROR
    assert SessionEvent.decode(TODAY[25][1]).session_id == "s_1"


# ---------------------------------------------------------------- invalid bodies
BAD: list[tuple[type, dict[str, Any], str]] = [
    (AnswerDelta, {"session_id": "s", "turn_id": "t", "text": "x"}, "field 'offset': missing (required)"),
    (AnswerDelta, {"session_id": "s", "turn_id": "t", "text": "x", "offset": -1}, "field 'offset': expected an integer >= 0"),
    (AnswerDelta, {"session_id": "s", "turn_id": "t", "text": 5, "offset": 0}, "field 'text': expected a string, got 5"),
    (AnswerDelta, {"session_id": "s", "turn_id": "t", "text": "x", "offset": True}, "field 'offset'"),
    (AnswerDelta, {"re": -1, "session_id": "s", "turn_id": "t", "text": "x", "offset": 0}, "field 're'"),
    (AnswerDelta, {"re": "", "session_id": "s", "turn_id": "t", "text": "x", "offset": 0}, "field 're'"),
    (TurnStart, {"session_id": "s", "turn_id": "t", "user_message": {**MSG, "id": "3"}, "model": "m"},
     "field 'user_message.id': expected an integer >= 0, got '3'"),
    (TurnStart, {"session_id": "s", "turn_id": "t", "user_message": [], "model": "m"},
     "field 'user_message': expected an object, got []"),
    (HistoryPageReply, {"re": 1, "session_id": "s", "messages": [MSG, {**MSG, "tool_calls": [{**CALL, "step": "0"}]}]},
     "field 'messages[1].tool_calls[0].step'"),
    (HistoryPageReply, {"re": 1, "session_id": "s", "messages": {}}, "field 'messages': expected an array"),
    (SessionReply, {"re": 1, "session": {**INFO, "running": "no"}}, "field 'session.running': expected a boolean"),
    (SessionReply, {"re": 1, "session": {**INFO, "summary": {"text": "x"}}},
     "field 'session.summary.covers_to_id': missing (required)"),
    (HelloReply, {**TODAY[0][1], "capabilities": ["a", 1]}, "field 'capabilities[1]': expected a string"),
    (HelloReply, {**TODAY[0][1], "limits": []}, "field 'limits': expected an object"),
    (ErrorReply, {"re": 1, "code": "NO_SUCH_CODE", "message": "x"}, "field 'code': expected an error code"),
    (TurnError, {"session_id": "s", "turn_id": "t", "code": 3, "message": "x"}, "field 'code'"),
    (StatsReply, {**TODAY[13][1], "uptime_s": "1"}, "field 'uptime_s': expected a number"),
    (TurnEnd, {"session_id": "s", "turn_id": "t", "message": None, "finish_reason": None},
     "field 'finish_reason': expected a value, got None"),
]


@pytest.mark.parametrize("cls,body,needle", BAD, ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(BAD)])
def test_invalid_fields_are_named(cls: type, body: dict[str, Any], needle: str) -> None:
    with pytest.raises(ProtocolError) as info:
        cls.decode(body)
    assert info.value.code is ErrorCode.INVALID_MESSAGE and not info.value.fatal
    assert needle in info.value.message


@pytest.mark.parametrize("body", [[], "x", None, 3])
def test_a_body_that_is_not_an_object_is_invalid(body: Any) -> None:
    with pytest.raises(ProtocolError, match="JSON object") as info:
        Pong.decode(body)
    assert info.value.code is ErrorCode.INVALID_MESSAGE


# ---------------------------------------------------------------- registries
def test_every_request_has_a_reply_class_and_every_event_a_class() -> None:
    assert set(REPLY_TYPES) == set(REQUEST_CODES)
    assert set(EVENT_TYPES) == set(EVENT_CODES)
    assert all(cls.TYPE == t for t, cls in EVENT_TYPES.items())


def test_decode_reply_picks_the_class_from_the_frame() -> None:
    body = {"re": 1, "session_id": "s", "model": "m"}
    assert decode_reply(MsgType.MODEL_SWITCH, MsgType.RESPONSE, body) == ModelSwitchReply("s", "m", re=1)
    assert decode_reply(MsgType.PING, MsgType.PONG, {"re": 1, "time": "x"}) == Pong("x", re=1)
    err = decode_reply(MsgType.MODEL_SWITCH, MsgType.ERROR, {"re": 1, "code": "UNKNOWN_MODEL", "message": "no"})
    assert err == ErrorReply(ErrorCode.UNKNOWN_MODEL, "no", re=1)
    with pytest.raises(ProtocolError, match="PONG is not a reply to MODEL_SWITCH"):
        decode_reply(MsgType.MODEL_SWITCH, MsgType.PONG, body)
    with pytest.raises(ProtocolError, match="is not a reply to TURN_START"):
        decode_reply(MsgType.TURN_START, MsgType.RESPONSE, body)


def test_decode_event_rejects_a_frame_that_is_not_an_event() -> None:
    with pytest.raises(ProtocolError, match="RESPONSE is not an event") as info:
        decode_event(MsgType.RESPONSE, {"re": 1})
    assert info.value.code is ErrorCode.INVALID_MESSAGE


def test_typed_bodies_are_sans_io() -> None:
    code = ("import sys; import protocol.replies, protocol.server_events, protocol.objects; "
            "assert 'asyncio' not in sys.modules and 'socket' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": str(SRC)})
