"""Property tests (Hypothesis): arbitrary input never breaks the codec; round trips are exact.

Run with ``--hypothesis-profile=long`` (``make fuzz``) for many more examples.
"""
from __future__ import annotations

from typing import Any, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import (BINARY_TYPES, MAX_PAYLOAD, V2_ONLY_TYPES, V2_TYPES, Connection, ErrorCode, InvalidMessage,
                      Message, MsgType, ProtocolError, ProtocolVersion, Role, encode_frame, split_text_utf8)

V3, V2, UNKNOWN = ProtocolVersion.V3, ProtocolVersion.V2, ProtocolVersion.UNKNOWN
# JSON bodies (the v2-only types are UNSUPPORTED on v3 unread: tests/protocol/test_v3_type_checks.py)
SENDABLE = [t for t in MsgType if t is not MsgType.FRAGMENT and t not in BINARY_TYPES and t not in V2_ONLY_TYPES]


def chunks(data: bytes, sizes: list[int]) -> Iterator[bytes]:
    """``data`` cut into pieces of the given sizes (cycled), never empty."""
    pos, i = 0, 0
    while pos < len(data):
        size = sizes[i % len(sizes)] if sizes else len(data)
        yield data[pos:pos + size]
        pos += size
        i += 1


# ---------------------------------------------------------------- arbitrary input
payloads = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([b"", b"{}", b'{"id": 1}', b"[]", b"\xff\xfe", b'{"a": "\xc3\x28"}', b"null"]),
    st.builds(lambda unit, n: unit * n, st.binary(min_size=1, max_size=3), st.integers(0, 70_000)),
)
type_codes = st.one_of(st.sampled_from([int(t) for t in MsgType]), st.integers(0, 255))


@st.composite
def frame_streams(draw: Any) -> bytes:
    """Frames that are mostly well formed (right seqs and lengths), with garbage mixed in."""
    out, seq = [], 0
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["frame", "frame", "frame", "bad_seq", "garbage", "truncated"]))
        if kind == "garbage":
            out.append(draw(st.binary(max_size=30)))
            continue
        payload = draw(payloads)[:MAX_PAYLOAD]
        frame = encode_frame(draw(type_codes), draw(st.integers(0, 65535)) if kind == "bad_seq" else seq,
                             payload)
        if kind == "truncated":
            frame = frame[:draw(st.integers(0, len(frame)))]
        out.append(frame)
        seq = (seq + 1) & 0xFFFF
    return b"".join(out)


setups = st.sampled_from([(Role.SERVER, UNKNOWN), (Role.CLIENT, V3), (Role.SERVER, V2),
                          (Role.SERVER, V3)])


@given(data=st.one_of(st.binary(max_size=3000), frame_streams()), setup=setups,
       max_message=st.sampled_from([1, 16, 1000, 70_000, 8 << 20]),
       max_buffer=st.one_of(st.none(), st.integers(1, 300_000)),
       sizes=st.lists(st.integers(1, 80_000), max_size=8), eof=st.booleans())
def test_property_any_bytes_give_events_or_protocol_error(
        data: bytes, setup: tuple, max_message: int, max_buffer: int | None, sizes: list[int],
        eof: bool) -> None:
    role, version = setup
    conn = Connection(role, version=version, max_message_size=max_message, max_buffer_size=max_buffer)
    pieces = list(chunks(data, sizes)) + ([b""] if eof else [])
    for piece in pieces:
        try:
            events = conn.receive_data(piece)
        except ProtocolError as exc:
            assert exc.fatal and conn.closed and conn.bytes_buffered == 0
            events = exc.events
            _check_events(conn, events)
            with pytest.raises(ProtocolError) as info:
                conn.receive_data(b"more")
            assert info.value.code is ErrorCode.CONNECTION_CLOSED
            return
        _check_events(conn, events)
        assert conn.bytes_buffered <= conn.max_buffer_size


def _check_events(conn: Connection, events: list) -> None:
    for event in events:
        assert isinstance(event, (Message, InvalidMessage))
        if isinstance(event, InvalidMessage):
            assert not event.error.fatal and isinstance(event.error.code, ErrorCode)
        elif conn.version is V3:     # binary data frames (docs/protocol.md §5.8) keep their raw payload
            assert isinstance(event.type, MsgType)
            assert isinstance(event.body, bytes if event.type in BINARY_TYPES else dict)
        else:
            assert isinstance(event.body, bytes)


# ---------------------------------------------------------------- round trips
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=15)
bodies = st.builds(
    lambda d, pad: {**d, "pad": "é" * pad} if pad else d,
    st.dictionaries(st.text(max_size=8), json_values, max_size=5),
    st.one_of(st.just(0), st.integers(0, 200), st.integers(32_000, 110_000)))


@given(messages=st.lists(st.tuples(st.sampled_from(SENDABLE), bodies), min_size=1, max_size=6),
       to_client=st.booleans(), sizes=st.lists(st.integers(1, 70_000), max_size=6))
def test_property_v3_round_trip_of_json_bodies(messages: list, to_client: bool, sizes: list[int]) -> None:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    server.receive_data(client.send(MsgType.HELLO, {"id": 0, "proto": 3, "client": "p"}))
    sender, receiver = (server, client) if to_client else (client, server)
    stream = b"".join(sender.send(t, body) for t, body in messages)
    events: list = []
    for piece in chunks(stream, sizes):
        events += receiver.receive_data(piece)
        assert receiver.bytes_buffered <= receiver.max_buffer_size
    assert [(e.type, e.body) for e in events] == messages
    assert receiver.bytes_buffered == 0 and receiver.receive_data(b"") == []


@given(messages=st.lists(st.tuples(st.sampled_from(sorted(V2_TYPES)), st.binary(max_size=300)),
                         max_size=8),
       sizes=st.lists(st.integers(1, 400), max_size=6))
def test_property_v2_round_trip_of_raw_payloads(messages: list, sizes: list[int]) -> None:
    sender = Connection(Role.CLIENT, version=V2)
    receiver = Connection(Role.SERVER)
    stream = b"".join(sender.send(t, payload) for t, payload in messages)
    events: list = []
    for piece in chunks(stream, sizes):
        events += receiver.receive_data(piece)
    assert [(e.type, e.body) for e in events] == messages
    assert receiver.seq_anomalies == 0


@given(text=st.text(), max_bytes=st.integers(4, 64))
def test_property_split_text_utf8(text: str, max_bytes: int) -> None:
    parts = split_text_utf8(text, max_bytes)
    assert all(0 < len(p) <= max_bytes for p in parts)
    assert "".join(p.decode("utf-8") for p in parts) == text
