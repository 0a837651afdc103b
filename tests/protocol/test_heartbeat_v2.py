"""Connection.receive_and_heartbeat: v2 heartbeats at the head of a read answered inside the codec.

Every reply it writes must be exactly what ``send(CHAT_TEXT, b"HEARTBEAT")`` would have sent, every
other frame must give the events ``receive_data`` gives, and a heartbeat that comes after another
request must stay an event (its reply would otherwise overtake that request's).
"""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import Connection, ErrorCode, Message, MsgType, ProtocolError, ProtocolVersion, Role, encode_frame
from protocol.receiver_v2 import HEARTBEAT

V2, V3 = ProtocolVersion.V2, ProtocolVersion.V3
CHAT = int(MsgType.CHAT_TEXT)


def server() -> Connection:
    return Connection(Role.SERVER, version=V2)


def frames(items: list[tuple[int, bytes]], seq0: int = 0) -> bytes:
    return b"".join(encode_frame(t, (seq0 + i) & 0xFFFF, p) for i, (t, p) in enumerate(items))


def beats(k: int, tx0: int = 0) -> list[bytes]:
    ref = server()
    for _ in range(tx0):
        ref.send(CHAT, b"x")
    return [ref.send(CHAT, HEARTBEAT) for _ in range(k)]


def summary(events: list) -> list[tuple]:
    return [(type(e).__name__, int(e.type), e.body if isinstance(e, Message) else e.error.code, e.seq)
            for e in events]


def test_leading_heartbeats_are_answered_with_the_bytes_send_gives() -> None:
    conn = server()
    out: list[bytes] = []
    assert conn.receive_and_heartbeat(frames([(CHAT, HEARTBEAT)] * 3), out) == []
    assert out == beats(3)
    assert conn.tx_seq == 3
    assert conn.send(CHAT, b"next") == encode_frame(CHAT, 3, b"next")  # the numbering goes on


def test_heartbeats_after_another_request_stay_events_in_order() -> None:
    conn = server()
    out: list[bytes] = []
    data = frames([(CHAT, HEARTBEAT), (int(MsgType.SESSION_LIST), b""), (CHAT, HEARTBEAT), (CHAT, b"hi")])
    events = conn.receive_and_heartbeat(data, out)
    assert out == beats(1)
    assert summary(events) == [("Message", 0x14, b"", 1), ("Message", CHAT, HEARTBEAT, 2),
                               ("Message", CHAT, b"hi", 3)]
    assert conn.tx_seq == 1


def test_only_the_exact_payload_is_a_heartbeat() -> None:
    conn = server()
    out: list[bytes] = []
    events = conn.receive_and_heartbeat(frames([(CHAT, b"HEARTBEAT "), (CHAT, HEARTBEAT)]), out)
    assert out == []
    assert [e.body for e in events] == [b"HEARTBEAT ", HEARTBEAT]
    events = conn.receive_and_heartbeat(frames([(int(MsgType.AGENT_THOUGHT), HEARTBEAT)], seq0=2), out)
    assert out == [] and summary(events) == [("Message", 0x0A, HEARTBEAT, 2)]


def test_a_heartbeat_split_across_reads_is_an_event_and_blocks_the_ones_behind_it() -> None:
    conn = server()
    out: list[bytes] = []
    data = frames([(CHAT, HEARTBEAT)] * 2)
    assert conn.receive_and_heartbeat(data[:7], out) == []
    events = conn.receive_and_heartbeat(data[7:], out)
    assert out == [] and [e.body for e in events] == [HEARTBEAT, HEARTBEAT]


def test_seq_anomalies_are_still_counted() -> None:
    conn = server()
    out: list[bytes] = []
    conn.receive_and_heartbeat(encode_frame(CHAT, 5, HEARTBEAT) + encode_frame(CHAT, 6, HEARTBEAT), out)
    assert len(out) == 2 and conn.seq_anomalies == 1


def test_a_message_size_under_the_heartbeat_is_still_enforced() -> None:
    conn = Connection(Role.SERVER, version=V2, max_message_size=4)
    out: list[bytes] = []
    events = conn.receive_and_heartbeat(frames([(CHAT, HEARTBEAT)]), out)
    assert out == [] and events[0].error.code == ErrorCode.MESSAGE_TOO_LARGE


def test_a_fatal_error_keeps_the_replies_made_before_it() -> None:
    conn = server()
    out: list[bytes] = []
    with pytest.raises(ProtocolError) as exc:
        conn.receive_and_heartbeat(frames([(CHAT, HEARTBEAT), (0x7F, b"frag")]), out)
    assert exc.value.code == ErrorCode.BAD_FRAGMENT and out == beats(1)


def test_only_for_v2_connections() -> None:
    for version in (V3, ProtocolVersion.UNKNOWN):
        with pytest.raises(ValueError):
            Connection(Role.SERVER, version=version).receive_and_heartbeat(frames([(CHAT, HEARTBEAT)]), [])


_frame = st.sampled_from([(CHAT, HEARTBEAT), (CHAT, b"hello"), (int(MsgType.HISTORY_REQUEST), b""),
                          (CHAT, b"HEARTBEAT!")])


@given(st.lists(_frame, max_size=12), st.lists(st.integers(1, 40), max_size=4))
def test_each_read_gives_what_receive_data_gives_minus_its_leading_heartbeats(items, cuts) -> None:
    data = frames(items)
    plain, fast = server(), server()
    out: list[bytes] = []
    pos = 0
    for size in cuts + [len(data)]:
        chunk = data[pos:pos + size]
        pos += len(chunk)
        if not chunk:
            continue
        before = len(out)
        got = fast.receive_and_heartbeat(chunk, out)
        want = plain.receive_data(chunk)
        answered = len(out) - before
        # the answered frames are the heartbeats that came whole in this read before any event of it
        lead = 0
        while lead < len(want) and isinstance(want[lead], Message) and want[lead].body == HEARTBEAT \
                and int(want[lead].type) == CHAT:
            lead += 1
        assert answered <= lead
        assert summary(got) == summary(want[answered:])
    assert b"".join(out) == b"".join(beats(len(out)))
    assert fast.tx_seq == len(out) and fast.seq_anomalies == plain.seq_anomalies == 0


def test_a_heartbeat_after_an_event_of_an_earlier_read_is_answered() -> None:
    """Per call: the caller only asks while its worker is idle, i.e. after handling earlier events."""
    conn = server()
    out: list[bytes] = []
    data = frames([(CHAT, b"hello"), (CHAT, HEARTBEAT)])
    assert [e.body for e in conn.receive_and_heartbeat(data[:10], out)] == [b"hello"]
    assert conn.receive_and_heartbeat(data[10:], out) == [] and out == beats(1)


@given(st.lists(st.sampled_from([0, 1, 2, 0xFFFF, 7]), min_size=1, max_size=10))
def test_one_heartbeat_per_read_counts_seqs_like_the_frame_loop(seqs) -> None:
    """A read that is exactly one heartbeat takes the single-frame shortcut: same replies, same
    expected seq and the same seq anomalies as receive_data counts for those frames."""
    plain, fast = server(), server()
    out: list[bytes] = []
    for seq in seqs:
        frame = encode_frame(CHAT, seq, HEARTBEAT)
        assert fast.receive_and_heartbeat(frame, out) == []
        assert summary(plain.receive_data(frame)) == [("Message", CHAT, HEARTBEAT, seq)]
        assert fast.rx_seq == plain.rx_seq
    assert fast.seq_anomalies == plain.seq_anomalies
    assert out == beats(len(seqs)) and fast.tx_seq == len(seqs)


def test_one_heartbeat_read_after_a_partial_frame_completes_that_frame_first() -> None:
    conn = server()
    out: list[bytes] = []
    data = frames([(CHAT, b"hi"), (CHAT, HEARTBEAT)])   # 7 + 14 bytes
    assert conn.receive_and_heartbeat(data[:7 - 2], out) == []
    got = conn.receive_and_heartbeat(data[5:19], out)  # 14 bytes, but not one heartbeat frame
    assert summary(got) == [("Message", CHAT, b"hi", 0)] and out == []
    got = conn.receive_and_heartbeat(data[19:], out)  # a heartbeat split across reads: an event
    assert summary(got) == [("Message", CHAT, HEARTBEAT, 1)] and out == []


# ---------------------------------------------------------------- heartbeat_one (a read of one heartbeat)
@given(st.lists(st.tuples(_frame, st.sampled_from([0, 1, 2, 0xFFFF, 7])), min_size=1, max_size=8))
def test_heartbeat_one_answers_exactly_what_receive_and_heartbeat_would_or_changes_nothing(reads) -> None:
    """A server that tries ``heartbeat_one`` first (and ``receive_and_heartbeat`` when it says None)
    sends and reports exactly what one calling ``receive_and_heartbeat`` alone does, read after read."""
    one, other = server(), server()
    for (t, payload), seq in reads:
        data = encode_frame(t, seq, payload)
        before = (one.rx_seq, one.tx_seq, one.seq_anomalies)
        got = one.heartbeat_one(data)
        mine: list[bytes] = []
        if got is None:
            assert (one.rx_seq, one.tx_seq, one.seq_anomalies) == before     # nothing changed
            my_events = one.receive_and_heartbeat(data, mine)
        else:
            assert (t, payload) == (CHAT, HEARTBEAT)
            mine, my_events = [got], []
        theirs: list[bytes] = []
        assert summary(other.receive_and_heartbeat(data, theirs)) == summary(my_events)
        assert mine == theirs
        assert (one.rx_seq, one.tx_seq, one.seq_anomalies) == (other.rx_seq, other.tx_seq, other.seq_anomalies)


def test_heartbeat_one_answers_one_whole_heartbeat_and_nothing_else() -> None:
    conn = server()
    beat = encode_frame(CHAT, 0, HEARTBEAT)
    assert conn.heartbeat_one(beat[:-1]) is None                          # half of it
    assert conn.heartbeat_one(beat + encode_frame(CHAT, 1, HEARTBEAT)) is None   # two
    assert conn.heartbeat_one(memoryview(beat)) is None                   # not bytes: receive_data's job
    assert conn.heartbeat_one(encode_frame(CHAT, 0, b"HEARTBEAt")) is None
    assert (conn.rx_seq, conn.tx_seq) == (0, 0)
    conn.receive_data(beat[:3])                                           # a frame in progress
    assert conn.heartbeat_one(encode_frame(CHAT, 0, HEARTBEAT)) is None
    for version in (V3, ProtocolVersion.UNKNOWN):
        assert Connection(Role.SERVER, version=version).heartbeat_one(beat) is None
    fresh = server()
    assert fresh.heartbeat_one(beat) == beats(1)[0] and (fresh.rx_seq, fresh.tx_seq) == (1, 1)
    fresh.close()
    assert fresh.heartbeat_one(encode_frame(CHAT, 1, HEARTBEAT)) is None  # closed
