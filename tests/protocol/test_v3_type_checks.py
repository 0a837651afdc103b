"""v3 receiver: the v2 file types are UNSUPPORTED before their payload is read (§4, §8), and a data
frame (KB_UPLOAD_DATA, KB_DOWNLOAD_DATA) that came in fragments is refused, not passed on (§5.8)."""
from __future__ import annotations

import struct

import pytest

from protocol import (V2_ONLY_TYPES, Connection, ErrorCode, InvalidMessage, Message, MsgType, ProtocolVersion, Role,
                      encode_frame)
from protocol.binary import MAX_DATA

V3 = ProtocolVersion.V3
FRAG = MsgType.FRAGMENT


def _feed(conn: Connection, data: bytes, split: int | None) -> list:
    if split is None:
        return conn.receive_data(data)
    events: list = []
    for i in range(0, len(data), split):
        events += conn.receive_data(data[i:i + split])
    return events


@pytest.mark.parametrize("split", [None, 3])
@pytest.mark.parametrize("payload", [b"abc", b'{"id": 7}', b"\xff\xfe", b""])
def test_every_v2_only_type_is_unsupported_whatever_its_payload(payload: bytes, split: int | None) -> None:
    receiver = Connection(Role.SERVER, version=V3)
    types = sorted(V2_ONLY_TYPES)
    data = b"".join(encode_frame(t, s, payload) for s, t in enumerate(types))
    data += encode_frame(MsgType.STATS, len(types), b'{"id": "after"}')
    events = _feed(receiver, data, split)
    assert len(events) == len(types) + 1
    for t, ev in zip(types, events):
        assert isinstance(ev, InvalidMessage) and ev.type is t and ev.re is None
        assert ev.error.code is ErrorCode.UNSUPPORTED and not ev.error.fatal
        assert ev.error.message == f"{t.name} is a v2 message type, not served on a v3 connection"
    assert isinstance(events[-1], Message) and events[-1].body == {"id": "after"} and not receiver.closed


def test_a_fragmented_v2_type_is_unsupported_too() -> None:
    receiver = Connection(Role.SERVER, version=V3)
    data = encode_frame(FRAG, 0, b"a" * 65535) + encode_frame(MsgType.FILE_DATA, 1, b"zz") \
        + encode_frame(MsgType.PING, 2, b'{"id": "after"}')
    events = receiver.receive_data(data)
    assert [(e.type, e.error.code) for e in events[:1]] == [(MsgType.FILE_DATA, ErrorCode.UNSUPPORTED)]
    assert events[1].body == {"id": "after"}


@pytest.mark.parametrize("kind", [MsgType.KB_UPLOAD_DATA, MsgType.KB_DOWNLOAD_DATA])
@pytest.mark.parametrize("data_bytes", [100_000, 10])
def test_a_fragmented_data_frame_is_refused_and_the_connection_goes_on(kind: MsgType, data_bytes: int) -> None:
    receiver = Connection(Role.SERVER, version=V3)
    payload = struct.pack(">IQ", 1, 0) + b"d" * data_bytes
    cut = min(65535, len(payload) - 1)
    data = encode_frame(FRAG, 0, payload[:cut]) + encode_frame(kind, 1, payload[cut:])
    whole = struct.pack(">IQ", 1, 0) + b"e" * MAX_DATA                  # the largest data frame: one frame
    data += encode_frame(kind, 2, whole) + encode_frame(MsgType.PING, 3, b'{"id": "after"}')
    events = receiver.receive_data(data)
    assert len(events) == 3
    bad = events[0]
    assert isinstance(bad, InvalidMessage) and bad.type is kind and bad.re is None
    assert bad.error.code is ErrorCode.INVALID_MESSAGE and not bad.error.fatal
    assert "never fragmented" in bad.error.message and f"{len(payload)} bytes" in bad.error.message
    assert events[1].type is kind and events[1].body == whole
    assert events[2].body == {"id": "after"} and not receiver.closed
