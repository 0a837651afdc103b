"""Review s33, protocol conformance (sans-IO):

- a request id of 2^64 or more is refused naming it "a number over 2^64-1" (docs/protocol.md §3: an
  integer id is below 2^64). Before, orjson read 18446744073709551616 as a float and the error quoted
  "got 1.8446744073709552e+19", which the client never sent; an int id of 2^64 or more built in
  Python passed the check;
- CLIENT_KILL's ``peer`` must be "ip:port", "[ipv6]:port" or an ip address (§5.9); anything else is
  INVALID_MESSAGE naming the field (before: "not an ip" went on to match nothing and was answered
  NOT_FOUND, the answer for a well-formed filter that matches nothing).
"""
from __future__ import annotations

from ipaddress import ip_address

import orjson
import pytest

from protocol import Connection, ErrorCode, InvalidMessage, Message, MsgType, ProtocolError, Role
from protocol.fields import MAX_INT_ID, Fields, valid_request_id
from protocol.kb import KbUploadEnd
from protocol.messages import ClientKill, Ping, SessionList, parse_request, peer_forms, request_id

TOO_BIG = b"18446744073709551616"          # 2**64, which orjson reads as a float


def _error(cls: type, body: dict) -> ProtocolError:
    with pytest.raises(ProtocolError) as exc:
        cls.from_body(body)
    assert exc.value.code is ErrorCode.INVALID_MESSAGE and not exc.value.fatal
    return exc.value


@pytest.mark.parametrize("cls, rest", [(SessionList, b""), (Ping, b""), (KbUploadEnd, b',"upload_id":"up_1"')])
def test_an_id_over_2_64_minus_1_is_named_as_such_not_as_a_float(cls, rest):
    body = orjson.loads(b'{"id":' + TOO_BIG + rest + b"}")
    assert type(body["id"]) is float                       # what orjson makes of it
    message = str(_error(cls, body))
    assert "field 'id': expected a non-negative integer or a string of 1..64 characters" in message
    assert message.endswith("got a number over 2^64-1") and "e+19" not in message, message


def test_python_ints_of_2_64_or_more_are_no_request_ids():
    assert valid_request_id(MAX_INT_ID) and valid_request_id(0)
    assert not valid_request_id(MAX_INT_ID + 1) and not valid_request_id(1 << 70)
    assert str(_error(SessionList, {"id": 1 << 64})).endswith("got a number over 2^64-1")
    assert request_id({"id": 1 << 64}) is None
    assert SessionList.from_body({"id": MAX_INT_ID}).id == MAX_INT_ID


def test_a_negative_id_below_minus_2_63_and_a_re_over_2_64():
    body = orjson.loads(b'{"id":-9223372036854775809}')
    assert str(_error(SessionList, body)).endswith("got a negative number")
    with pytest.raises(ProtocolError) as exc:
        Fields(orjson.loads(b'{"re":' + TOO_BIG + b"}")).re()
    assert str(exc.value).endswith("got a number over 2^64-1") and "'re': expected null, a non-negative" in str(exc.value)


def test_over_the_wire_the_server_codec_reports_it_with_re_null():
    server, client = Connection(Role.SERVER), Connection(Role.CLIENT)
    events = server.receive_data(client.send(MsgType.HELLO, {"id": 1, "proto": 3, "client": "t"}))
    assert [type(e) for e in events] == [Message]
    for t in (MsgType.SESSION_LIST, MsgType.PING):
        out: list[bytes] = []
        (msg,) = server.receive_and_pong(client.send_raw(t, b'{"id":' + TOO_BIG + b"}"), "now", out)
        assert out == []                                   # no PONG for that PING: it is reported
        req = parse_request(msg)
        assert type(req) is InvalidMessage and req.re is None
        assert req.error.message.endswith("got a number over 2^64-1"), req.error.message


@pytest.mark.parametrize("peer", ["not an ip", "localhost", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:x",
                                  "[127.0.0.1]:80", "[::1", "::1]:80", ":80", "1.2.3.4:5:6", "127.0.0.1:٣"])
def test_client_kill_refuses_a_peer_that_is_no_address(peer):
    err = _error(ClientKill, {"id": 1, "peer": peer})
    assert err.message.startswith("field 'peer': expected \"ip:port\", \"[ipv6]:port\" or an ip address, got"), err


@pytest.mark.parametrize("peer, forms", [
    ("127.0.0.1", [("127.0.0.1", None)]),
    ("127.0.0.1:5000", [("127.0.0.1", 5000)]),
    ("[::1]:5000", [("::1", 5000)]),
    ("[::1]", [("::1", None)]),
    ("::1", [("::1", None)]),
    ("::1:54321", [("::1", 54321)]),                       # as a peer without brackets is shown
    ("::1:5000", [("::1:5000", None), ("::1", 5000)]),     # both readings
    ("::ffff:10.0.0.1", [("10.0.0.1", None)]),             # a dual-stack socket's IPv4 peer
])
def test_client_kill_accepts_addresses_and_reads_them(peer, forms):
    assert ClientKill.from_body({"id": 1, "peer": peer}).peer == peer
    assert peer_forms(peer) == tuple((ip_address(a), p) for a, p in forms)
