"""CLIENT_LIST / CLIENT_KILL (docs/protocol.md §5.8): request bodies, ClientInfo and the two replies."""
from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import ErrorCode, MsgType, ProtocolError
from protocol.messages import ClientKill, ClientList
from protocol.objects import ClientInfo
from protocol.replies import REPLY_TYPES, ClientKillReply, ClientListReply, ErrorReply, decode_reply

INFO = {"id": 3, "peer": "127.0.0.1:5000", "user": "bob", "session": "s_1", "state": "ready", "proto": "v3",
        "age_s": 1.5, "idle_s": 0.25, "buffered": 0, "output": 12, "me": False}
PRE_HELLO = {**INFO, "id": 4, "user": None, "session": None, "state": "grace", "proto": None, "me": True}

text = st.text(max_size=12)
infos = st.builds(ClientInfo, st.integers(0, 2**53), text, st.one_of(st.none(), text), st.one_of(st.none(), text),
                  text, st.one_of(st.none(), st.sampled_from(["v2", "v3"])),
                  st.floats(0, 1e9), st.floats(0, 1e9), st.integers(0, 2**40), st.integers(0, 2**40), st.booleans())
re = st.one_of(st.none(), st.integers(0, 2**53), st.text(min_size=1, max_size=64))


@given(st.one_of(st.builds(ClientListReply, st.lists(infos, max_size=3).map(tuple), re=re),
                 st.builds(ClientKillReply, st.lists(st.integers(0, 2**53), max_size=3).map(tuple), re=re)))
def test_replies_round_trip_through_json(reply: Any) -> None:
    assert type(reply).decode(orjson.loads(orjson.dumps(reply.encode()))) == reply


@pytest.mark.parametrize("cls,body", [
    (ClientListReply, {"re": 1, "clients": [INFO, PRE_HELLO]}),
    (ClientKillReply, {"re": 2, "killed": [3, 4]}),
])
def test_todays_bodies_encode_back_exactly(cls: type, body: dict[str, Any]) -> None:
    assert orjson.dumps(cls.decode(body).encode()) == orjson.dumps(body)


@pytest.mark.parametrize("cls,body,needle", [
    (ClientListReply, {"re": 1, "clients": [{**INFO, "id": "3"}]}, "field 'clients[0].id'"),
    (ClientListReply, {"re": 1, "clients": [{**INFO, "age_s": None}]}, "field 'clients[0].age_s'"),
    (ClientKillReply, {"re": 2, "killed": [1, "2"]}, "field 'killed': expected an array of connection ids"),
    (ClientKillReply, {"re": 2}, "field 'killed'"),
])
def test_invalid_fields_are_named(cls: type, body: dict[str, Any], needle: str) -> None:
    with pytest.raises(ProtocolError) as info:
        cls.decode(body)
    assert info.value.code is ErrorCode.INVALID_MESSAGE and needle in info.value.message


def test_requests_need_a_filter_to_kill_and_are_registered() -> None:
    assert ClientList.from_body({"id": 1}) == ClientList(1)
    assert ClientKill.from_body({"id": 1, "client_id": 7}) == ClientKill(1, 7)
    with pytest.raises(ProtocolError, match="give client_id, user or peer"):
        ClientKill.from_body({"id": 1})
    with pytest.raises(ProtocolError, match="field 'client_id'"):
        ClientKill.from_body({"id": 1, "client_id": 0})
    assert REPLY_TYPES[MsgType.CLIENT_LIST] is ClientListReply and REPLY_TYPES[MsgType.CLIENT_KILL] is ClientKillReply
    assert isinstance(decode_reply(MsgType.CLIENT_KILL, MsgType.ERROR, {"re": 1, "code": "FORBIDDEN"}), ErrorReply)
