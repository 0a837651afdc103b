"""CLIENT_LIST / CLIENT_KILL over TCP: admins only, what a listing shows, who gets killed and how."""
from __future__ import annotations

import asyncio

from protocol import MsgType
from server.auth import hash_token
from testkit.server import ReplyError, V3Client, poll, running_server
from testkit.v2client import CHAT_TEXT, V2Client

T = MsgType
USERS = {"auth": {"users": [{"user_id": "root", "token_sha256": hash_token("t-root"), "admin": True},
                            {"user_id": "bob", "token_sha256": hash_token("t-bob")}]}}


async def error_of(client: V3Client, msg_type: int, **body) -> dict:
    try:
        await client.call(msg_type, **body)
    except ReplyError as exc:
        return exc.body
    raise AssertionError("expected an ERROR")


async def test_only_admins_may_list_and_kill(tmp_path):
    async with running_server(tmp_path, sections=USERS) as (srv, addr):
        bob = await V3Client.connect(addr, token="t-bob")
        for t, body in ((T.CLIENT_LIST, {}), (T.CLIENT_KILL, {"user": "root"})):
            err = await error_of(bob, t, **body)
            assert err["code"] == "FORBIDDEN" and err["fatal"] is False
        assert (await bob.call(T.PING))["re"]        # still usable
        await bob.close()


async def test_list_shows_every_connection_and_kill_closes_the_matching_ones(tmp_path):
    async with running_server(tmp_path, sections=USERS) as (srv, addr):
        root = await V3Client.connect(addr, token="t-root")
        bob1 = await V3Client.connect(addr, token="t-bob")
        bob2 = await V3Client.connect(addr, token="t-bob")
        silent = await V3Client.connect(addr, hello=False)     # connected, nothing sent yet
        await poll(lambda: len(srv.connections) == 4)
        clients = (await root.call(T.CLIENT_LIST))["clients"]
        assert [c["user"] for c in clients] == ["root", "bob", "bob", None]
        assert [c["me"] for c in clients] == [True, False, False, False]
        assert [c["state"] for c in clients] == ["ready", "ready", "ready", "grace"]
        assert [c["proto"] for c in clients] == ["v3", "v3", "v3", None]
        assert clients[1]["session"] == bob1.session_id and clients[3]["session"] is None
        assert all(c["peer"].startswith("127.0.0.1:") and c["age_s"] >= 0 and c["idle_s"] >= 0
                   and c["buffered"] == 0 and c["output"] >= 0 for c in clients)
        ids = [c["id"] for c in clients]
        assert ids == sorted(ids)
        # by id: only that one, told why
        assert (await root.call(T.CLIENT_KILL, client_id=ids[1]))["killed"] == [ids[1]]
        await bob1.wait_closed()
        err = [m.body for m in bob1.inbox if m.type == T.ERROR]
        assert err and err[0]["code"] == "CLIENT_KILLED" and err[0]["fatal"] is True and "root" in err[0]["message"]
        # not the requester itself, and nothing that does not match
        assert (await error_of(root, T.CLIENT_KILL, client_id=ids[0]))["code"] == "NOT_FOUND"
        assert (await error_of(root, T.CLIENT_KILL, user="nobody"))["code"] == "NOT_FOUND"
        assert (await error_of(root, T.CLIENT_KILL))["code"] == "INVALID_MESSAGE"
        # by address: every other connection from 127.0.0.1 (bob2 and the silent one)
        killed = (await root.call(T.CLIENT_KILL, peer="127.0.0.1"))["killed"]
        assert killed == [ids[2], ids[3]]
        await bob2.wait_closed()
        await silent.wait_closed()
        await poll(lambda: len(srv.connections) == 1)
        assert [c["id"] for c in (await root.call(T.CLIENT_LIST))["clients"]] == [ids[0]]
        await root.close()


async def test_in_single_user_mode_local_is_the_admin_and_v2_clients_can_be_killed(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        admin = await V3Client.connect(addr)
        v2, _ = await V2Client.connect(addr)
        v2.send(CHAT_TEXT, "HEARTBEAT")
        assert await v2.recv_text() == "HEARTBEAT"
        clients = (await admin.call(T.CLIENT_LIST))["clients"]
        legacy = [c for c in clients if c["proto"] == "v2"]
        assert len(legacy) == 1 and legacy[0]["state"] == "legacy" and legacy[0]["user"] == "local"
        peer = legacy[0]["peer"]
        assert (await admin.call(T.CLIENT_KILL, peer=peer, user="local"))["killed"] == [legacy[0]["id"]]
        assert await v2.recv_text() == "Connection closed by an administrator."
        assert await asyncio.wait_for(v2.reader.read(), 5) == b""
        assert v2.only_v2_codes()
        await v2.close()
        await admin.close()
