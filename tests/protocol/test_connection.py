"""Connection: round trips, version detection, partial frames at every split point, seq numbering."""
from __future__ import annotations

import ssl

import pytest

from protocol import (BINARY_TYPES, V2_ONLY_TYPES, V2_TYPES, Connection, ErrorCode, InvalidMessage, Message, MsgType,
                      ProtocolError, ProtocolVersion, Role, encode_frame)

V3, V2, UNKNOWN = ProtocolVersion.V3, ProtocolVersion.V2, ProtocolVersion.UNKNOWN
HELLO = {"id": 0, "proto": 3, "client": "test/1"}


def feed(conn: Connection, data: bytes, size: int) -> list:
    """Feed ``data`` in chunks of ``size`` bytes; collect the events."""
    events: list = []
    for i in range(0, len(data), size):
        events += conn.receive_data(data[i:i + size])
    return events


def v3_pair() -> tuple[Connection, Connection]:
    """A client and a server that completed the version detection."""
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    assert server.receive_data(client.send(MsgType.HELLO, HELLO))[0].body == HELLO
    return client, server


def body_for(t: MsgType) -> dict:
    return {"id": f"r{int(t)}", "re": 7, "text": "héllo ✓", "n": [1, 2.5, None, True], "t": t.name}


def test_client_starts_v3_and_server_unknown() -> None:
    assert Connection(Role.CLIENT).version is V3
    assert Connection("server").version is UNKNOWN
    assert Connection(Role.CLIENT, version=V2).version is V2
    server = Connection(Role.SERVER)
    assert server.role is Role.SERVER and not server.closed and not server.eof
    assert server.bytes_buffered == 0 and server.seq_anomalies == 0


@pytest.mark.parametrize("sender_role", [Role.CLIENT, Role.SERVER])
def test_v3_round_trip_of_every_type(sender_role: Role) -> None:
    client, server = v3_pair()
    sender, receiver = (client, server) if sender_role is Role.CLIENT else (server, client)
    # JSON bodies (the v2-only types are UNSUPPORTED on v3 unread: tests/protocol/test_v3_type_checks.py)
    types = [t for t in MsgType if t is not MsgType.FRAGMENT and t not in BINARY_TYPES and t not in V2_ONLY_TYPES]
    stream = b"".join(sender.send(t, body_for(t)) for t in types)
    events = receiver.receive_data(stream)
    first = 1 if sender is client else 0        # the HELLO already used seq 0 on the client
    assert [e.type for e in events] == types
    assert all(isinstance(e.type, MsgType) for e in events)
    assert [e.body for e in events] == [body_for(t) for t in types]
    assert [e.seq for e in events] == list(range(first, first + len(types)))


@pytest.mark.parametrize("sender_role", [Role.CLIENT, Role.SERVER])
def test_v2_round_trip_of_every_v2_type(sender_role: Role) -> None:
    client = Connection(Role.CLIENT, version=V2)
    server = Connection(Role.SERVER)
    assert server.receive_data(client.send(MsgType.CHAT_TEXT, "hi"))[0].text == "hi"
    assert server.version is V2
    sender, receiver = (client, server) if sender_role is Role.CLIENT else (server, client)
    types = sorted(V2_TYPES)
    stream = b"".join(sender.send(t, f"text {t.name} ✓") for t in types)
    events = receiver.receive_data(stream)
    assert [(e.type, e.text) for e in events] == [(t, f"text {t.name} ✓") for t in types]
    assert all(isinstance(e.body, bytes) for e in events)
    assert receiver.seq_anomalies == 0


def test_v2_send_accepts_bytes_dict_and_buffers() -> None:
    conn = Connection(Role.SERVER, version=V2)
    peer = Connection(Role.CLIENT, version=V2)
    frames = (conn.send(MsgType.AGENT_THOUGHT, {"type": "thinking", "content": "x"})
              + conn.send(MsgType.CHAT_TEXT, bytearray(b"ab")) + conn.send(MsgType.CHAT_TEXT))
    events = peer.receive_data(frames)
    assert events[0].body == b'{"type":"thinking","content":"x"}'
    assert [e.body for e in events[1:]] == [b"ab", b""]


def test_v3_send_takes_bytes_as_encoded_json() -> None:
    client, server = v3_pair()
    data = client.send(MsgType.PING, b'{"id":5}') + client.send(MsgType.PING, memoryview(b'{"id":6}'))
    assert [e.body for e in server.receive_data(data)] == [{"id": 5}, {"id": 6}]


def test_server_detects_v3_from_hello_and_v2_otherwise() -> None:
    server = Connection(Role.SERVER)
    hello = Connection(Role.CLIENT).send(MsgType.HELLO, HELLO)
    assert server.receive_data(hello[:4]) == [] and server.version is UNKNOWN
    assert server.receive_data(hello[4:9]) == [] and server.version is UNKNOWN
    assert server.receive_data(hello[9:])[0].type is MsgType.HELLO
    assert server.version is V3
    for first in (MsgType.CHAT_TEXT, MsgType.SESSION_LIST, 0x99):
        server = Connection(Role.SERVER)
        events = server.receive_data(encode_frame(first, 0, b"plain"))
        assert server.version is V2 and events[0].body == b"plain" and events[0].type == first


def test_version_detection_on_a_frame_split_across_reads() -> None:
    for first, version in ((MsgType.HELLO, V3), (MsgType.CHAT_TEXT, V2)):
        server = Connection(Role.SERVER)
        frame = encode_frame(first, 0, b'{"id": 1, "proto": 3, "client": "c"}')
        assert server.receive_data(frame[:7]) == [] and server.version is UNKNOWN
        assert server.bytes_buffered == 7
        assert len(server.receive_data(frame[7:])) == 1 and server.version is version
        assert server.bytes_buffered == 0


def test_set_legacy_only_while_unknown() -> None:
    server = Connection(Role.SERVER)
    server.set_legacy()
    assert server.version is V2
    assert Connection(Role.CLIENT, version=V2).receive_data(server.send(MsgType.CHAT_TEXT, "w"))[0].text == "w"
    _, v3 = v3_pair()
    v3.set_legacy()
    assert v3.version is V3


def test_send_before_version_is_known_is_a_programming_error() -> None:
    with pytest.raises(RuntimeError, match="set_legacy"):
        Connection(Role.SERVER).send(MsgType.CHAT_TEXT, b"x")


def mixed_stream() -> tuple[bytes, list[tuple[int, object]]]:
    """HELLO then frames of many shapes, and the events they must give."""
    client = Connection(Role.CLIENT)
    parts = [client.send(MsgType.HELLO, HELLO), client.send(MsgType.PING, {"id": 1}),
             client.send_raw(MsgType.CHAT_TEXT, b""),                   # empty payload
             client.send(MsgType.CHAT_TEXT, {"id": 2, "text": "é" * 300}),
             client.send_raw(0x99, b'{"id": 3}'),                      # unknown type
             client.send_raw(MsgType.STATS, b"[1, 2]"),                # not an object
             client.send(MsgType.STATS, {"id": 4})]
    expected = [(MsgType.HELLO, HELLO), (MsgType.PING, {"id": 1}),
                (MsgType.CHAT_TEXT, ErrorCode.INVALID_JSON),
                (MsgType.CHAT_TEXT, {"id": 2, "text": "é" * 300}), (0x99, ErrorCode.UNKNOWN_TYPE),
                (MsgType.STATS, ErrorCode.INVALID_JSON), (MsgType.STATS, {"id": 4})]
    return b"".join(parts), expected


def summary(events: list) -> list[tuple[int, object]]:
    return [(e.type, e.body if isinstance(e, Message) else e.error.code) for e in events]


def test_every_split_point_of_a_mixed_stream() -> None:
    stream, expected = mixed_stream()
    for cut in range(len(stream) + 1):
        server = Connection(Role.SERVER)
        events = server.receive_data(stream[:cut]) if cut else []
        events += server.receive_data(stream[cut:]) if cut < len(stream) else []
        assert summary(events) == expected, cut
        assert server.bytes_buffered == 0


def test_two_split_points_and_byte_by_byte() -> None:
    stream, expected = mixed_stream()
    assert summary(feed(Connection(Role.SERVER), stream, 1)) == expected
    for a in range(0, len(stream), 7):
        for b in range(a, len(stream), 13):
            server = Connection(Role.SERVER)
            events = []
            for chunk in (stream[:a], stream[a:b], stream[b:]):
                if chunk:
                    events += server.receive_data(chunk)
            assert summary(events) == expected, (a, b)


def test_split_points_around_fragment_boundaries() -> None:
    client, _ = v3_pair()
    big = {"id": 9, "content": "z" * 150_000}
    stream = client.send(MsgType.HISTORY_EXPORT, big) + client.send(MsgType.PING, {"id": 10})
    cuts = {c for k in range(4) for c in range(k * 65540 - 8, k * 65540 + 9)}
    cuts |= set(range(0, len(stream), 4099)) | {len(stream) - 1}
    for cut in sorted(c for c in cuts if 0 < c < len(stream)):
        _, server = v3_pair()
        events = server.receive_data(stream[:cut]) + server.receive_data(stream[cut:])
        assert [(e.type, e.body) for e in events] == [(MsgType.HISTORY_EXPORT, big),
                                                      (MsgType.PING, {"id": 10})], cut
        assert server.bytes_buffered == 0


def test_input_may_be_any_bytes_like() -> None:
    stream, expected = mixed_stream()
    server = Connection(Role.SERVER)
    events = server.receive_data(bytearray(stream[:50])) + server.receive_data(memoryview(stream)[50:])
    assert summary(events) == expected


def test_outgoing_seq_wraps_at_65535() -> None:
    client = Connection(Role.CLIENT)
    frames = [client.send(MsgType.PING, b"{}") for _ in range(65538)]
    seqs = [int.from_bytes(f[1:3], "big") for f in frames]
    assert seqs[:2] == [0, 1] and seqs[65535] == 65535 and seqs[65536:] == [0, 1]
    raw = Connection(Role.CLIENT)
    assert [raw.send_raw(0x01, b"")[1:3] for _ in range(65537)][-1] == b"\x00\x00"


@pytest.mark.parametrize("sender_role", [Role.CLIENT, Role.SERVER])
def test_seq_wrap_is_accepted_in_both_directions(sender_role: Role) -> None:
    client, server = v3_pair()
    sender, receiver = (client, server) if sender_role is Role.CLIENT else (server, client)
    stream = b"".join(sender.send(MsgType.PING, b'{"id":1}') for _ in range(65540))
    events = feed(receiver, stream, 65536)
    assert len(events) == 65540 and all(isinstance(e, Message) for e in events)
    first = events[0].seq
    assert [e.seq for e in events[65535 - first:65538 - first]] == [65535, 0, 1]


def test_v2_seq_wrap_is_not_an_anomaly() -> None:
    sender = Connection(Role.CLIENT, version=V2)
    receiver = Connection(Role.SERVER)
    stream = b"".join(sender.send(MsgType.CHAT_TEXT, b"x") for _ in range(65538))
    assert len(feed(receiver, stream, 50_000)) == 65538 and receiver.seq_anomalies == 0


def test_seq_gap_is_fatal_in_v3() -> None:
    client, server = v3_pair()
    good = client.send(MsgType.PING, {"id": 1})
    gap = encode_frame(MsgType.PING, 5, b'{"id": 2}')
    with pytest.raises(ProtocolError) as info:
        server.receive_data(good + gap + client.send(MsgType.PING, {"id": 3}))
    err = info.value
    assert err.code is ErrorCode.SEQ_MISMATCH and err.fatal and "expected frame seq 2, got 5" in err.message
    assert [e.body for e in err.events] == [{"id": 1}]
    assert server.closed and server.bytes_buffered == 0
    with pytest.raises(ProtocolError) as info:
        server.receive_data(good)
    assert info.value.code is ErrorCode.CONNECTION_CLOSED and info.value.fatal
    with pytest.raises(ProtocolError, match="CONNECTION_CLOSED"):
        server.send(MsgType.PONG, {"re": 1})


def test_seq_gap_on_a_frame_split_across_reads_is_fatal() -> None:
    _, server = v3_pair()
    frame = encode_frame(MsgType.PING, 9, b'{"id": 2}')
    assert server.receive_data(frame[:3]) == []
    with pytest.raises(ProtocolError, match="SEQ_MISMATCH"):
        server.receive_data(frame[3:])


def test_seq_gap_is_counted_but_tolerated_in_v2() -> None:
    server = Connection(Role.SERVER)
    frames = [encode_frame(MsgType.CHAT_TEXT, s, b"m") for s in (0, 1, 7, 8, 9, 3, 4)]
    events = server.receive_data(b"".join(frames[:5]))
    events += server.receive_data(frames[5][:2]) + server.receive_data(frames[5][2:] + frames[6])
    assert [e.seq for e in events] == [0, 1, 7, 8, 9, 3, 4]
    assert server.seq_anomalies == 2 and not server.closed


def test_message_text_helper() -> None:
    assert Message(MsgType.CHAT_TEXT, "ok ✓".encode(), 0).text == "ok ✓"
    with pytest.raises(ProtocolError) as info:
        Message(MsgType.CHAT_TEXT, b"ab\xffcd", 3).text
    assert info.value.code is ErrorCode.INVALID_UTF8 and not info.value.fatal
    assert "byte 2" in info.value.message
    with pytest.raises(TypeError):
        Message(MsgType.PING, {"id": 1}, 0).text
    err = ProtocolError(ErrorCode.UNKNOWN_TYPE, "x")
    assert InvalidMessage(err, 0x99, 0).code is ErrorCode.UNKNOWN_TYPE


def test_the_connection_holds_its_receiver_and_shares_its_seqs() -> None:
    from protocol.receiver import Receiver
    assert not issubclass(Connection, Receiver)
    server = Connection(Role.SERVER, version=ProtocolVersion.V3)
    client = Connection(Role.CLIENT)
    assert isinstance(server.receiver, Receiver)
    assert server.receive_and_pong.__self__ is server.receiver          # no forwarding call on reads
    out: list[bytes] = []
    server.receive_and_pong(client.send(MsgType.PING, {"id": 7}) + client.send(MsgType.PING, {"id": 8}),
                            "t", out)
    assert server.rx_seq == 2 and server.tx_seq == 2                    # two PONGs answered by the receiver
    frame = server.send(MsgType.RESPONSE, {"re": 1})                   # ... so the next send is seq 2
    assert frame[1:3] == (2).to_bytes(2, "big") and server.tx_seq == 3
    server.max_message_size = 10                                        # (a client lowers it after HELLO)
    assert server.receiver.max_message_size == 10
    with pytest.raises(ProtocolError) as err:
        server.send(MsgType.RESPONSE, {"re": 1, "text": "too long"})
    assert err.value.code == ErrorCode.MESSAGE_TOO_LARGE


def test_a_tls_handshake_on_the_plain_port_is_refused_not_read_as_a_v2_session_new() -> None:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="nplt.example")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    client_hello = outgoing.read()                                # what `nplt-client --tls` sends first
    for data in (client_hello, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(505)):
        assert data[0] == MsgType.SESSION_NEW                     # what a v2 reading would see
        server = Connection(Role.SERVER)
        with pytest.raises(ProtocolError) as err:
            server.receive_data(data)
        assert err.value.code is ErrorCode.UNSUPPORTED and err.value.fatal and "TLS" in err.value.message
        assert server.version is UNKNOWN
    # a v2 SESSION_NEW as deployed clients send it (seq 0) is still one
    events = Connection(Role.SERVER).receive_data(encode_frame(MsgType.SESSION_NEW, 0, b""))
    assert events[0].type == MsgType.SESSION_NEW
