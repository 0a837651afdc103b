"""Connection slots: max_clients_per_ip, and the one slot beyond max_clients kept for an admin."""
from __future__ import annotations

import asyncio

from protocol import MsgType, encode_frame
from server.auth import hash_token
from testkit.server import V3Client, poll, running_server
from testkit.v2client import CHAT_TEXT

T = MsgType


def auth(*users: tuple[str, str, bool]) -> dict:
    return {"auth": {"users": [{"user_id": u, "token_sha256": hash_token(t), "admin": a} for u, t, a in users]}}


async def test_connections_from_one_address_over_max_clients_per_ip_are_refused(tmp_path):
    async with running_server(tmp_path, max_clients_per_ip=2, legacy_grace_ms=100) as (srv, addr):
        a = await V3Client.connect(addr)
        b = await V3Client.connect(addr)
        extra = await V3Client.connect(addr, hello=False)
        msg = await extra.request(T.HELLO, proto=3, client="third")
        assert msg.type == T.ERROR and msg.body["code"] == "TOO_MANY_CONNECTIONS" and msg.body["fatal"] is True
        assert "max_clients_per_ip" in msg.body["message"] and msg.body["re"] is not None
        await extra.wait_closed()
        reader, writer = await asyncio.open_connection(*addr)   # v2: one CHAT_TEXT saying why, then the close
        writer.write(encode_frame(CHAT_TEXT, 0, b"hello"))
        assert await asyncio.wait_for(reader.read(), 5) == encode_frame(
            CHAT_TEXT, 0, b"Too many connections from 127.0.0.1 (max_clients_per_ip = 2); try again later.")
        writer.close()
        assert (await a.call(T.STATS))["refused_total"] == 2
        await b.close()
        await poll(lambda: len(srv.connections) == 1)
        c = await V3Client.connect(addr)      # a slot from this address is free again
        assert (await c.call(T.PING))["re"]
        await a.close()
        await c.close()


async def test_one_slot_beyond_max_clients_is_kept_for_an_admin(tmp_path):
    users = auth(("root", "t-root", True), ("bob", "t-bob", False))
    async with running_server(tmp_path, max_clients=1, sections=users) as (srv, addr):
        bob = await V3Client.connect(addr, token="t-bob")
        bob2 = await V3Client.connect(addr, hello=False)         # accepted by the kernel and the server...
        msg = await bob2.request(T.HELLO, proto=3, client="x", token="t-bob")
        assert msg.type == T.ERROR and msg.body["code"] == "SERVER_FULL" and msg.body["fatal"] is True
        assert "reserved for an admin" in msg.body["message"]   # ...but not for bob
        await bob2.wait_closed()
        await poll(lambda: len(srv.connections) == 1)
        root = await V3Client.connect(addr, token="t-root")      # the admin gets in
        assert (await root.call(T.STATS))["clients"] == 2
        late = await V3Client.connect(addr, hello=False)         # and nobody else now
        msg = await late.request(T.HELLO, proto=3, client="y", token="t-root")
        assert msg.type == T.ERROR and msg.body["code"] == "SERVER_FULL"
        await late.wait_closed()
        await bob.close()
        await poll(lambda: len(srv.connections) == 1)
        bob3 = await V3Client.connect(addr, token="t-bob")       # bob's slot is free again
        assert (await bob3.call(T.STATS))["clients"] == 2
        await bob3.close()
        await root.close()


async def test_without_an_admin_no_slot_is_reserved(tmp_path):
    users = auth(("bob", "t-bob", False))
    async with running_server(tmp_path, max_clients=1, sections=users) as (srv, addr):
        bob = await V3Client.connect(addr, token="t-bob")
        extra = await V3Client.connect(addr, hello=False)
        msg = await extra.request(T.HELLO, proto=3, client="x", token="t-bob")
        assert msg.type == T.ERROR and msg.body["code"] == "SERVER_FULL"
        assert "reserved" not in msg.body["message"]             # refused at once, as before
        await extra.wait_closed()
        await bob.close()
