"""Limits and bad input: max clients, slow readers, garbage, pending requests. The server stays up."""
from __future__ import annotations

import asyncio

import pytest

from protocol import MsgType, encode_frame
from testkit.echo_agent import EchoAgent
from testkit.server import V3Client, non_reading_client, poll, running_server
from testkit.v2client import CHAT_TEXT

T = MsgType


async def test_max_clients(tmp_path):
    async with running_server(tmp_path, max_clients=2, legacy_grace_ms=100) as (srv, addr):
        a = await V3Client.connect(addr)
        b = await V3Client.connect(addr)
        extra = await V3Client.connect(addr, hello=False)
        msg = await extra.request(T.HELLO, proto=3, client="third")
        assert msg.type == T.ERROR and msg.body["code"] == "SERVER_FULL" and msg.body["fatal"] is True
        await extra.wait_closed()
        # a v2 client (or a silent one) reads why in one CHAT_TEXT, then the close: no frame it does not know
        full = encode_frame(CHAT_TEXT, 0, b"Server is full (2 clients); try again later.")
        reader, writer = await asyncio.open_connection(*addr)
        writer.write(encode_frame(CHAT_TEXT, 0, b"hello"))
        assert await asyncio.wait_for(reader.read(), 5) == full
        writer.close()
        # as does a silent one, after the grace period
        reader, writer = await asyncio.open_connection(*addr)
        assert await asyncio.wait_for(reader.read(), 5) == full
        writer.close()
        assert (await a.call(T.STATS))["clients"] == 2
        await b.close()
        await poll(lambda: len(srv.connections) == 1)
        c = await V3Client.connect(addr)  # a slot is free again
        assert (await c.call(T.PING))["re"]
        for x in (a, c, extra):
            await x.close()


async def test_slow_reader_is_disconnected_while_others_keep_working(tmp_path):
    # its requests wait for its output to drain; the server's PING (the next output due) finds the
    # output over the cap and drops it
    async with running_server(tmp_path, max_output_buffer=65536, ping_interval_s=0.3) as (srv, addr):
        good = await V3Client.connect(addr)
        r = await good.call(T.CHAT_TEXT, text="!big 1000000")  # a 1 MB answer to export
        await good.turn_events(r["turn_id"], timeout=30)
        slow = await non_reading_client(addr)
        data = b"".join(slow.codec.send(T.HISTORY_EXPORT, {"id": i, "format": "json"}) for i in range(30))
        slow.writer.write(data)
        await poll(lambda: srv.slow_consumers == 1, timeout=30)
        await poll(lambda: len(srv.connections) == 1)
        assert (await good.call(T.PING))["re"]
        r = await good.call(T.CHAT_TEXT, text="still here")
        assert (await good.turn_events(r["turn_id"]))[-1].type == T.TURN_END
        slow.writer.close()
        await good.close()


async def test_garbage_and_malformed_frames(tmp_path):
    async with running_server(tmp_path, max_message_size=100_000) as (srv, addr):
        bystander = await V3Client.connect(addr)
        c = await V3Client.connect(addr)
        cases = [
            (c.codec.send_raw(0x55, b'{"id": 1}'), "UNKNOWN_TYPE"),
            (c.codec.send_raw(T.SESSION_LIST, b'{"id": 2,'), "INVALID_JSON"),
            (c.codec.send_raw(T.SESSION_LIST, b'[1, 2]'), "INVALID_JSON"),
            (c.codec.send_raw(T.SESSION_LIST, b'{"id": "\xff\xfe"}'), "INVALID_UTF8"),
            (c.codec.send(T.SESSION_LIST, {"id": 3, "pad": "x" * 150_000}), "MESSAGE_TOO_LARGE"),
            (c.codec.send(T.TURN_START, {"id": 4}), "UNSUPPORTED"),
            (c.codec.send(T.FILE_DATA, {"id": 5}), "UNSUPPORTED"),
            (c.codec.send(T.SESSION_SWITCH, {"id": 6}), "INVALID_MESSAGE"),
            (c.codec.send(T.SESSION_LIST, {"limit": 5}), "INVALID_MESSAGE"),
        ]
        for data, code in cases:
            c.send_bytes(data)
            err = await c.wait_type(T.ERROR)
            assert err.body["code"] == code and err.body["fatal"] is False, (code, err.body)
        assert (await c.call(T.PING))["re"]
        # a frame with the wrong seq is fatal for that connection only
        c.send_bytes(encode_frame(T.PING, 999, b'{"id": 7}'))
        err = await c.wait_type(T.ERROR)
        assert err.body["code"] == "SEQ_MISMATCH" and err.body["fatal"] is True
        await c.wait_closed()
        assert c.protocol_error is None
        # raw garbage as the first bytes: a (broken) v2 peer; the server stays up
        reader, writer = await asyncio.open_connection(*addr)
        writer.write(bytes(range(256)) * 4)
        await writer.drain()
        writer.close()
        # an empty FRAGMENT is fatal (BAD_FRAGMENT)
        d = await V3Client.connect(addr)
        d.send_bytes(encode_frame(T.FRAGMENT, d.codec.tx_seq, b""))
        err = await d.wait_type(T.ERROR)
        assert err.body["code"] == "BAD_FRAGMENT" and err.body["fatal"] is True
        await d.wait_closed()
        assert (await bystander.call(T.PING))["re"]
        r = await bystander.call(T.CHAT_TEXT, text="unaffected")
        assert (await bystander.turn_events(r["turn_id"]))[-1].type == T.TURN_END
        for x in (bystander, c, d):
            await x.close()


async def test_pending_request_limit_and_duplicate_ids(tmp_path):
    async with running_server(tmp_path, max_pending_requests=4) as (srv, addr):
        c = await V3Client.connect(addr)
        loop = asyncio.get_running_loop()
        futs = []
        data = b""
        for i in range(100, 110):
            fut = c._waiting[i] = loop.create_future()
            futs.append(fut)
            data += c.codec.send(T.SESSION_INFO, {"id": i})
        c.send_bytes(data)  # ten requests in one segment: dispatched before any runs
        replies = [await asyncio.wait_for(f, 5) for f in futs]
        codes = [m.body.get("code") if m.type == T.ERROR else "OK" for m in replies]
        assert codes == ["OK"] * 4 + ["TOO_MANY_PENDING"] * 6
        assert all(m.body["fatal"] is False for m in replies if m.type == T.ERROR)
        data = c.codec.send(T.SESSION_INFO, {"id": "dup"}) + c.codec.send(T.SESSION_INFO, {"id": "dup"})
        fut = c._waiting["dup"] = loop.create_future()
        c.send_bytes(data)
        first = await asyncio.wait_for(fut, 5)
        assert first.type == T.RESPONSE     # the pending request's one reply (review s31: the duplicate's
        #                                     ERROR carried "re": "dup" and looked like a second one)
        err = await c.wait_for(lambda m: m.type == T.ERROR and "'dup'" in m.body.get("message", ""))
        assert err.body["re"] is None and err.body["code"] == "INVALID_MESSAGE" and "already used" in err.body["message"]
        assert (await c.call(T.PING))["re"]  # PING is answered inline, never counted
        await c.close()


@pytest.mark.parametrize("n_clients", [8])
async def test_many_clients_chat_at_once(tmp_path, n_clients):
    async with running_server(tmp_path, EchoAgent()) as (srv, addr):
        clients = [await V3Client.connect(addr) for _ in range(n_clients)]
        for c in clients[1:]:
            await c.call(T.SESSION_NEW)
        replies = await asyncio.gather(*(c.call(T.CHAT_TEXT, text=f"client {i}") for i, c in enumerate(clients)))
        ends = await asyncio.gather(*(c.turn_events(r["turn_id"]) for c, r in zip(clients, replies)))
        assert [e[-1].body["message"]["content"] for e in ends] == [f"echo: client {i}" for i in range(n_clients)]
        for c in clients:
            await c.close()
