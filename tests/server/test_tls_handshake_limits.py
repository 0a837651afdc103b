"""TLS connections count against max_clients / max_clients_per_ip from their TCP accept, and their
TLS handshake must end within handshake_timeout_s, like a plain-TCP connection's HELLO.

Before, the TLS layer (``create_server(ssl=...)``) handshook every accepted socket before any limit
applied: 200 sockets that never sent a ClientHello were all accepted, uncounted, and held for asyncio's
default 60 s handshake timeout, so a full server still let in (and handshook) anyone.
"""
from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from protocol import MsgType
from server.app import Server
from testkit.echo_agent import EchoAgent
from testkit.server import V3Client, make_config, poll

DATA = Path(__file__).parent / "data"
CERT, KEY = str(DATA / "test_cert.pem"), str(DATA / "test_key.pem")
DEADLINE = 10.0
T = MsgType


async def tls_server(tmp_path, **limits) -> Server:
    srv = Server(make_config(tmp_path, tls_cert=CERT, tls_key=KEY, **limits), agent=EchoAgent(), memory="basic")
    await srv.start()
    return srv


async def silent(srv: Server) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection that never starts the TLS handshake."""
    return await asyncio.open_connection(srv.host, srv.port)


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), DEADLINE) == b""
    except ConnectionError:
        return True


async def tls_client(srv: Server) -> V3Client:
    ctx = ssl.create_default_context(cafile=CERT)
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(srv.host, srv.port, ssl=ctx, server_hostname="localhost"), DEADLINE)
    client = V3Client(reader, writer)
    client.hello = await client.call(T.HELLO, proto=3, client="tls")
    return client


@pytest.mark.parametrize("limits", [{"max_clients": 2}, {"max_clients": 8, "max_clients_per_ip": 2}],
                         ids=["max_clients", "max_clients_per_ip"])
async def test_silent_sockets_hold_counted_slots_and_the_next_one_is_refused(tmp_path, limits):
    srv = await tls_server(tmp_path, handshake_timeout_s=30.0, **limits)
    held = []
    try:
        for _ in range(2):                                   # (accepted in order: counted before the third)
            held.append(await silent(srv))
        reader, writer = await silent(srv)                  # the third: refused at once, before any TLS work
        assert await closed_by_server(reader)
        writer.close()
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await tls_client(srv)                            # a real client too: the slots are taken
        assert srv.refusals.total == 2 and len(srv.connections) == 0 and srv.tls_handshakes == 2
        assert not any(r.at_eof() for r, _ in held)          # the counted ones are still in their handshake
    finally:
        await asyncio.wait_for(srv.stop(), DEADLINE)         # handshakes in progress do not hold up the stop
    for reader, writer in held:
        assert await closed_by_server(reader)
        writer.close()


async def test_a_handshake_that_does_not_end_in_time_is_closed_and_frees_its_slot(tmp_path):
    srv = await tls_server(tmp_path, max_clients=2, handshake_timeout_s=0.3)
    try:
        held = [await silent(srv) for _ in range(2)]
        for reader, writer in held:                          # closed after handshake_timeout_s, not 60 s
            assert await closed_by_server(reader)
            writer.close()
        await poll(lambda: srv.tls_handshakes == 0, DEADLINE, "the slots are given back")
        c = await tls_client(srv)                            # so a real client gets in
        r = await c.call(T.CHAT_TEXT, text="after the silent ones")
        assert (await c.turn_events(r["turn_id"]))[-1].body["message"]["content"] == "echo: after the silent ones"
        assert len(srv.connections) == 1
        await c.close()
    finally:
        await srv.stop()


async def test_requests_sent_right_behind_the_handshake_are_all_answered(tmp_path):
    """What the TLS layer reads together with the handshake's last flight reaches the connection."""
    srv = await tls_server(tmp_path, max_clients=4)
    try:
        for _ in range(5):
            ctx = ssl.create_default_context(cafile=CERT)
            reader, writer = await asyncio.open_connection(srv.host, srv.port, ssl=ctx, server_hostname="localhost")
            c = V3Client(reader, writer)
            hello = asyncio.ensure_future(c.call(T.HELLO, proto=3, client="tls"))
            pings = [asyncio.ensure_future(c.call(T.PING)) for _ in range(3)]   # pipelined with the HELLO
            assert (await hello)["user"] == "local"
            assert len(await asyncio.gather(*pings)) == 3
            await c.close()
            await poll(lambda: not srv.connections, DEADLINE, "the connection is gone")
    finally:
        await srv.stop()
