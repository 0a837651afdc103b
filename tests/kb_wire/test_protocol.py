"""The knowledge-base wire format: binary data frames through the sans-IO codec, typed KB bodies."""
from __future__ import annotations

import os

import pytest

from protocol import Connection, InvalidMessage, Message, MsgType, ProtocolError, Role
from protocol.binary import DATA_HEADER_SIZE, MAX_DATA, data_frames, decode_data, encode_data
from protocol.kb import (KbDocument, KbDocumentReply, KbDownload, KbDownloadReply, KbHit, KbListReply,
                         KbProgress, KbSearch, KbSearchReply, KbUploadBegin, KbUploadReply)
from protocol.messages import parse_request
from protocol.replies import decode_reply
from protocol.server_events import decode_event

MD5 = "0123456789abcdef0123456789ABCDEF"


def pair() -> tuple[Connection, Connection]:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    assert server.receive_data(client.send(MsgType.HELLO, {"id": 0, "proto": 3}))
    return client, server


def test_data_frames_carry_raw_bytes_in_order_whatever_the_read_sizes() -> None:
    client, server = pair()
    blob = os.urandom(3 * MAX_DATA + 17)
    frames = list(data_frames(client.send_raw, MsgType.KB_UPLOAD_DATA, 7, 1000, blob))
    assert len(frames) == 4 and all(len(f) <= 5 + 65535 for f in frames)
    stream = b"".join(frames) + client.send(MsgType.PING, {"id": 1})
    events = []
    for i in range(0, len(stream), 4093):              # reads that cut headers and payloads anywhere
        events += server.receive_data(stream[i:i + 4093])
    data = [e for e in events if e.type == MsgType.KB_UPLOAD_DATA]
    assert all(isinstance(e, Message) and isinstance(e.body, bytes) for e in data)
    got = b""
    for e in data:
        handle, offset, chunk = decode_data(e.body)
        assert handle == 7 and offset == 1000 + len(got)
        got += bytes(chunk)
    assert got == blob
    assert events[-1].type == MsgType.PING and events[-1].body == {"id": 1}


def test_download_frames_reach_the_client_as_bytes() -> None:
    client, server = pair()
    frame = server.send_raw(MsgType.KB_DOWNLOAD_DATA, encode_data(3, 0, b"\x00\xffnot json"))
    [ev] = client.receive_data(frame)
    assert ev.type == MsgType.KB_DOWNLOAD_DATA and decode_data(ev.body)[2].tobytes() == b"\x00\xffnot json"


def test_malformed_data_frames_are_refused_precisely() -> None:
    with pytest.raises(ProtocolError) as exc:
        decode_data(b"\x00" * DATA_HEADER_SIZE)           # a header and no byte
    assert exc.value.code == "INVALID_MESSAGE" and not exc.value.fatal
    with pytest.raises(ValueError):
        encode_data(1, 0, b"x" * (MAX_DATA + 1))
    with pytest.raises(ValueError):
        encode_data(1, 0, b"")
    with pytest.raises(ValueError):
        list(data_frames(Connection(Role.CLIENT).send_raw, MsgType.KB_LIST, 1, 0, b"x"))


def test_upload_begin_validates_every_field() -> None:
    ok = KbUploadBegin.from_body({"id": 1, "name": "a.md", "size": 5, "md5": MD5})
    assert ok.md5 == MD5.lower() and ok.collection is None and ok.sha256 is None
    bad = [({"id": 1, "name": "a.md", "size": -1, "md5": MD5}, "field 'size'"),
           ({"id": 1, "name": "a.md", "size": 1, "md5": "xyz"}, "field 'md5': expected 32 hex digits"),
           ({"id": 1, "name": "x" * 10_000, "size": 1, "md5": MD5}, "field 'name': expected a string of 1..1024"),
           ({"id": 1, "name": "", "size": 1, "md5": MD5}, "field 'name'"),
           ({"name": "a.md", "size": 1, "md5": MD5}, "field 'id'"),
           ({"id": 1, "name": "a.md", "size": 1, "md5": MD5, "sha256": "ab"}, "field 'sha256'")]
    for body, message in bad:
        ev = parse_request(Message(MsgType.KB_UPLOAD_BEGIN, body, 0))
        assert isinstance(ev, InvalidMessage) and ev.code == "INVALID_MESSAGE", body
        assert ev.error.message.startswith(message), ev.error.message


def test_search_and_download_requests() -> None:
    assert KbSearch.from_body({"id": "s", "query": "q"}).limit == 5
    ev = parse_request(Message(MsgType.KB_SEARCH, {"id": 2, "query": "q", "limit": 101}, 0))
    assert isinstance(ev, InvalidMessage) and ev.re == 2 and "1..100" in ev.error.message
    assert KbDownload.from_body({"id": 1, "doc_id": "d", "handle": 9}).offset == 0
    ev = parse_request(Message(MsgType.KB_DOWNLOAD, {"id": 1, "doc_id": "d", "handle": 1 << 32}, 0))
    assert isinstance(ev, InvalidMessage) and "handle" in ev.error.message


DOC = KbDocument("d1", "a.md", "m" * 32, "s" * 64, 10, 2, "user:alice", "2026-11-25T00:00:00+00:00", "alice")
HIT = KbHit("d1", "a.md", "d1:0", "text", 1.5, {"heading": ["A"], "lines": [1, 3]}, "user:alice",
            "[a.md §A, lines 1-3]")


@pytest.mark.parametrize("request_type, reply", [
    (MsgType.KB_UPLOAD_BEGIN, KbUploadReply("u1", 3, 100, 200, MAX_DATA, "2026-11-26T00:00:00+00:00", re=1)),
    (MsgType.KB_UPLOAD_END, KbDocumentReply(DOC, re="x")),
    (MsgType.KB_LIST, KbListReply((DOC,), re=2)),
    (MsgType.KB_SEARCH, KbSearchReply((HIT,), re=3)),
    (MsgType.KB_DOWNLOAD, KbDownloadReply(DOC, 4, 6, re=4)),
])
def test_replies_round_trip(request_type: MsgType, reply) -> None:
    assert decode_reply(request_type, MsgType.RESPONSE, reply.encode()) == reply


def test_progress_event_round_trip() -> None:
    ev = KbProgress("u1", "indexing", 3, 9, re=5)
    assert decode_event(MsgType.KB_PROGRESS, ev.encode()) == ev
