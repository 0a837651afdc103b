"""server_full_frame: what a client refused over max_clients receives, from its first read alone."""
from __future__ import annotations

import orjson
import pytest

from protocol import Connection, MsgType, Role, encode_frame
from server.errors import server_full_frame

HELLO = encode_frame(MsgType.HELLO, 0, orjson.dumps({"id": "h1", "proto": 3, "client": "t"}))


@pytest.mark.parametrize("first, re", [(HELLO, "h1"), (HELLO[:9], None), (HELLO[:3], None),
                                       (encode_frame(MsgType.HELLO, 0, b"{not json"), None),
                                       (encode_frame(MsgType.HELLO, 0, b"[1]"), None)])
def test_a_v3_client_gets_a_fatal_server_full_error(first: bytes, re: object) -> None:
    events = Connection(Role.CLIENT).receive_data(server_full_frame(first, 7))
    assert [(e.type, e.body) for e in events] == [(MsgType.ERROR, {
        "re": re, "code": "SERVER_FULL", "fatal": True, "message": "the server is full (7 clients)"})]


@pytest.mark.parametrize("first", [b"", encode_frame(MsgType.CHAT_TEXT, 0, b"hi"), b"\x01"])
def test_anything_else_is_a_v2_client_which_only_sees_the_close(first: bytes) -> None:
    assert server_full_frame(first, 7) == b""
