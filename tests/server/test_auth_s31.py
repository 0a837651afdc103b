"""Review s31: the admin slot against anonymous squatters, failed-login throttling per address and its
log lines, strict user and group names, tokens no HELLO accepts, KB_LIST cursors.

The wire tests run a real server over loopback; a second client address is 127.0.0.2 (Linux routes
all of 127.0.0.0/8 to lo).
"""
from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import struct
import time
from pathlib import Path

import pytest

from client.events import Connected, Disconnected
from client.link import Backoff, Link
from protocol import MsgType
from protocol.messages import MAX_TOKEN_CHARS
from server.app import Server
from server.auth import LoginGuard, address_key, hash_token, token_problem
from server.config import AuthConfig, ServerConfig
from server.config_base import ConfigError
from testkit.echo_agent import EchoAgent
from testkit.server import DEADLINE, ReplyError, V3Client, make_config, poll, running_server
from testkit.raw_sockets import error_code, read_to_eof, squat

T = MsgType
DATA = Path(__file__).parent / "data"
CERT, KEY = str(DATA / "test_cert.pem"), str(DATA / "test_key.pem")
OTHER_ADDRESS = "127.0.0.2"


def auth(*users: tuple[str, str, bool], **settings) -> dict:
    return {"auth": {"users": [{"user_id": u, "token_sha256": hash_token(t), "admin": a} for u, t, a in users],
                     **settings}}


USERS = auth(("alice", "t-alice", False), ("ops", "t-ops", True))


async def connect_from(addr, local: str, **hello) -> V3Client:
    """A client from ``local`` (a loopback address), past HELLO with ``hello``'s fields."""
    reader, writer = await asyncio.open_connection(*addr, local_addr=(local, 0))
    client = V3Client(reader, writer)
    client.hello = await client.call(T.HELLO, proto=3, client="s31", **hello)
    return client


# -- 1. the admin slot ------------------------------------------------------------------------------------
async def test_a_socket_stuck_in_its_handshake_cannot_keep_the_admin_out(tmp_path):
    async with running_server(tmp_path, max_clients=2, max_clients_per_ip=0, handshake_timeout_s=30.0,
                              sections=USERS) as (srv, addr):
        a1 = await V3Client.connect(addr, token="t-alice")
        a2 = await V3Client.connect(addr, token="t-alice")
        reader, writer = await squat(addr)                        # takes the admin slot, without a token
        await poll(lambda: len(srv.connections) == 3, what="the squatter counted")
        ops = await V3Client.connect(addr, token="t-ops", new_session=False)   # before: SERVER_FULL
        assert ops.hello["user"] == "ops"
        assert error_code(await read_to_eof(reader)) == "SERVER_FULL"        # the squatter was closed for it
        assert (await ops.call(T.STATS))["clients"] == 3
        clients = (await ops.call(T.CLIENT_LIST))["clients"]
        assert sorted(c["user"] or "" for c in clients) == ["alice", "alice", "ops"]
        late = await V3Client.connect(addr, hello=False)          # the admin slot is the admin's now
        msg = await late.request(T.HELLO, proto=3, client="x", token="t-ops")
        assert msg.type == T.ERROR and msg.body["code"] == "SERVER_FULL"
        await late.wait_closed()
        writer.close()
        for c in (a1, a2, ops):
            await c.close()


async def test_a_reconnecting_flood_of_squatters_cannot_keep_the_admin_out(tmp_path):
    """probe_adminslot_loop.py, with 8 squatters reconnecting as soon as they are closed."""
    async with running_server(tmp_path, max_clients=2, max_clients_per_ip=0, handshake_timeout_s=30.0,
                              standby_timeout_s=0.5, sections=USERS) as (srv, addr):
        a1 = await V3Client.connect(addr, token="t-alice")
        a2 = await V3Client.connect(addr, token="t-alice")
        stop, squats, codes = asyncio.Event(), [0], set()

        async def squatter() -> None:
            while not stop.is_set():
                reader, writer = await squat(addr)
                squats[0] += 1
                codes.add(error_code(await read_to_eof(reader)))
                writer.close()

        flood = [asyncio.create_task(squatter()) for _ in range(8)]
        try:
            await poll(lambda: squats[0] >= 16 and len(srv.connections) == 3, what="the flood going")
            for _ in range(5):
                t0 = time.monotonic()
                ops = await V3Client.connect(addr, token="t-ops", new_session=False)
                assert ops.hello["user"] == "ops" and time.monotonic() - t0 < 0.5 + 2   # standby_timeout_s + slack
                assert (await ops.call(T.STATS))["clients"] <= 4   # (a displaced squatter may still be closing)
                await ops.close()
            before = squats[0]
            await poll(lambda: squats[0] > before + 8, what="the flood still going")
        finally:
            stop.set()
            for t in flood:
                t.cancel()
            await asyncio.gather(*flood, return_exceptions=True)
        assert codes <= {"SERVER_FULL", None}
        assert (await a1.call(T.STATS))["clients"] >= 2         # the users who hold slots were never touched
        await a1.close()
        await a2.close()


async def test_standby_connections_get_a_slot_only_for_an_admin_and_only_for_a_short_time(tmp_path):
    async with running_server(tmp_path, max_clients=1, max_clients_per_ip=0, handshake_timeout_s=30.0,
                              standby_timeout_s=0.3, sections=USERS) as (srv, addr):
        alice = await V3Client.connect(addr, token="t-alice")
        reader, writer = await squat(addr)                        # in the admin slot
        await poll(lambda: len(srv.connections) == 2, what="the squatter counted")
        for token, code in (("t-alice", "SERVER_FULL"), ("wrong", "AUTH_FAILED"), (None, "AUTH_FAILED")):
            extra = await V3Client.connect(addr, hello=False)      # at the hard limit: on standby
            msg = await extra.request(T.HELLO, proto=3, client="x", **({"token": token} if token else {}))
            assert msg.type == T.ERROR and msg.body["code"] == code, (token, msg.body)
            await extra.wait_closed()
        t0 = time.monotonic()
        r2, w2 = await squat(addr)                                # on standby: no HELLO in time
        assert error_code(await read_to_eof(r2)) == "SERVER_FULL"
        assert time.monotonic() - t0 < 5.0                        # standby_timeout_s, not handshake_timeout_s
        w2.close()
        assert len(srv.connections) == 2 and not reader.at_eof()      # nothing displaced for them
        writer.close()
        await alice.close()


async def test_standby_connections_count_against_max_clients_per_ip(tmp_path):
    async with running_server(tmp_path, max_clients=1, max_clients_per_ip=3, handshake_timeout_s=30.0,
                              standby_timeout_s=30.0, sections=USERS) as (srv, addr):
        alice = await V3Client.connect(addr, token="t-alice")
        held = [await squat(addr) for _ in range(2)]             # the admin slot, then one on standby
        await poll(lambda: len(srv.connections) == 2 and len(srv._admin_slot.waiting) == 1, what="both held")
        extra = await V3Client.connect(addr, hello=False)         # a fourth from this address: only for an admin
        msg = await extra.request(T.HELLO, proto=3, client="x", token="t-alice")
        assert msg.type == T.ERROR and msg.body["code"] == "TOO_MANY_CONNECTIONS"
        await extra.wait_closed()
        ops = await connect_from(addr, OTHER_ADDRESS, token="t-ops")   # from another address: standby, then in
        assert ops.hello["user"] == "ops"
        assert error_code(await read_to_eof(held[0][0])) == "SERVER_FULL"   # the oldest in its handshake
        for _, writer in held:
            writer.close()
        await poll(lambda: not srv._admin_slot.waiting, what="the standby connection gone with its socket")
        await alice.close()
        await ops.close()


async def test_over_tls_a_silent_handshake_cannot_keep_the_admin_out(tmp_path):
    cfg = make_config(tmp_path, tls_cert=CERT, tls_key=KEY, max_clients=1, max_clients_per_ip=0,
                      handshake_timeout_s=30.0, sections=USERS)
    srv = Server(cfg, agent=EchoAgent(), memory="basic")
    await srv.start()
    ctx = ssl.create_default_context(cafile=CERT)

    async def tls_client(token: str) -> V3Client:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(srv.host, srv.port, ssl=ctx, server_hostname="localhost"), DEADLINE)
        client = V3Client(reader, writer)
        client.hello = await client.call(T.HELLO, proto=3, client="tls", token=token)
        return client

    try:
        alice = await tls_client("t-alice")
        reader, writer = await asyncio.open_connection(srv.host, srv.port)   # no ClientHello, ever
        await poll(lambda: srv.tls_handshakes == 1, what="the silent handshake counted")
        ops = await tls_client("t-ops")                                       # before: closed at accept
        assert ops.hello["user"] == "ops"
        assert await read_to_eof(reader) == b""                               # the silent one was closed
        assert srv.tls_handshakes == 0 and (await ops.call(T.STATS))["clients"] == 2
        writer.close()
        await alice.close()
        await ops.close()
    finally:
        await srv.stop()


async def test_over_tls_standby_lasts_standby_timeout_s_from_the_accept_its_handshake_included(tmp_path):
    """t7_tls_standby_time.py: the TLS handshake had standby_timeout_s, then the standby timer started again."""
    cfg = make_config(tmp_path, tls_cert=CERT, tls_key=KEY, max_clients=1, max_clients_per_ip=0,
                      handshake_timeout_s=30.0, standby_timeout_s=2.0, sections=USERS)
    srv = Server(cfg, agent=EchoAgent(), memory="basic")
    await srv.start()
    ctx = ssl.create_default_context(cafile=CERT)
    try:
        reader, writer = await asyncio.open_connection(srv.host, srv.port, ssl=ctx, server_hostname="localhost")
        alice = V3Client(reader, writer)
        await alice.call(T.HELLO, proto=3, client="tls", token="t-alice")       # the regular slot
        _, silent = await asyncio.open_connection(srv.host, srv.port)          # the admin slot: no ClientHello
        await poll(lambda: srv.tls_handshakes == 1, what="the silent handshake counted")
        t0 = time.monotonic()
        r, w = await asyncio.open_connection(srv.host, srv.port)               # on standby from its accept
        await poll(lambda: len(srv._admin_slot.waiting) == 1, what="on standby")
        await asyncio.sleep(1.0)     # (not a synchronisation: a slow ClientHello, well within standby_timeout_s)
        await w.start_tls(ctx, server_hostname="localhost")
        w.write(bytes([T.HELLO]))                                              # a HELLO never finished
        assert error_code(await read_to_eof(r)) == "SERVER_FULL"
        assert time.monotonic() - t0 < 2.6                                     # before: 1.0 + 2.0 s
        w.close()
        silent.close()
        await alice.close()
    finally:
        await srv.stop()


# -- 2. failed logins ---------------------------------------------------------------------------------------
async def test_failed_logins_from_one_address_are_throttled_without_touching_other_addresses(tmp_path):
    users = auth(("alice", "t-alice", False), max_failed_logins=3)
    async with running_server(tmp_path, max_clients_per_ip=0, sections=users) as (srv, addr):
        guard = srv.services.auth.guard
        guard.delay_s = 0.5
        for i in range(3):
            with pytest.raises(ReplyError) as err:
                await V3Client.connect(addr, token=f"guess-{i}")
            assert err.value.code == "AUTH_FAILED"
        assert "for 60 s its failed logins are answered after 0.5 s" in err.value.body["message"]   # the third
        t0 = time.monotonic()
        with pytest.raises(ReplyError) as err:                    # in back-off: a wrong token waits (a tarpit)
            await V3Client.connect(addr, token="guess-3")
        assert time.monotonic() - t0 >= 0.5
        assert err.value.code == "AUTH_FAILED" and err.value.body["fatal"] is True
        assert "too many failed logins from this address" in err.value.body["message"]
        other = await connect_from(addr, OTHER_ADDRESS, token="t-alice")   # another address: unaffected
        assert other.hello["user"] == "alice"
        with pytest.raises(ReplyError):                           # one failure there: still welcome after it
            await connect_from(addr, OTHER_ADDRESS, token="nope")
        again = await connect_from(addr, OTHER_ADDRESS, token="t-alice")
        assert again.hello["user"] == "alice" and srv.services.auth.guard.addresses == 2
        await other.close()
        await again.close()


async def test_the_right_tokens_log_in_from_an_address_in_back_off_after_the_same_delay(tmp_path):
    """t3_lockout.py: ten bad HELLOs locked the admin and every user at that address (a NAT, an SSH
    tunnel's 127.0.0.1) out, for as long as someone kept guessing. Right tokens log in; from an
    address in back-off after the same delay as wrong ones (t_tarpit_oracle.py: were only failures
    delayed, a guesser hanging up after 50 ms without an answer knew the guess was wrong)."""
    async with running_server(tmp_path, max_clients_per_ip=0, sections={"auth": {**USERS["auth"],
                                                                                 "max_failed_logins": 3}}) as (srv, addr):
        guard = srv.services.auth.guard
        guard.delay_s = 0.5
        for i in range(3):
            with pytest.raises(ReplyError):
                await V3Client.connect(addr, token=f"guess-{i}")
        assert guard.retry_after("127.0.0.1") > 0
        t0 = time.monotonic()
        ops = await V3Client.connect(addr, token="t-ops", new_session=False)
        alice = await V3Client.connect(addr, token="t-alice", new_session=False)
        assert ops.hello["user"] == "ops" and alice.hello["user"] == "alice"
        assert time.monotonic() - t0 >= 2 * 0.5                    # (each waited as a wrong one would)
        assert guard.retry_after("127.0.0.1") > 0 and guard.failures("127.0.0.1") == 0   # (no failure counted)
        await ops.close()
        await alice.close()


async def test_a_delayed_failed_login_ends_with_its_client_or_with_the_server(tmp_path):
    users = auth(("alice", "t-alice", False), max_failed_logins=3)
    async with running_server(tmp_path, max_clients_per_ip=0, handshake_timeout_s=30.0,
                              sections=users) as (srv, addr):
        guard = srv.services.auth.guard
        guard.delay_s = 60.0
        for i in range(3):
            with pytest.raises(ReplyError):
                await V3Client.connect(addr, token=f"guess-{i}")
        leaving = await V3Client.connect(addr, hello=False)
        leaving.send(T.HELLO, {"id": 1, "proto": 3, "client": "x", "token": "guess-3"})
        await poll(lambda: guard.failures("127.0.0.1") == 1, what="the guess counted")
        assert len(srv.connections) == 1 and not leaving.closed.is_set()   # held, its slot taken, unanswered
        sock = leaving.writer.get_extra_info("socket")            # the client leaves (a reset): its connection goes
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        leaving.writer.transport.abort()
        await poll(lambda: not srv.connections, what="the delayed connection closed with its client")
        staying = await V3Client.connect(addr, hello=False)
        staying.send(T.HELLO, {"id": 1, "proto": 3, "client": "x", "token": "guess-4"})
        await poll(lambda: guard.failures("127.0.0.1") == 2, what="the second guess counted")
        await asyncio.wait_for(srv.stop(), DEADLINE)              # the stop does not wait for the delay
        await staying.wait_closed()
        assert [(m.type, m.body["code"]) for m in staying.inbox] == [(T.ERROR, "SHUTTING_DOWN")]


async def test_a_client_reconnects_with_its_token_while_its_address_is_in_back_off(tmp_path):
    """t4_client_gives_up.py: the back-off's AUTH_FAILED made a client whose connection dropped give up."""
    async with running_server(tmp_path, max_clients_per_ip=0, sections={"auth": {**USERS["auth"],
                                                                                 "max_failed_logins": 3}}) as (srv, addr):
        srv.services.auth.guard.delay_s = 0.3
        link = Link(*addr, token="t-alice", backoff=Backoff(initial=0.05, maximum=0.2))
        try:
            assert (await link.connect()).user == "alice"
            for i in range(3):                                    # someone else behind the same address guesses
                with pytest.raises(ReplyError):
                    await V3Client.connect(addr, token=f"guess-{i}")
            ops = await connect_from(addr, OTHER_ADDRESS, token="t-ops")
            await ops.call(T.CLIENT_KILL, user="alice")           # (stands for any network blip)
            while True:
                ev = await link.next_event(timeout=DEADLINE)
                assert ev is not None and not isinstance(ev, Disconnected), ev
                if isinstance(ev, Connected) and ev.reconnected:
                    break
            assert ev.hello.user == "alice" and link.connected
            await ops.close()
        finally:
            await link.close()


async def test_a_burst_of_failed_logins_writes_one_log_line(tmp_path, caplog):
    """probe_logwipe.py: 400 anonymous failed logins wrote 400 lines and rotated the admin's warnings out."""
    caplog.set_level(logging.INFO, logger="nplt.conn")
    users = auth(("alice", "t-alice", False), max_failed_logins=0)   # (no back-off: every token is checked)
    async with running_server(tmp_path, max_clients_per_ip=0, sections=users) as (srv, addr):
        for i in range(40):
            with pytest.raises(ReplyError) as err:
                await V3Client.connect(addr, token=f"guess-{i}")
            assert err.value.code == "AUTH_FAILED"
        for _ in range(20):                                       # other failures before HELLO, likewise
            c = await V3Client.connect(addr, hello=False)
            msg = await c.request(T.HELLO, proto=2, client="old")
            assert msg.body["code"] == "UNSUPPORTED_VERSION"
            await c.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "nplt.conn"]
    failed = [line for line in lines if "AUTH_FAILED" in line]
    assert len(failed) == 1 and failed[0].endswith(": failed login: AUTH_FAILED invalid token")   # the first
    assert len([line for line in lines if "UNSUPPORTED_VERSION" in line]) == 1


def test_login_guard_window_back_off_expiry_and_bounded_table():
    now = [1000.0]
    cfg = AuthConfig.from_dict({"users": [{"user_id": "a", "token_sha256": hash_token("x")}],
                                "max_failed_logins": 3, "failed_login_window_s": 10.0, "login_backoff_s": 30.0,
                                "max_login_addresses": 4})
    g = LoginGuard(cfg, clock=lambda: now[0])
    assert [g.failed("10.0.0.1") for _ in range(2)] == ["", ""] and g.retry_after("10.0.0.1") == 0.0
    now[0] += 11                                                  # the window passed: counting starts again
    assert g.failed("10.0.0.1") == "" and g.failed("10.0.0.1") == ""
    assert g.failed("10.0.0.1").startswith("; 3 failed logins from this address within 10 s")
    assert g.retry_after("10.0.0.1") == 30.0 and g.retry_after("10.0.0.2") == 0.0
    now[0] += 29.5
    assert g.retry_after("10.0.0.1") == pytest.approx(0.5)
    now[0] += 0.5
    assert g.retry_after("10.0.0.1") == 0.0                       # over by itself, no login needed
    for i in range(100):                                          # many addresses: at most 4 remembered
        g.failed(f"192.0.2.{i}")
    assert g.addresses <= 4
    now[0] += 60                                                  # and what is over is forgotten
    g.failed("198.51.100.1")
    assert g.addresses == 1
    single = LoginGuard(AuthConfig.from_dict({"max_failed_logins": 1}))   # no users: nothing fails, nothing kept
    assert single.failed("10.0.0.1") == "" and single.retry_after("10.0.0.1") == 0.0 and single.addresses == 0


def test_ipv6_addresses_are_counted_by_their_64_network():
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")
    assert address_key("::ffff:192.0.2.7") == "192.0.2.7" and address_key("192.0.2.7") == "192.0.2.7"
    assert address_key("?") == "?"


@pytest.mark.parametrize("key, value", [("max_failed_logins", -1), ("failed_login_window_s", 0),
                                        ("login_backoff_s", 0.5), ("max_login_addresses", 0),
                                        ("failed_login_delay_s", -1), ("failed_login_delay_s", 6)])
def test_login_throttle_settings_are_checked(key, value):
    with pytest.raises(ConfigError, match=f"auth.{key}"):
        ServerConfig.from_dict({"auth": {key: value}}, env={})


# -- 3. user and group names -------------------------------------------------------------------------------
@pytest.mark.parametrize("entry, key", [({"user_id": "alice\n"}, "user_id"), ({"user_id": "alice", "groups": ["ops\n"]},
                                                                             "groups")])
def test_a_trailing_newline_is_not_part_of_a_valid_name(entry, key):
    users = [{"user_id": "alice", "token_sha256": hash_token("a")},
             {"token_sha256": hash_token("b"), **entry}]
    if key == "groups":
        users = users[1:]
    with pytest.raises(ConfigError, match=key):
        ServerConfig.from_dict({"auth": {"users": users}}, env={})


# -- 4. tokens no HELLO accepts ----------------------------------------------------------------------------
def test_token_problem_names_the_tokens_hello_refuses():
    assert token_problem("") == "the token is empty"
    assert token_problem("k" * MAX_TOKEN_CHARS) is None
    assert "4097 characters" in token_problem("k" * (MAX_TOKEN_CHARS + 1))


# -- 5. KB_LIST cursors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("cursor", ["x|y", "|", "2026-11-27T10:00:00+00:00|y", "x|" + "0" * 24,
                                    "2026-11-27T10:00:00+00:00|" + "0" * 23 + "G",
                                    "2026-11-27T10:00:00+00:00|" + "0" * 24 + "\n"])
async def test_kb_list_refuses_a_cursor_that_is_not_a_next_before(tmp_path, cursor):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr, new_session=False)
        with pytest.raises(ReplyError) as err:
            await c.call(T.KB_LIST, before=cursor)
        assert err.value.code == "INVALID_MESSAGE" and "next_before" in err.value.body["message"]
        ok = await c.call(T.KB_LIST, before="2026-11-27T10:00:00.123456+00:00|" + "0a" * 12)
        assert ok["documents"] == [] and ok["has_more"] is False
        await c.close()
