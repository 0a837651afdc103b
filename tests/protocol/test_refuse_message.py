"""Receiver.refuse_message and in_message: a fragmented message dropped on the receiver's request."""
from __future__ import annotations

from protocol import Connection, ErrorCode, InvalidMessage, Message, MsgType, ProtocolVersion, Role

V3 = ProtocolVersion.V3


def pair() -> tuple[Connection, Connection]:
    return Connection(Role.CLIENT), Connection(Role.SERVER, version=V3)


def test_a_refused_message_is_released_skipped_and_reported_once_at_its_end():
    client, server = pair()
    data = client.send(MsgType.STATS, {"id": 7, "pad": "x" * 200_000})   # 4 frames: 3 FRAGMENTs + final
    frames = 65535 + 5
    assert server.receive_data(data[:2 * frames]) == [] and server.bytes_buffered == 2 * 65535
    assert server.in_message
    assert server.refuse_message(ErrorCode.SERVER_BUSY, "too much partial input") == 2 * 65535
    assert server.bytes_buffered == 0 and server.in_message            # released, still skipping
    assert server.refuse_message(ErrorCode.SERVER_BUSY, "again") == 0  # nothing more to refuse
    events = server.receive_data(data[2 * frames:] + client.send(MsgType.PING, {"id": 8}))
    assert len(events) == 2 and not server.in_message
    err = events[0]
    assert isinstance(err, InvalidMessage) and err.error.code == ErrorCode.SERVER_BUSY
    assert err.error.fatal is False and err.error.message == "too much partial input" and err.re is None
    assert isinstance(events[1], Message) and events[1].body == {"id": 8}   # the connection goes on
    again = server.receive_data(client.send(MsgType.STATS, {"id": 9, "pad": "y" * 100_000}))
    assert [type(e) for e in again] == [Message] and again[0].body["id"] == 9  # the next one is whole


def test_refusing_without_a_message_in_progress_does_nothing():
    client, server = pair()
    assert not server.in_message and server.refuse_message(ErrorCode.SERVER_BUSY, "x") == 0
    ping = client.send(MsgType.PING, {"id": 1})
    assert server.receive_data(ping[:3]) == [] and server.in_message   # a partial frame has started
    assert server.refuse_message(ErrorCode.SERVER_BUSY, "x") == 0      # (not a fragmented message)
    assert [e.body for e in server.receive_data(ping[3:])] == [{"id": 1}] and not server.in_message
