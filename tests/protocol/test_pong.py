"""Connection.tx_seq and Connection.receive_and_pong: PINGs answered inside the codec.

Every PONG it writes must be exactly what ``send(PONG, {"re": id, "time": time})`` would have sent,
every other frame must give the events ``receive_data`` gives, and the seq numbering must stay
consistent with what is sent afterwards.
"""
from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import (Connection, ErrorCode, InvalidMessage, Message, MsgType, ProtocolError,
                      ProtocolVersion, Role, encode_frame)
from protocol import messages, pong

V3, V2 = ProtocolVersion.V3, ProtocolVersion.V2
T = "2026-11-22T10:15:00.123456+00:00"
HELLO = {"id": 0, "proto": 3, "client": "test/1"}


def server() -> Connection:
    return Connection(Role.SERVER, version=V3)


def frames(type_code: int, payloads: list[bytes], seq0: int = 0) -> bytes:
    return b"".join(encode_frame(type_code, (seq0 + i) & 0xFFFF, p) for i, p in enumerate(payloads))


def expected_pongs(ids: list[Any], time: str = T) -> list[bytes]:
    """What a plain sender would send: send(PONG, {"re": id, "time": time}) for each id."""
    ref = Connection(Role.SERVER, version=V3)
    return [ref.send(MsgType.PONG, {"re": rid, "time": time}) for rid in ids]


def pongs(ids: list[Any], time: str = T) -> bytes:
    """The same, as one byte string (a run of PINGs may be answered by one bytes object)."""
    return b"".join(expected_pongs(ids, time))


def valid_id(value: Any) -> bool:
    return messages.request_id({"id": value}) is not None


# ---------------------------------------------------------------- tx_seq
def test_tx_seq_is_the_next_outgoing_seq_and_read_only() -> None:
    conn = Connection(Role.CLIENT)
    assert conn.tx_seq == 0
    conn.send(MsgType.PING, {"id": 1})
    assert conn.tx_seq == 1
    conn.send(MsgType.RESPONSE, {"re": 1, "pad": "x" * 140_000})  # 3 frames
    assert conn.tx_seq == 4
    conn.send_raw(MsgType.PONG, b"{}")
    assert conn.tx_seq == 5
    with pytest.raises(AttributeError):
        conn.tx_seq = 9  # type: ignore[misc]


def test_tx_seq_wraps_at_65535() -> None:
    conn = Connection(Role.CLIENT)
    for _ in range(65535):
        conn.send_raw(MsgType.PING)
    assert conn.tx_seq == 65535
    conn.send_raw(MsgType.PING)
    assert conn.tx_seq == 0


# ---------------------------------------------------------------- answered PINGs
def test_valid_pings_are_answered_with_the_bytes_send_would_give() -> None:
    ids = [0, 7, 10**18, 2**63, "a", "x" * 64, 'é "quoted" \\ %d ✓']
    conn, out = server(), []
    events = conn.receive_and_pong(frames(MsgType.PING, [orjson.dumps({"id": i}) for i in ids]), T, out)
    assert events == [] and b"".join(out) == pongs(ids)
    assert conn.tx_seq == len(ids) and conn.bytes_buffered == 0
    # what is sent next carries the following seq, and a client accepts the whole stream
    client = Connection(Role.CLIENT)
    got = client.receive_data(b"".join(out) + conn.send(MsgType.RESPONSE, {"re": 1}))
    assert [(e.type, e.body, e.seq) for e in got[:-1]] == [
        (MsgType.PONG, {"re": i, "time": T}, n) for n, i in enumerate(ids)]
    assert got[-1].type is MsgType.RESPONSE and got[-1].seq == len(ids)


@pytest.mark.parametrize("payload, rid", [
    (b'{"id":0}', 0), (b'{"id":5}', 5), (b'{"id":9999999999999999999}', 9999999999999999999),
    (b'{"id": 5}', 5), (b'{ "id":5 }', 5), (b'{"id":5,"x":[1]}', 5), (b'{"x":1,"id":5}', 5),
    (b'{"id":-0}', 0), (b'{"id":"5"}', "5"), (b'{"id":"\\u00e9"}', "é")])
def test_every_spelling_of_a_valid_ping_is_answered(payload: bytes, rid: Any) -> None:
    conn, out = server(), []
    assert conn.receive_and_pong(frames(MsgType.PING, [payload]), T, out) == []
    assert b"".join(out) == pongs([rid])


@pytest.mark.parametrize("payload", [
    b'{"id":-1}', b'{"id":true}', b'{"id":1.5}', b'{"id":1e3}', b'{"id":null}', b'{}', b'{"id":""}',
    b'{"id":"' + b"x" * 65 + b'"}', b'{"id":[1]}', b'{"id":18446744073709551616}',
    b'{"id":99999999999999999999}'])
def test_pings_without_a_valid_id_are_reported(payload: bytes) -> None:
    conn, out = server(), []
    events = conn.receive_and_pong(frames(MsgType.PING, [payload]), T, out)
    assert out == [] and conn.tx_seq == 0
    assert len(events) == 1 and type(events[0]) is Message and events[0].type is MsgType.PING
    assert events[0].body == orjson.loads(payload)
    assert not valid_id(events[0].body.get("id"))


@pytest.mark.parametrize("payload, code", [
    (b'{"id":01}', ErrorCode.INVALID_JSON), (b'{"id":00}', ErrorCode.INVALID_JSON),
    (b'{"id":}', ErrorCode.INVALID_JSON), (b'{"id":1', ErrorCode.INVALID_JSON),
    (b'{"id":1}}', ErrorCode.INVALID_JSON), (b'{"id":+1}', ErrorCode.INVALID_JSON),
    (b'{"id":1_0}', ErrorCode.INVALID_JSON), (b'{"id":\xff}', ErrorCode.INVALID_UTF8),
    (b'[1]', ErrorCode.INVALID_JSON), (b'5', ErrorCode.INVALID_JSON), (b'', ErrorCode.INVALID_JSON)])
def test_malformed_pings_give_the_usual_errors(payload: bytes, code: ErrorCode) -> None:
    conn, out = server(), []
    events = conn.receive_and_pong(frames(MsgType.PING, [payload]), T, out)
    assert out == []
    assert len(events) == 1 and type(events[0]) is InvalidMessage
    assert events[0].code is code and events[0].type is MsgType.PING


def test_mixed_batch_reports_everything_but_the_answered_pings() -> None:
    payloads = [(MsgType.PING, b'{"id":1}'), (MsgType.SESSION_LIST, b'{"id":2}'),
                (MsgType.PING, b'{"id":-3}'), (MsgType.PING, b'{"id":"four"}'),
                (0x99, b"{}"), (MsgType.PONG, b'{"re":1}')]
    data = b"".join(encode_frame(t, seq, p) for seq, (t, p) in enumerate(payloads))
    conn, out = server(), []
    events = conn.receive_and_pong(data, T, out)
    assert [(e.type, e.seq) for e in events] == [
        (MsgType.SESSION_LIST, 1), (MsgType.PING, 2), (0x99, 4), (MsgType.PONG, 5)]
    assert type(events[2]) is InvalidMessage and events[2].code is ErrorCode.UNKNOWN_TYPE
    assert b"".join(out) == pongs([1, "four"])
    assert conn.receive_data(encode_frame(MsgType.PING, 6, b'{"id":7}')) != []  # plain: reported


def test_a_fatal_error_keeps_the_pongs_already_written() -> None:
    conn, out = server(), []
    data = frames(MsgType.PING, [b'{"id":1}', b'{"id":2}']) + encode_frame(MsgType.PING, 9, b'{"id":3}')
    with pytest.raises(ProtocolError) as info:
        conn.receive_and_pong(data, T, out)
    assert info.value.code is ErrorCode.SEQ_MISMATCH and info.value.events == []
    assert b"".join(out) == pongs([1, 2]) and conn.tx_seq == 2 and conn.closed


def test_pings_split_across_reads_or_fragmented_are_reported() -> None:
    conn, out = server(), []
    data = frames(MsgType.PING, [b'{"id":1}', b'{"id":2}', b'{"id":3}'])
    assert conn.receive_and_pong(data[:16], T, out) == []          # PING 1 whole, PING 2 cut
    assert b"".join(out) == pongs([1]) and conn.bytes_buffered == 3
    events = conn.receive_and_pong(data[16:], T, out)              # PING 2 completed, PING 3 whole
    assert [(e.type, e.body) for e in events] == [(MsgType.PING, {"id": 2})]
    assert b"".join(out) == pongs([1, 3])
    client = Connection(Role.CLIENT)                               # a fragmented PING
    conn.receive_and_pong(b"", T, out)
    conn, out = server(), []
    big = client.send(MsgType.PING, {"id": 4, "pad": "x" * 70_000})
    assert [(e.type, e.body["id"]) for e in conn.receive_and_pong(big, T, out)] == [(MsgType.PING, 4)]
    assert out == []


def test_time_changes_between_calls_and_may_hold_any_characters() -> None:
    conn, out = server(), []
    times = [T, "100%d \"ok\" é", "", T]
    for n, time in enumerate(times):
        conn.receive_and_pong(encode_frame(MsgType.PING, 2 * n, b'{"id":%d}' % n)
                              + encode_frame(MsgType.PING, 2 * n + 1, b'{"id":"s%d"}' % n), time, out)
    client = Connection(Role.CLIENT)
    bodies = [e.body for e in client.receive_data(b"".join(out))]
    assert bodies == [{"re": r, "time": t} for n, t in enumerate(times) for r in (n, f"s{n}")]


@pytest.mark.parametrize("time", [None, 5, b"bytes", "x" * (pong.MAX_PONG_TIME_CHARS + 1)])
def test_a_bad_time_is_a_value_error_before_anything_is_consumed(time: Any) -> None:
    conn, out = server(), []
    data = frames(MsgType.PING, [b'{"id":1}'])
    with pytest.raises(ValueError):
        conn.receive_and_pong(data[:3], time, out)
    assert conn.bytes_buffered == 0 and not conn.closed
    assert conn.receive_and_pong(data, "x" * pong.MAX_PONG_TIME_CHARS, out) == []
    assert b"".join(out) == pongs([1], "x" * pong.MAX_PONG_TIME_CHARS)


def test_without_out_or_on_v2_nothing_is_answered() -> None:
    data = frames(MsgType.PING, [b'{"id":1}'])
    conn, out = server(), []
    assert [e.body for e in conn.receive_and_pong(data, None, None)] == [{"id": 1}]
    v2 = Connection(Role.SERVER, version=V2)
    assert [(e.type, e.body) for e in v2.receive_and_pong(data, T, out)] == [(MsgType.PING, b'{"id":1}')]
    assert out == [] and v2.tx_seq == 0


def test_the_first_frame_decides_the_version_then_pings_are_answered() -> None:
    client, conn, out = Connection(Role.CLIENT), Connection(Role.SERVER), []
    data = client.send(MsgType.HELLO, HELLO) + client.send(MsgType.PING, {"id": 1})
    events = conn.receive_and_pong(data, T, out)
    assert conn.version is V3 and [e.body for e in events] == [HELLO]
    assert b"".join(out) == pongs([1])


def test_closed_and_eof_behave_as_receive_data() -> None:
    conn, out = server(), []
    assert conn.receive_and_pong(b"", T, out) == [] and conn.eof
    with pytest.raises(ProtocolError) as info:
        conn.receive_and_pong(frames(MsgType.PING, [b'{"id":1}']), T, out)
    assert info.value.code is ErrorCode.CONNECTION_CLOSED and out == []


def test_limits_match_the_request_rules() -> None:
    assert pong.MAX_ID_CHARS == messages.MAX_ID_CHARS
    assert 10 ** (pong.CANON_PING_MAX - len(b'{"id":}')) - 1 < 2**64


# ---------------------------------------------------------------- property: same outcome as orjson
id_text = st.one_of(
    st.integers(0, 2**70).map(str), st.integers(-5, 5).map(str),
    st.text(alphabet="0123456789-+.eE _", max_size=22),
    st.sampled_from(["00", "01", "-0", "1.0", "1e2", '"x"', '""', "true", "null", "[]"]))
ping_payloads = st.one_of(
    st.builds(lambda s, pre, post: (pre + '{"id":' + s + "}" + post).encode(), id_text,
              st.sampled_from(["", " "]), st.sampled_from(["", " ", "}"])),
    st.builds(lambda v: orjson.dumps({"id": v}), st.one_of(
        st.integers(-3, 2**64 - 1), st.text(max_size=70), st.booleans(), st.none(), st.floats(0, 9))),
    st.binary(max_size=30))


@given(payloads=st.lists(ping_payloads, min_size=1, max_size=8))
def test_property_answered_exactly_when_orjson_sees_a_valid_id(payloads: list[bytes]) -> None:
    conn, out = server(), []
    events = conn.receive_and_pong(frames(MsgType.PING, payloads), T, out)
    answered, reported = [], []
    for seq, payload in enumerate(payloads):
        try:
            body = orjson.loads(payload)
        except orjson.JSONDecodeError:
            reported.append((InvalidMessage, seq))
            continue
        if type(body) is dict and valid_id(body.get("id")):
            answered.append(body["id"])
        else:
            reported.append((InvalidMessage if type(body) is not dict else Message, seq))
    assert [(type(e), e.seq) for e in events] == reported
    assert b"".join(out) == pongs(answered) and conn.tx_seq == len(answered)


# ---------------------------------------------------------------- pong_one (a read of one PING)
@given(st.lists(st.one_of(st.integers(-5, 2**64 - 1), st.text(max_size=5), st.none(), st.floats(allow_nan=False)),
                min_size=1, max_size=6))
def test_pong_one_answers_exactly_what_receive_and_pong_would_or_changes_nothing(ids) -> None:
    """A server that tries ``pong_one`` first (and ``receive_and_pong`` when it says None) sends and
    reports exactly what one calling ``receive_and_pong`` alone does, read after read."""
    one, other = server(), server()
    for i, rid in enumerate(ids):
        data = frames(MsgType.PING, [orjson.dumps({"id": rid})], i)
        before = (one.rx_seq, one.tx_seq)
        got = one.pong_one(data, T)
        mine: list[bytes] = []
        if got is None:
            assert (one.rx_seq, one.tx_seq) == before           # nothing changed
            my_events = one.receive_and_pong(data, T, mine)
        else:
            mine, my_events = [got], []
            assert valid_id(rid)
        theirs: list[bytes] = []
        assert other.receive_and_pong(data, T, theirs) == my_events
        assert b"".join(mine) == b"".join(theirs)
        assert (one.rx_seq, one.tx_seq) == (other.rx_seq, other.tx_seq)


def test_pong_one_leaves_anything_but_one_whole_canonical_ping_to_receive_and_pong() -> None:
    conn = server()
    ping = frames(MsgType.PING, [b'{"id":7}'])
    assert conn.pong_one(ping[:-1], T) is None                                # half of it
    assert conn.pong_one(ping + frames(MsgType.PING, [b'{"id":8}'], 1), T) is None   # two
    assert conn.pong_one(frames(MsgType.PING, [b'{"id": 7}']), T) is None    # not orjson's spelling
    assert conn.pong_one(frames(MsgType.PING, [b'{"id":07}']), T) is None    # not a canonical number
    assert conn.pong_one(frames(MsgType.PING, [b'{"id":7}'], 5), T) is None  # out of sequence
    assert conn.pong_one(frames(MsgType.SESSION_LIST, [b'{"id":7}']), T) is None
    assert (conn.rx_seq, conn.tx_seq) == (0, 0)
    assert conn.pong_one(ping, T) == expected_pongs([7])[0] and (conn.rx_seq, conn.tx_seq) == (1, 1)
    assert server().pong_one(b"", T) is None


def test_pong_one_answers_only_while_the_receiver_is_v3_open_and_between_messages() -> None:
    """``pong_one`` reads a flag the receiver keeps (``_ping_ok``) instead of testing its state each
    read: every change of state that must stop it (a frame or a fragmented message in progress, a
    refused message being skipped, EOF, close, an undecided or v2 version) is checked here."""
    def ping(conn: Connection) -> bytes:
        return frames(MsgType.PING, [b'{"id":5}'], conn.rx_seq)

    conn = Connection(Role.SERVER)                                  # version not decided yet
    assert conn.pong_one(ping(conn), T) is None
    conn.receive_data(encode_frame(MsgType.HELLO, 0, b'{"id":0,"proto":3}'))
    assert conn.pong_one(ping(conn), T) is not None                 # v3 now
    half = ping(conn)
    conn.receive_data(half[:4])                                     # a frame in progress
    assert conn.pong_one(ping(conn), T) is None
    conn.receive_data(half[4:])
    assert conn.pong_one(ping(conn), T) is not None
    client = Connection(Role.CLIENT)
    for _ in range(conn.rx_seq):
        client.send(MsgType.PING, {"id": 0})
    big = client.send(MsgType.SESSION_LIST, {"id": 6, "pad": "x" * 70_000})   # fragmented
    cut = 5 + int.from_bytes(big[3:5], "big")                       # its first fragment, whole
    conn.receive_data(big[:cut])                                    # a fragmented message in progress
    assert conn.bytes_buffered and conn.pong_one(ping(conn), T) is None
    assert conn.refuse_message(ErrorCode.SERVER_BUSY, "busy")       # ... refused: skipped to its end
    assert conn.pong_one(ping(conn), T) is None
    assert isinstance(conn.receive_data(big[cut:])[0], InvalidMessage)
    assert conn.pong_one(ping(conn), T) is not None                 # between messages again
    conn.receive_data(b"")                                          # EOF
    assert conn.pong_one(ping(conn), T) is None
    closed = server()
    closed.close()
    assert closed.pong_one(ping(closed), T) is None
    legacy = Connection(Role.SERVER)
    legacy.set_legacy()
    assert legacy.pong_one(ping(legacy), T) is None
    broken = server()
    with pytest.raises(ProtocolError):
        broken.receive_data(frames(MsgType.PING, [b'{"id":1}'], 9))   # out of sequence: fatal
    assert broken.pong_one(frames(MsgType.PING, [b'{"id":1}'], 0), T) is None
