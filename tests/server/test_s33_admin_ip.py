"""Review s33 (t8_adminlock.py): sockets that never finish their HELLO, max_clients_per_ip of them on
the admin's own address (an SSH tunnel's 127.0.0.1), kept the admin out: the per-address refusal came
before the admin's HELLO was read. Now an address at its limit has one more place, on standby, for an
admin's HELLO (``server.conn_limits.IP_STANDBY``, ``IP_ADMIN_EXTRA``)."""
from __future__ import annotations

import asyncio
import time

from protocol import MsgType, encode_frame
from server.auth import hash_token
from testkit.server import DEADLINE, V3Client, poll, running_server
from testkit.raw_sockets import error_code, read_to_eof, squat
from testkit.v2client import CHAT_TEXT

T = MsgType
USERS = {"auth": {"users": [{"user_id": u, "token_sha256": hash_token(t), "admin": a}
                            for u, t, a in (("alice", "t-alice", False), ("ops", "t-ops", True))]}}


async def test_sockets_stuck_in_their_handshake_on_the_admins_address_cannot_keep_the_admin_out(tmp_path):
    async with running_server(tmp_path, max_clients_per_ip=4, handshake_timeout_s=30.0, legacy_grace_ms=100,
                              sections=USERS) as (srv, addr):
        held = [await squat(addr) for _ in range(4)]                    # every place of 127.0.0.1
        await poll(lambda: len(srv.connections) == 4, what="the squatters counted")
        ops = await V3Client.connect(addr, token="t-ops", new_session=False)   # before: TOO_MANY_CONNECTIONS
        assert ops.hello["user"] == "ops"
        clients = (await ops.call(T.CLIENT_LIST))["clients"]
        assert sorted(c["state"] for c in clients) == ["handshaking"] * 4 + ["ready"]
        assert not any(r.at_eof() for r, _ in held)                     # the extra place: nobody closed
        ops2 = await V3Client.connect(addr, token="t-ops", new_session=False)   # a second admin: past the extra
        assert ops2.hello["user"] == "ops"                                     # place, one squatter closed for it
        assert error_code(await read_to_eof(held[0][0])) == "TOO_MANY_CONNECTIONS"   # the oldest
        assert not any(r.at_eof() for r, _ in held[1:])
        victim = next(c for c in (await ops.call(T.CLIENT_LIST))["clients"] if c["state"] == "handshaking")
        assert (await ops.call(T.CLIENT_KILL, client_id=victim["id"]))["killed"] == [victim["id"]]
        await poll(lambda: len(srv.connections) == 4, what="the killed squatter gone")
        # anybody else from the address is still refused, v3 and v2 alike
        alice = await V3Client.connect(addr, hello=False)
        msg = await alice.request(T.HELLO, proto=3, client="x", token="t-alice")
        assert msg.type == T.ERROR and msg.body["code"] == "TOO_MANY_CONNECTIONS" and msg.body["fatal"] is True
        await alice.wait_closed()
        reader, writer = await asyncio.open_connection(*addr)
        writer.write(encode_frame(CHAT_TEXT, 0, b"hello"))
        assert await asyncio.wait_for(reader.read(), DEADLINE) == encode_frame(
            CHAT_TEXT, 0, b"Too many connections from 127.0.0.1 (max_clients_per_ip = 4); try again later.")
        writer.close()
        for _, w in held:
            w.close()
        await ops.close()
        await ops2.close()


async def test_sockets_refilling_the_standby_place_cannot_keep_the_admin_out(tmp_path):
    """The standby place of an address goes to its newest connection (the one there before, its HELLO
    not being checked, is refused): squatters that take it again as soon as it is closed
    (standby_timeout_s, or a newer squatter) do not keep the admin's connection from it."""
    async with running_server(tmp_path, max_clients_per_ip=3, handshake_timeout_s=30.0, standby_timeout_s=0.3,
                              sections=USERS) as (srv, addr):
        held = [await squat(addr) for _ in range(3)]
        await poll(lambda: len(srv.connections) == 3, what="the squatters counted")
        stop, squats, codes = asyncio.Event(), [0], set()

        async def squatter() -> None:
            while not stop.is_set():
                reader, writer = await squat(addr)
                squats[0] += 1
                codes.add(error_code(await read_to_eof(reader)))
                writer.close()

        flood = [asyncio.create_task(squatter()) for _ in range(2)]
        try:
            await poll(lambda: squats[0] >= 6, what="the standby place taken again and again")
            for _ in range(5):
                t0 = time.monotonic()
                ops = await V3Client.connect(addr, token="t-ops", new_session=False)
                assert ops.hello["user"] == "ops" and time.monotonic() - t0 < 0.3 + 2   # standby_timeout_s + slack
                await ops.close()
                await poll(lambda: len(srv.connections) == 3, what="the admin gone")
            before = squats[0]
            await poll(lambda: squats[0] > before + 2, what="the flood still going")
        finally:
            stop.set()
            for t in flood:
                t.cancel()
            await asyncio.gather(*flood, return_exceptions=True)
        assert codes <= {"TOO_MANY_CONNECTIONS", None}
        assert not any(r.at_eof() for r, _ in held)   # the address had its extra place for the admin
        for _, w in held:
            w.close()


async def test_an_admin_on_an_address_at_its_limit_and_a_full_server_gets_in(tmp_path):
    """Both limits at once (was test_standby_connections_count_against_max_clients_per_ip, whose
    fourth connection, the admin's, was refused): max_clients = 1 held by alice, the admin slot by a
    squatter, one more squatter on standby; the admin's connection from the same address is on the
    address's standby place and takes the admin slot's squatter's place."""
    async with running_server(tmp_path, max_clients=1, max_clients_per_ip=3, handshake_timeout_s=30.0,
                              standby_timeout_s=30.0, sections=USERS) as (srv, addr):
        alice = await V3Client.connect(addr, token="t-alice")
        held = [await squat(addr) for _ in range(2)]             # the admin slot, then one on standby
        await poll(lambda: len(srv.connections) == 2 and len(srv._admin_slot.waiting) == 1, what="both held")
        ops = await V3Client.connect(addr, token="t-ops", new_session=False)   # a fourth from this address
        assert ops.hello["user"] == "ops"
        assert error_code(await read_to_eof(held[0][0])) == "SERVER_FULL"   # the oldest in its handshake
        late = await V3Client.connect(addr, hello=False)          # a fifth: the address is past its limit
        msg = await late.request(T.HELLO, proto=3, client="x", token="t-alice")
        assert msg.type == T.ERROR and msg.body["code"] == "TOO_MANY_CONNECTIONS"
        await late.wait_closed()
        for _, writer in held:
            writer.close()
        await poll(lambda: not srv._admin_slot.waiting, what="the standby connection gone with its socket")
        await alice.close()
        await ops.close()


async def test_on_an_address_in_login_back_off_a_refusal_on_standby_comes_as_late_as_a_failed_login(tmp_path):
    """A HELLO on standby is checked, so from an address in back-off a right token refused there
    (TOO_MANY_CONNECTIONS) is answered after failed_login_delay_s, as a wrong one is: an answer at
    once would tell a guess was right. The admin still gets in."""
    users = {"auth": {**USERS["auth"], "max_failed_logins": 1, "failed_login_delay_s": 0.5}}
    async with running_server(tmp_path, max_clients_per_ip=1, handshake_timeout_s=30.0, standby_timeout_s=5.0,
                              sections=users) as (srv, addr):
        held = await squat(addr)
        await poll(lambda: len(srv.connections) == 1, what="the squatter counted")
        for token, code, slow in (("wrong", "AUTH_FAILED", False), ("t-alice", "TOO_MANY_CONNECTIONS", True)):
            c = await V3Client.connect(addr, hello=False)          # on standby: its HELLO is checked
            t0 = time.monotonic()
            msg = await c.request(T.HELLO, proto=3, client="x", token=token)
            assert msg.type == T.ERROR and msg.body["code"] == code, msg.body
            assert (time.monotonic() - t0 >= 0.45) == slow      # the first failure starts the back-off
            await c.wait_closed()
        ops = await V3Client.connect(addr, token="t-ops", new_session=False)
        assert ops.hello["user"] == "ops"
        held[1].close()
        await ops.close()
