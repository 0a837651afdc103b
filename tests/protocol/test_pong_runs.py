"""receive_and_pong on runs of PINGs sent back to back (``protocol.pong.answer_run``).

A run of same-size canonical PINGs is answered in one go; anything that breaks the run must give
exactly what feeding the frames one by one gives (the oracle below), with the seqs and the buffered
bytes right, and a fatal error must keep the PONGs of the frames before it.
"""
from __future__ import annotations

import copy
import functools

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import Connection, ErrorCode, MsgType, ProtocolError, ProtocolVersion, Role, encode_frame
from protocol import pong

T = "2026-11-22T10:15:00.123+00:00"


def server(rx: int = 0, tx: int = 0) -> Connection:
    return copy.deepcopy(_server(rx, tx))


@functools.lru_cache(maxsize=None)
def _server(rx: int, tx: int) -> Connection:
    conn = Connection(Role.SERVER, version=ProtocolVersion.V3)
    for _ in range(tx):                      # advance the outgoing seq the public way
        conn.send_raw(MsgType.PONG)
    if rx:                                   # and the incoming one: rx frames already received
        conn.receive_data(b"".join(encode_frame(MsgType.PONG, s, b"{}") for s in range(rx)))
    return conn


def pings(ids: list[int], seq0: int = 0) -> list[bytes]:
    return [encode_frame(MsgType.PING, (seq0 + i) & 0xFFFF, b'{"id":%d}' % i_) for i, i_ in enumerate(ids)]


def expected(ids: list, tx0: int = 0, time: str = T) -> bytes:
    return b"".join(encode_frame(MsgType.PONG, (tx0 + n) & 0xFFFF, orjson.dumps({"re": i, "time": time}))
                    for n, i in enumerate(ids))


def one_by_one(frames: list[bytes], rx: int = 0, tx: int = 0) -> tuple[list, bytes, int, int, str | None]:
    """The oracle: every frame in a read of its own, so no run is ever answered in one go."""
    conn, out, events = server(rx, tx), [], []
    try:
        for f in frames:
            events += conn.receive_and_pong(f, T, out)
    except ProtocolError as exc:
        return [(type(e), e.seq) for e in events + exc.events], b"".join(out), conn.tx_seq, -1, str(exc.code)
    return [(type(e), e.seq) for e in events], b"".join(out), conn.tx_seq, conn.bytes_buffered, None


def in_one_read(frames: list[bytes], rx: int = 0, tx: int = 0) -> tuple[list, bytes, int, int, str | None]:
    conn, out = server(rx, tx), []
    try:
        events = conn.receive_and_pong(b"".join(frames), T, out)
    except ProtocolError as exc:
        return [(type(e), e.seq) for e in exc.events], b"".join(out), conn.tx_seq, -1, str(exc.code)
    return [(type(e), e.seq) for e in events], b"".join(out), conn.tx_seq, conn.bytes_buffered, None


def test_a_run_of_pings_is_answered_in_one_piece_with_the_bytes_send_would_give() -> None:
    ids = list(range(100000, 100016))
    conn, out = server(), []
    assert conn.receive_and_pong(b"".join(pings(ids)), T, out) == []
    assert len(out) == 1 and out[0] == expected(ids)
    assert conn.tx_seq == 16 and conn.bytes_buffered == 0
    client = Connection(Role.CLIENT)          # a client accepts the stream, and what follows it
    got = client.receive_data(out[0] + conn.send(MsgType.RESPONSE, {"re": 1}))
    assert [e.body["re"] for e in got] == ids + [1] and got[-1].seq == 16
    assert conn.receive_and_pong(b"".join(pings([5, 6], 16)), T, out) == []   # seq goes on
    assert b"".join(out[1:]) == expected([5, 6], 17)  # (the RESPONSE took seq 16)


def test_a_run_followed_by_a_partial_frame_keeps_the_rest() -> None:
    ids = list(range(11, 20))
    frames = pings(ids)
    data = b"".join(frames)
    conn, out = server(), []
    assert conn.receive_and_pong(data[:-4], T, out) == []
    assert out == [expected(ids[:-1])] and conn.bytes_buffered == len(frames[-1]) - 4
    events = conn.receive_and_pong(data[-4:], T, out)   # a PING split across reads is reported
    assert [(e.type, e.body, e.seq) for e in events] == [(MsgType.PING, {"id": 19}, 8)]
    assert out == [expected(ids[:-1])] and conn.bytes_buffered == 0


def test_short_runs_go_through_the_frame_loop() -> None:
    ids = list(range(20, 20 + pong.MIN_RUN - 1))
    conn, out = server(), []
    assert conn.receive_and_pong(b"".join(pings(ids)), T, out) == []
    assert out == [expected([i], n) for n, i in enumerate(ids)]      # one bytes object per frame


def test_runs_longer_than_max_run_are_answered_in_pieces() -> None:
    ids = [10 + i % 80 for i in range(pong.MAX_RUN * 2 + 7)]
    conn, out = server(), []
    assert conn.receive_and_pong(b"".join(pings(ids)), T, out) == []
    assert len(out) > 1 and b"".join(out) == expected(ids) and conn.tx_seq == len(ids)


@pytest.mark.parametrize("rx, tx", [(65530, 0), (0, 65530), (65535, 65535), (65520, 65524)])
def test_seq_wrap_inside_a_run(rx: int, tx: int) -> None:
    ids = list(range(1000, 1016))
    frames = pings(ids, rx)
    assert in_one_read(frames, rx, tx) == one_by_one(frames, rx, tx)
    events, out, tx_after, buffered, err = in_one_read(frames, rx, tx)
    assert events == [] and err is None and out == expected(ids, tx) and tx_after == (tx + 16) & 0xFFFF


BREAKERS = {
    "leading zero": (MsgType.PING, b'{"id":0123}'),
    "not a digit": (MsgType.PING, b'{"id":12a4}'),
    "space": (MsgType.PING, b'{"id":12 4}'),
    "string id": (MsgType.PING, b'{"id":"ab"}'),
    "other key": (MsgType.PING, b'{"ix":1234}'),
    "no brace": (MsgType.PING, b'{"id":12345'),
    "other type": (MsgType.SESSION_LIST, b'{"id":1234}'),
    "unknown type": (0x99, b'{"id":1234}'),
    "a PONG": (MsgType.PONG, b'{"re":1234}'),
    "shorter": (MsgType.PING, b'{"id":123}'),
    "longer": (MsgType.PING, b'{"id":12345}'),
    "negative": (MsgType.PING, b'{"id":-123}'),
}


@pytest.mark.parametrize("where", [0, 1, 5, 7])
@pytest.mark.parametrize("name", sorted(BREAKERS))
def test_anything_that_breaks_a_run_gives_what_frame_by_frame_gives(name: str, where: int) -> None:
    t, payload = BREAKERS[name]
    frames = pings([1000 + i for i in range(8)])
    frames[where] = encode_frame(t, where, payload)
    got = in_one_read(frames)
    assert got == one_by_one(frames)
    assert got[4] is None and got[3] == 0      # nothing fatal, nothing left over


def test_a_seq_gap_inside_a_run_is_fatal_and_keeps_the_pongs_before_it() -> None:
    frames = pings([1000 + i for i in range(8)])
    frames[5] = encode_frame(MsgType.PING, 9, b'{"id":1005}')
    events, out, tx, _, err = in_one_read(frames)
    assert err == ErrorCode.SEQ_MISMATCH and events == [] and out == expected(list(range(1000, 1005)))
    assert (events, out, err) == one_by_one(frames)[:2] + (err,) and tx == 5


def test_the_format_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pong, "MAX_RUN_FORMATS", 3)
    monkeypatch.setattr(pong, "_run_formats", {})
    conn, out, ids = server(), [], []
    for k in range(pong.MIN_RUN, pong.MIN_RUN + 7):   # 7 run sizes: the cache is cleared twice
        run = [10 + k] * k
        assert conn.receive_and_pong(b"".join(pings(run, len(ids))), T, out) == []
        ids += run
        assert len(pong._run_formats) <= 3
    assert b"".join(out) == expected(ids) and len(out) == 7


def test_codes_match_the_protocol() -> None:
    assert (pong.PING_CODE, pong.PONG_CODE) == (MsgType.PING, MsgType.PONG)
    assert pong.ID_PREFIX == orjson.dumps({"id": 1})[:6]


# ---------------------------------------------------------------- property: in one read == one by one
frame_kinds = st.one_of(
    st.integers(0, 10**19 - 1).map(lambda i: (MsgType.PING, b'{"id":%d}' % i)),
    st.sampled_from(sorted(BREAKERS.values())),
    st.binary(min_size=8, max_size=12).map(lambda b: (MsgType.PING, b)))


@given(digits=st.integers(1, 6), seed=st.lists(st.integers(0, 999999), min_size=1, max_size=40),
       noise=st.lists(st.tuples(st.integers(0, 39), frame_kinds), max_size=3),
       rx=st.sampled_from([0, 65500, 65530]), tx=st.sampled_from([0, 65525]), cut=st.integers(0, 30))
def test_property_one_read_gives_what_frame_by_frame_gives(digits: int, seed: list[int], noise: list,
                                                           rx: int, tx: int, cut: int) -> None:
    lo = 10 ** (digits - 1) if digits > 1 else 0
    bodies = [(MsgType.PING, b'{"id":%d}' % (lo + s % (9 * lo or 10))) for s in seed]
    for at, kind in noise:
        bodies[at % len(bodies)] = kind
    frames = [encode_frame(t, (rx + i) & 0xFFFF, p) for i, (t, p) in enumerate(bodies)]
    if cut:                                   # the read may end inside the last frame
        frames[-1] = frames[-1][:-min(cut, len(frames[-1]) - 1)]
    assert in_one_read(frames, rx, tx) == one_by_one(frames, rx, tx)
