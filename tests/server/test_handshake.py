"""HELLO, authentication, handshake and idle timeouts, server heartbeat."""
from __future__ import annotations

import asyncio

import pytest

from protocol import Connection, MsgType, Role, encode_frame
from testkit.server import ReplyError, V3Client, poll, running_server
from testkit.v2client import CHAT_TEXT, V2Client

T = MsgType


async def test_hello_reply_describes_server_and_session(tmp_path):
    async with running_server(tmp_path, max_page_size=150) as (srv, addr):
        c = await V3Client.connect(addr)
        h = c.hello
        assert h["server"] == "nplt-assistant/0.1.0" and h["proto"] == 3 and h["user"] == "local"
        assert h["session_restored"] is False and h["running_turn"] is None
        assert h["limits"]["max_page_size"] == 150 and h["limits"]["max_pending_requests"] == 32
        assert {"sessions", "history", "chat", "cancel"} <= set(h["capabilities"])
        assert h["agent"] == {"name": "echo", "offline": True, "model": "echo"}
        assert h["session"]["session_id"].startswith("s_") and h["session"]["message_count"] == 0
        again = await V3Client.connect(addr)  # the user's newest session is reused
        assert again.session_id == c.session_id and again.hello["session_restored"] is False
        restored = await V3Client.connect(addr, session_id=c.session_id)
        assert restored.hello["session_restored"] is True
        unknown = await V3Client.connect(addr, session_id="s_20200101_0123456789ab")
        assert unknown.hello["session_restored"] is False and unknown.session_id == c.session_id
        with pytest.raises(ReplyError) as err:
            await c.call(T.HELLO, proto=3, client="x")
        assert err.value.code == "INVALID_MESSAGE"
        for x in (c, again, restored, unknown):
            await x.close()


async def test_unsupported_version_is_fatal(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr, hello=False)
        msg = await c.request(T.HELLO, proto=2, client="old")
        assert msg.type == T.ERROR and msg.body["code"] == "UNSUPPORTED_VERSION" and msg.body["fatal"] is True
        await c.wait_closed()
        await c.close()


async def test_invalid_hello_then_another_request_is_handshake_required(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr, hello=False)
        msg = await c.request(T.HELLO, proto=3)  # no "client"
        assert msg.body["code"] == "INVALID_MESSAGE" and msg.body["fatal"] is False
        assert "'client'" in msg.body["message"]
        msg = await c.request(T.PING)
        assert msg.type == T.ERROR and msg.body["code"] == "HANDSHAKE_REQUIRED" and msg.body["fatal"] is True
        await c.wait_closed()
        assert c.protocol_error is None  # the fatal ERROR frame carried the right seq
        await c.close()
        # invalid JSON in HELLO is recoverable: a valid HELLO afterwards works
        c = await V3Client.connect(addr, hello=False)
        c.send_bytes(c.codec.send_raw(T.HELLO, b"{not json"))
        err = await c.wait_type(T.ERROR)
        assert err.body["code"] == "INVALID_JSON" and err.body["re"] is None
        ok = await c.call(T.HELLO, proto=3, client="retry")
        assert ok["user"] == "local"
        await c.close()


async def test_requests_pipelined_behind_hello_are_answered(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        first = await V3Client.connect(addr)        # the user's session, which HELLO attaches to
        c = await V3Client.connect(addr, hello=False)
        loop = asyncio.get_running_loop()
        futs = {}
        data = b""
        for rid, (t, body) in enumerate([(T.HELLO, {"proto": 3, "client": "fast"}), (T.PING, {}),
                                         (T.SESSION_INFO, {}), (T.STATS, {})], start=1):
            futs[rid] = c._waiting[rid] = loop.create_future()
            data += c.codec.send(t, {"id": rid, **body})
        c.send_bytes(data)  # one write: HELLO and three requests
        replies = [await asyncio.wait_for(futs[i], 5) for i in range(1, 5)]
        assert [m.type for m in replies] == [T.RESPONSE, T.PONG, T.RESPONSE, T.RESPONSE]
        assert replies[2].body["session"]["session_id"] == replies[0].body["session"]["session_id"] \
            == first.session_id
        await c.close()
        await first.close()


BAD_TOKENS = [None, "wrong", "", " ", 123, 0, False, [], {"token": "s3cret"}, ["s3cret"], "s3cret" * 1000]


async def test_authentication(tmp_path):
    async with running_server(tmp_path, users=[("alice", "s3cret")]) as (srv, addr):
        ok = await V3Client.connect(addr, token="s3cret")
        assert ok.hello["user"] == "alice"
        missing = await V3Client.connect(addr, hello=False)
        msg = await missing.request(T.HELLO, proto=3, client="t")  # no "token" at all
        assert msg.type == T.ERROR and msg.body["code"] == "AUTH_FAILED" and msg.body["fatal"] is True
        assert msg.body["message"] == "a token is required"
        await missing.wait_closed()
        await missing.close()
        # null, wrong, empty, blank, non-string or over-long: AUTH_FAILED (fatal) and the connection closes
        for token in BAD_TOKENS:
            c = await V3Client.connect(addr, hello=False)
            msg = await c.request(T.HELLO, proto=3, client="t", token=token)
            assert msg.type == T.ERROR, token
            assert (msg.body["code"], msg.body["fatal"]) == ("AUTH_FAILED", True), (token, msg.body)
            await c.wait_closed()
            assert c.protocol_error is None
            await c.close()
        # a v2 client cannot authenticate: told so in text, then closed
        v2, welcome = await V2Client.connect(addr)
        assert "authentication" in welcome
        assert await v2.expect_eof() == b"" and v2.only_v2_codes()
        await v2.close()
        assert (await ok.call(T.PING))["re"]  # the good client is unaffected
        await ok.close()


async def test_single_user_mode_ignores_the_token(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        for token in BAD_TOKENS:
            c = await V3Client.connect(addr, hello=False)
            hello = await c.call(T.HELLO, proto=3, client="t", token=token)
            assert hello["user"] == "local", token
            assert (await c.call(T.PING))["re"]
            await c.close()


async def test_handshake_timeout(tmp_path):
    async with running_server(tmp_path, handshake_timeout_s=0.2) as (srv, addr):
        c = await V3Client.connect(addr, hello=False)
        c.send_bytes(encode_frame(T.HELLO, 0, b'{"id":1}')[:3])  # half a header: still undecided
        err = await c.wait_type(T.ERROR)
        assert err.body["code"] == "HANDSHAKE_TIMEOUT" and err.body["fatal"] is True
        await c.wait_closed()
        await c.close()


async def test_idle_connection_is_pinged_then_closed(tmp_path):
    async with running_server(tmp_path, ping_interval_s=0.1, idle_timeout_s=0.6) as (srv, addr):
        quiet = await V3Client.connect(addr, auto_pong=False)
        alive = await V3Client.connect(addr, auto_pong=True)
        ping = await quiet.wait_type(T.PING)
        assert str(ping.body["id"]).startswith("srv-")
        err = await quiet.wait_type(T.ERROR)
        assert err.body["code"] == "IDLE_TIMEOUT" and err.body["fatal"] is True
        await quiet.wait_closed()
        # the client that answers PINGs survives several idle periods
        for _ in range(3):
            await alive.wait_type(T.PING)
        assert not alive.closed.is_set()
        assert (await alive.call(T.PING))["re"]
        await quiet.close()
        await alive.close()


async def test_client_pong_and_error_frames_are_accepted_silently(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        c.send(T.PONG, {"re": "x", "time": "now"})
        c.send(T.ERROR, {"re": None, "code": "INTERNAL", "message": "client side", "fatal": False})
        assert (await c.call(T.PING))["re"]
        assert [m for m in c.inbox if m.type == T.ERROR] == []
        await c.close()


def test_codec_used_by_the_client_is_v3():
    assert Connection(Role.CLIENT).version.name == "V3"


async def read_frames_until_eof(reader: asyncio.StreamReader) -> list[tuple[int, bytes]]:
    """Every frame the server sends until it closes, as (type, payload)."""
    data = await asyncio.wait_for(reader.read(), 10)
    frames, pos = [], 0
    while pos + 5 <= len(data):
        t, n = data[pos], int.from_bytes(data[pos + 3:pos + 5], "big")
        frames.append((t, data[pos + 5:pos + 5 + n]))
        pos += 5 + n
    assert pos == len(data)
    return frames


async def test_first_bytes_that_are_not_a_hello_make_a_v2_connection(tmp_path):
    # the first two bytes of a v2 CLIENT_UDP_PORT header, then nothing: never a v3 frame
    async with running_server(tmp_path, handshake_timeout_s=0.2, idle_timeout_s=0.6, ping_interval_s=0.1) as (srv, addr):
        reader, writer = await asyncio.open_connection(*addr)
        writer.write(b"\x18\x00")
        frames = await read_frames_until_eof(reader)  # the v2 welcome, then closed when idle
        assert [t for t, _ in frames] == [T.CHAT_TEXT]
        assert frames[0][1].startswith(b"Welcome to NPLT Assistant")
        writer.close()


async def test_a_silent_client_is_closed_quietly_at_handshake_timeout(tmp_path):
    # a grace period longer than the handshake timeout: the silent client may be v2, so no ERROR frame
    async with running_server(tmp_path, legacy_grace_ms=5000, handshake_timeout_s=0.2) as (srv, addr):
        reader, writer = await asyncio.open_connection(*addr)
        assert await read_frames_until_eof(reader) == []
        writer.close()



async def test_a_v2_connection_that_never_sends_a_message_is_closed_at_handshake_timeout(tmp_path):
    # silent sockets must not hold a max_clients slot until idle_timeout_s
    async with running_server(tmp_path, legacy_grace_ms=50, handshake_timeout_s=0.3, ping_interval_s=30,
                              idle_timeout_s=60) as (srv, addr):
        loop = asyncio.get_running_loop()
        start = loop.time()
        silent, welcome = await V2Client.connect(addr, send_udp_port=False)
        assert welcome.startswith("Welcome to NPLT Assistant")
        assert await silent.expect_eof() == b"" and loop.time() - start < 5
        assert silent.only_v2_codes()
        await poll(lambda: not srv.connections)
        await silent.close()


async def test_a_v2_client_that_sent_a_message_outlives_the_handshake_timeout(tmp_path):
    async with running_server(tmp_path, legacy_grace_ms=50, handshake_timeout_s=0.3) as (srv, addr):
        v2, _ = await V2Client.connect(addr)  # sends CLIENT_UDP_PORT, as the original client does
        conn = next(iter(srv.connections))
        deadline = conn.loop.time() + 0.3
        await poll(lambda: conn.loop.time() > deadline + 0.2)  # well past the handshake timeout
        v2.send(CHAT_TEXT, "HEARTBEAT")
        assert await v2.recv_text() == "HEARTBEAT" and conn in srv.connections
        await v2.close()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_hello_sent_in_time_is_served_as_v3_after_a_stall_past_the_grace(tmp_path, loop):
    """A stall of the server's loop (a long GC, a slow callback) past legacy_grace_ms leaves the grace
    timer due. The client's HELLO, sent right after the stall, is on the socket before the timer runs
    but is read only in the loop's next poll (here client and server share the loop; a remote client's
    bytes that arrived during the stall wait the same way on uvloop, which runs due timers before it
    reads). The grace decision waits for that poll, so the client is served as v3, not as v2."""
    import time

    import uvloop

    async def main() -> None:
        async with running_server(tmp_path, legacy_grace_ms=50) as (srv, addr):
            reader, writer = await asyncio.open_connection(*addr)
            await poll(lambda: len(srv.connections) == 1)          # accepted: the grace runs
            time.sleep(0.3)                                         # the stall: the grace timer is due
            await asyncio.sleep(0)                                  # the next loop pass: before the timer
            writer.write(encode_frame(T.HELLO, 0, b'{"id":1,"proto":3,"client":"t/1"}'))
            header = await asyncio.wait_for(reader.readexactly(5), 10)
            assert header[0] == T.RESPONSE, f"served as v2: {header + await reader.read(200)!r}"
            assert next(iter(srv.connections)).legacy is None
            writer.close()
    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())
