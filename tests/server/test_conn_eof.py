"""Half-close: a client that sends its requests then shuts down its writing side still gets every answer."""
from __future__ import annotations

import asyncio
import json

from protocol import Connection, Message, MsgType, Role
from testkit.server import V3Client, poll, running_server
from testkit.v2client import CHAT_TEXT, HISTORY_REQUEST, SESSION_LIST, V2Client

T = MsgType


async def read_all_v3(reader: asyncio.StreamReader) -> list[Message]:
    """Everything the server sends until it closes, decoded (seqs checked by the codec)."""
    data = await asyncio.wait_for(reader.read(), 10)
    return Connection(Role.CLIENT, max_message_size=64 << 20).receive_data(data)


async def test_v3_requests_sent_before_eof_are_all_answered(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        await (await V3Client.connect(addr)).close()      # the user's session, which HELLO attaches to
        reader, writer = await asyncio.open_connection(*addr)
        codec = Connection(Role.CLIENT)
        requests = [(T.HELLO, {"id": "h", "proto": 3, "client": "eof"}), (T.SESSION_INFO, {"id": 1}),
                    (T.STATS, {"id": 2}), (T.CHAT_TEXT, {"id": 3, "text": "before the eof"}),
                    (T.HISTORY_EXPORT, {"id": 4, "format": "markdown"}), (T.SESSION_LIST, {"id": 5})]
        writer.write(b"".join(codec.send(t, body) for t, body in requests))
        writer.write_eof()   # shutdown(SHUT_WR): nothing more will come
        msgs = await read_all_v3(reader)
        replies = {m.body["re"]: m for m in msgs if m.type == T.RESPONSE}
        assert set(replies) == {"h", 1, 2, 3, 4, 5}
        assert not [m for m in msgs if m.type == T.ERROR]
        sid = replies["h"].body["session"]["session_id"]
        assert replies[3].body["session_id"] == sid
        writer.close()
        # the turn it started completes and is stored, without it
        other = await V3Client.connect(addr, session_id=sid)

        async def answered() -> bool:
            page = await other.call(T.HISTORY_REQUEST)
            return [m["content"] for m in page["messages"]] == ["before the eof", "echo: before the eof"]

        await poll(answered)
        await other.close()


async def test_v3_eof_in_the_middle_of_a_frame_is_answered_then_closed(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        reader, writer = await asyncio.open_connection(*addr)
        codec = Connection(Role.CLIENT)
        hello = codec.send(T.HELLO, {"id": "h", "proto": 3, "client": "eof"})
        writer.write(hello + codec.send(T.STATS, {"id": 1})[:7])
        writer.write_eof()
        msgs = [m for m in await read_all_v3(reader) if m.type != T.SESSION_EVENT]  # ("created")
        assert [m.type for m in msgs] == [T.RESPONSE, T.ERROR]   # the HELLO, then the cut frame (fatal)
        assert msgs[0].body["re"] == "h" and msgs[0].body["user"] == "local"
        assert msgs[1].body["code"] == "CONNECTION_CLOSED" and msgs[1].body["fatal"] is True
        assert "middle of a message" in msgs[1].body["message"]
        writer.close()


async def test_v2_requests_sent_before_eof_are_all_answered(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)
        v2.send(SESSION_LIST)
        v2.send(CHAT_TEXT, "HEARTBEAT")
        v2.send(HISTORY_REQUEST)
        v2.send(CHAT_TEXT, "asked before the eof")
        v2.writer.write_eof()
        listing = await v2.recv_text()
        assert listing.startswith("Sessions (1):")
        assert await v2.recv_text() == "HEARTBEAT"
        history = json.loads(await v2.recv_text())
        assert history["message_count"] == 0
        _, answer, _ = await v2.read_answer()   # the chat's answer too: the worker waits for its turn
        assert answer == "echo: asked before the eof"
        assert await v2.expect_eof() == b""
        assert v2.only_v2_codes()
        await v2.close()
        sid = history["session_id"]
        other = await V3Client.connect(addr, session_id=sid)

        async def answered() -> bool:
            page = await other.call(T.HISTORY_REQUEST)
            return [m["content"] for m in page["messages"]] == ["asked before the eof",
                                                                "echo: asked before the eof"]

        await poll(answered)
        await other.close()
