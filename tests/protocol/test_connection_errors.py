"""Connection: fragmentation and its caps, invalid payloads, unknown codes, EOF, closed state."""
from __future__ import annotations

import pytest

from protocol import (DEFAULT_MAX_MESSAGE_SIZE, MAX_FRAME, MAX_PAYLOAD, Connection, ErrorCode,
                      InvalidMessage, Message, MsgType, ProtocolError, ProtocolVersion, Role,
                      encode_frame)

V3, V2 = ProtocolVersion.V3, ProtocolVersion.V2
FRAG = MsgType.FRAGMENT


def feed(conn: Connection, data: bytes, size: int) -> list:
    events: list = []
    for i in range(0, len(data), size):
        events += conn.receive_data(data[i:i + size])
    return events


def json_of_size(size: int, ident: int = 1) -> bytes:
    """A JSON object payload of exactly ``size`` bytes."""
    head = b'{"id":%d,"pad":"' % ident
    return head + b"x" * (size - len(head) - 2) + b'"}'


def frame_count(data: bytes) -> list[int]:
    """The type codes of the frames in ``data``."""
    types, pos = [], 0
    while pos < len(data):
        types.append(data[pos])
        pos += 5 + int.from_bytes(data[pos + 3:pos + 5], "big")
    return types


@pytest.mark.parametrize("size, frames", [(65535, 1), (65536, 2), (131070, 2), (131071, 3)])
def test_fragmentation_boundaries(size: int, frames: int) -> None:
    sender = Connection(Role.CLIENT)
    data = sender.send(MsgType.HISTORY_EXPORT, json_of_size(size))
    assert frame_count(data) == [FRAG] * (frames - 1) + [MsgType.HISTORY_EXPORT]
    receiver = Connection(Role.SERVER, version=V3)
    events = receiver.receive_data(data)
    assert len(events) == 1 and events[0].seq == frames - 1
    assert len(events[0].body["pad"]) == size - 17
    assert sender.send(MsgType.PING, {"id": 2})[1:3] == frames.to_bytes(2, "big")


@pytest.mark.parametrize("cap", [200_000, DEFAULT_MAX_MESSAGE_SIZE])
def test_reassembly_at_the_cap_and_one_byte_over(cap: int) -> None:
    sender = Connection(Role.CLIENT, max_message_size=cap + 10)
    receiver = Connection(Role.SERVER, version=V3, max_message_size=cap)
    at_cap = sender.send(MsgType.HISTORY_EXPORT, json_of_size(cap, 1))
    over = sender.send(MsgType.HISTORY_EXPORT, json_of_size(cap + 1, 2))
    after = sender.send(MsgType.PING, {"id": 3})
    events = receiver.receive_data(at_cap)
    assert isinstance(events[0], Message) and len(events[0].body["pad"]) == cap - 17
    events = []
    peak = 0
    for i in range(0, len(over), 50_000):
        events += receiver.receive_data(over[i:i + 50_000])
        peak = max(peak, receiver.bytes_buffered)
    assert peak <= receiver.max_buffer_size and peak < cap + MAX_FRAME
    assert len(events) == 1 and isinstance(events[0], InvalidMessage)
    err = events[0].error
    assert err.code is ErrorCode.MESSAGE_TOO_LARGE and not err.fatal
    assert f"{cap + 1} bytes is over max_message_size ({cap})" in err.message
    assert events[0].type is MsgType.HISTORY_EXPORT and events[0].re is None
    assert receiver.bytes_buffered == 0 and not receiver.closed
    assert [e.body for e in receiver.receive_data(after)] == [{"id": 3}]


def test_over_cap_discard_keeps_memory_bounded() -> None:
    sender = Connection(Role.CLIENT)
    receiver = Connection(Role.SERVER, version=V3, max_message_size=100_000)
    data = sender.send(MsgType.HISTORY_EXPORT, json_of_size(1_000_000))
    peak, events = 0, []
    for i in range(0, len(data), 30_000):
        events += receiver.receive_data(data[i:i + 30_000])
        peak = max(peak, receiver.bytes_buffered)
    assert [e.error.code for e in events] == [ErrorCode.MESSAGE_TOO_LARGE]
    assert "1000000 bytes" in events[0].error.message
    assert peak < 100_000 + MAX_FRAME


def test_single_frame_over_a_small_cap() -> None:
    v3 = Connection(Role.SERVER, version=V3, max_message_size=10)
    events = v3.receive_data(encode_frame(MsgType.PING, 0, b'{"id": 123456}') + encode_frame(MsgType.PING, 1, b'{"id":1}'))
    assert events[0].error.code is ErrorCode.MESSAGE_TOO_LARGE and events[1].body == {"id": 1}
    v2 = Connection(Role.SERVER, version=V2, max_message_size=10)
    frame = encode_frame(MsgType.CHAT_TEXT, 0, b"x" * 11)
    events = v2.receive_data(frame) + v2.receive_data(frame[:6]) + v2.receive_data(frame[6:])
    assert [e.error.code for e in events] == [ErrorCode.MESSAGE_TOO_LARGE] * 2
    assert events[0].type is MsgType.CHAT_TEXT


def test_sender_refuses_messages_over_its_cap_without_using_a_seq() -> None:
    sender = Connection(Role.CLIENT, max_message_size=100)
    with pytest.raises(ProtocolError) as info:
        sender.send(MsgType.CHAT_TEXT, {"text": "x" * 200})
    assert info.value.code is ErrorCode.MESSAGE_TOO_LARGE and not info.value.fatal
    assert sender.send(MsgType.PING, {"id": 1})[1:3] == b"\x00\x00" and not sender.closed


def test_fragmented_message_with_unknown_type_or_bad_json() -> None:
    receiver = Connection(Role.SERVER, version=V3)
    piece = b"x" * 100
    data = (encode_frame(FRAG, 0, piece) + encode_frame(0x99, 1, b"{}")
            + encode_frame(FRAG, 2, b'{"a": ') + encode_frame(MsgType.PING, 3, b"}")
            + encode_frame(FRAG, 4, b'{"a": 1') + encode_frame(MsgType.PING, 5, b"}"))
    events = receiver.receive_data(data)
    assert [(e.type, e.error.code) for e in events[:2]] == [
        (0x99, ErrorCode.UNKNOWN_TYPE), (MsgType.PING, ErrorCode.INVALID_JSON)]
    assert events[2].body == {"a": 1} and events[2].seq == 5


def test_empty_fragment_is_fatal() -> None:
    receiver = Connection(Role.SERVER, version=V3)
    ok = encode_frame(MsgType.PING, 0, b'{"id":1}')
    with pytest.raises(ProtocolError) as info:
        receiver.receive_data(ok + encode_frame(FRAG, 1, b""))
    assert info.value.code is ErrorCode.BAD_FRAGMENT and info.value.fatal
    assert [e.body for e in info.value.events] == [{"id": 1}] and receiver.closed


@pytest.mark.parametrize("split", [None, 3])
def test_fragment_on_a_v2_connection_is_fatal(split: int | None) -> None:
    server = Connection(Role.SERVER)
    data = encode_frame(MsgType.CHAT_TEXT, 0, b"hi") + encode_frame(FRAG, 1, b"abc")
    events = server.receive_data(data[:7 + (split or 0)]) if split else []
    with pytest.raises(ProtocolError) as info:
        server.receive_data(data[7 + (split or 0):] if split else data)
    assert info.value.code is ErrorCode.BAD_FRAGMENT and "v2" in info.value.message
    assert [e.body for e in events + info.value.events] == [b"hi"]


def test_fragment_while_discarding_and_fragment_split_across_reads() -> None:
    receiver = Connection(Role.SERVER, version=V3, max_message_size=150)
    data = b"".join(encode_frame(FRAG, s, b"y" * 100) for s in range(3)) + encode_frame(MsgType.PING, 3, b"}")
    events = feed(receiver, data, 33)
    assert [e.error.code for e in events] == [ErrorCode.MESSAGE_TOO_LARGE]
    assert "301 bytes" in events[0].error.message


def test_buffer_overflow_on_a_partial_frame() -> None:
    receiver = Connection(Role.SERVER, version=V2, max_buffer_size=100)
    frame = encode_frame(MsgType.CHAT_TEXT, 0, b"x" * 500)
    assert receiver.receive_data(frame[:90]) == []
    with pytest.raises(ProtocolError) as info:
        receiver.receive_data(frame[90:150])
    assert info.value.code is ErrorCode.BUFFER_OVERFLOW and info.value.fatal
    assert receiver.closed and receiver.bytes_buffered == 0


def test_buffer_overflow_during_reassembly() -> None:
    receiver = Connection(Role.SERVER, version=V3, max_message_size=10_000, max_buffer_size=1000)
    data = b"".join(encode_frame(FRAG, s, b"z" * 600) for s in range(2))
    with pytest.raises(ProtocolError, match="BUFFER_OVERFLOW: reassembly of 1200 bytes"):
        receiver.receive_data(data)


def test_default_buffer_size_covers_a_full_message_plus_a_frame() -> None:
    conn = Connection(Role.SERVER, max_message_size=1000)
    assert conn.max_buffer_size >= 1000 + MAX_FRAME
    assert Connection(Role.SERVER, max_buffer_size=77).max_buffer_size == 77
    with pytest.raises(ValueError):
        Connection(Role.SERVER, max_message_size=0)
    with pytest.raises(ValueError):
        Connection(Role.SERVER, max_buffer_size=0)


@pytest.mark.parametrize("split", [False, True])
def test_invalid_utf8_invalid_json_and_non_objects_in_v3(split: bool) -> None:
    payloads = [b'{"text": "\xff\xfe"}', b'{"id": 1,', b"", b"[1, 2]", b'"str"', b"null",
                b"true", b"3.5", b'{"ok": 1}']
    expected = [(ErrorCode.INVALID_UTF8, "not valid UTF-8 at byte 10"),
                (ErrorCode.INVALID_JSON, "not valid JSON"), (ErrorCode.INVALID_JSON, "not valid JSON"),
                (ErrorCode.INVALID_JSON, "got an array"), (ErrorCode.INVALID_JSON, "got a string"),
                (ErrorCode.INVALID_JSON, "got null"), (ErrorCode.INVALID_JSON, "got a boolean"),
                (ErrorCode.INVALID_JSON, "got a number")]
    receiver = Connection(Role.SERVER, version=V3)
    events = []
    for seq, p in enumerate(payloads):
        frame = encode_frame(MsgType.CHAT_TEXT, seq, p)
        if split:
            events += receiver.receive_data(frame[:4])
            frame = frame[4:]
        events += receiver.receive_data(frame)
    for event, (code, text) in zip(events, expected):
        assert isinstance(event, InvalidMessage) and event.error.code is code and not event.error.fatal
        assert text in event.error.message and event.error.message.startswith("CHAT_TEXT payload")
        assert event.type is MsgType.CHAT_TEXT and event.re is None
    assert events[-1].body == {"ok": 1} and not receiver.closed


def test_unknown_type_codes_are_skipped_in_v3_and_passed_in_v2() -> None:
    v3 = Connection(Role.SERVER, version=V3)
    frames = b"".join(encode_frame(t, s, b'{"id": 1}') for s, t in enumerate([0x02, 0xFF, 0x23]))
    events = v3.receive_data(frames)
    assert [(e.type, e.error.code) for e in events[:2]] == [(0x02, ErrorCode.UNKNOWN_TYPE),
                                                            (0xFF, ErrorCode.UNKNOWN_TYPE)]
    assert "unknown type code 0xFF" in events[1].error.message
    assert events[2].type is MsgType.PING and events[2].body == {"id": 1}
    v2 = Connection(Role.SERVER, version=V2)
    events = v2.receive_data(frames)
    assert [e.type for e in events] == [0x02, 0xFF, MsgType.PING]
    assert all(isinstance(e, Message) for e in events)


@pytest.mark.parametrize("cut, text", [(2, "middle of a frame (2 bytes"), (9, "middle of a frame (9 bytes")])
def test_eof_in_the_middle_of_a_frame(cut: int, text: str) -> None:
    receiver = Connection(Role.SERVER, version=V3)
    assert receiver.receive_data(encode_frame(MsgType.PING, 0, b'{"id": 1}')[:cut]) == []
    with pytest.raises(ProtocolError) as info:
        receiver.receive_data(b"")
    assert info.value.code is ErrorCode.CONNECTION_CLOSED and info.value.fatal
    assert text in info.value.message and receiver.closed and receiver.eof


@pytest.mark.parametrize("cap", [10_000, 50])
def test_eof_in_the_middle_of_a_fragmented_message(cap: int) -> None:
    receiver = Connection(Role.SERVER, version=V3, max_message_size=cap)
    assert receiver.receive_data(encode_frame(FRAG, 0, b"x" * 100)) == []
    with pytest.raises(ProtocolError, match="middle of a fragmented message"):
        receiver.receive_data(b"")


def test_clean_eof_then_receive_raises_but_send_works() -> None:
    receiver = Connection(Role.SERVER, version=V3)
    assert receiver.receive_data(b"") == []
    assert receiver.eof and not receiver.closed
    with pytest.raises(ProtocolError) as info:
        receiver.receive_data(b"x")
    assert info.value.code is ErrorCode.CONNECTION_CLOSED
    with pytest.raises(ProtocolError, match="CONNECTION_CLOSED"):
        receiver.receive_data(b"")
    assert receiver.send(MsgType.PONG, {"re": 1})[0] == MsgType.PONG


def test_close_releases_buffers_and_blocks_every_call() -> None:
    conn = Connection(Role.SERVER, version=V3)
    conn.receive_data(encode_frame(FRAG, 0, b"x" * 100) + b"\x23\x00")
    assert conn.bytes_buffered == 102
    conn.close()
    assert conn.closed and conn.bytes_buffered == 0
    for call in (lambda: conn.receive_data(b"x"), lambda: conn.send(MsgType.PING, {"id": 1}),
                 lambda: conn.send_raw(MsgType.PING, b"{}")):
        with pytest.raises(ProtocolError) as info:
            call()
        assert info.value.code is ErrorCode.CONNECTION_CLOSED and info.value.fatal


def test_send_argument_errors() -> None:
    v3 = Connection(Role.CLIENT)
    for bad in (MsgType.FRAGMENT, 256, -1):
        with pytest.raises(ValueError):
            v3.send(bad, {"id": 1})
    for bad in (256, -1):
        with pytest.raises(ValueError):
            v3.send_raw(bad, b"")
    with pytest.raises(TypeError, match="str on a V3 connection"):
        v3.send(MsgType.CHAT_TEXT, "plain text")
    with pytest.raises(TypeError):
        v3.send(MsgType.CHAT_TEXT, 42)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError) as info:
        v3.send_raw(MsgType.CHAT_TEXT, b"x" * (MAX_PAYLOAD + 1))
    assert info.value.code is ErrorCode.MESSAGE_TOO_LARGE and not info.value.fatal
    assert v3.send_raw(MsgType.CHAT_TEXT, b"x" * MAX_PAYLOAD)[1:5] == b"\x00\x00\xff\xff"


def test_v2_send_rules() -> None:
    v2 = Connection(Role.SERVER, version=V2)
    with pytest.raises(ProtocolError) as info:
        v2.send(MsgType.TURN_START, {"re": None})
    assert info.value.code is ErrorCode.UNSUPPORTED and not info.value.fatal
    with pytest.raises(ProtocolError) as info:
        v2.send(MsgType.CHAT_TEXT, "é" * 40_000)
    assert info.value.code is ErrorCode.MESSAGE_TOO_LARGE and "split_text_utf8" in info.value.message
    assert v2.send(MsgType.CHAT_TEXT, "x" * MAX_PAYLOAD)[:5] == b"\x01\x00\x00\xff\xff"


@pytest.mark.parametrize("version", [V3, V2])
def test_a_body_that_cannot_be_encoded_is_refused_and_the_connection_goes_on(version) -> None:
    """A text with lone surrogates (undecodable input, as Python decodes it) has no UTF-8 form."""
    sender, receiver = Connection(Role.CLIENT, version=version), Connection(Role.SERVER, version=version)
    bodies = [{"text": "bad \udcff"}] + ([] if version is V3 else ["bad \udcff"])
    for body in bodies:
        with pytest.raises(ProtocolError) as err:
            sender.send(MsgType.CHAT_TEXT, body)
        assert err.value.code == ErrorCode.INVALID_MESSAGE and not err.value.fatal
    good = {"id": 1, "text": "fine"} if version is V3 else "fine"
    [msg] = receiver.receive_data(sender.send(MsgType.CHAT_TEXT, good))    # nothing half-sent before it
    assert msg.type == MsgType.CHAT_TEXT
