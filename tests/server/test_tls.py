"""TLS: the server speaks NPLT inside TLS when tls_cert/tls_key are set (test-only self-signed cert)."""
from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from protocol import MsgType
from server.app import Server, make_ssl_context
from server.config_base import ConfigError
from testkit.echo_agent import EchoAgent
from testkit.server import V3Client, make_config

DATA = Path(__file__).parent / "data"
CERT, KEY = str(DATA / "test_cert.pem"), str(DATA / "test_key.pem")


async def test_tls_round_trip(tmp_path):
    cfg = make_config(tmp_path, tls_cert=CERT, tls_key=KEY)
    srv = Server(cfg, agent=EchoAgent(), memory="basic")
    host, port = await srv.start()
    try:
        ctx = ssl.create_default_context(cafile=CERT)
        reader, writer = await asyncio.open_connection(host, port, ssl=ctx, server_hostname="localhost")
        c = V3Client(reader, writer)
        hello = await c.call(MsgType.HELLO, proto=3, client="tls")
        assert hello["user"] == "local"
        r = await c.call(MsgType.CHAT_TEXT, text="over tls")
        assert (await c.turn_events(r["turn_id"]))[-1].body["message"]["content"] == "echo: over tls"
        await c.close()
        # a plain-TCP v3 client gets nothing useful: the server expects a TLS handshake
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"\x20\x00\x00\x00\x02{}")
        assert b"nplt" not in await asyncio.wait_for(reader.read(), 10)
        writer.close()
        # a v2 client (bytes no TLS client sends) reads why in plain TCP, one CHAT_TEXT, then the close
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"\x01\x00\x00\x00\x05hello")
        got = await asyncio.wait_for(reader.read(), 10)
        assert got[:1] == b"\x01" and b"This server requires TLS" in got
        writer.close()
        # and TLS still works after it
        reader, writer = await asyncio.open_connection(host, port, ssl=ctx, server_hostname="localhost")
        c = V3Client(reader, writer)
        assert (await c.call(MsgType.HELLO, proto=3, client="tls"))["user"] == "local"
        await c.close()
    finally:
        await srv.stop()


def test_bad_tls_files_are_config_errors(tmp_path):
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(ConfigError) as err:
        make_ssl_context(missing, KEY)
    assert str(err.value) == f"server.tls_cert: file not found: {missing}"
    with pytest.raises(ConfigError) as err:
        make_ssl_context(CERT, missing)
    assert str(err.value) == f"server.tls_key: file not found: {missing}"
    with pytest.raises(ConfigError) as err:
        make_ssl_context(CERT, str(tmp_path))
    assert str(err.value).startswith("server.tls_key: is a directory") and str(tmp_path) in str(err.value)
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ConfigError) as err:
        make_ssl_context(str(bad), KEY)
    assert "cannot load" in str(err.value) and str(bad) in str(err.value)


async def test_server_with_a_missing_key_file_does_not_start(tmp_path):
    missing = str(tmp_path / "nokey.pem")
    srv = Server(make_config(tmp_path, tls_cert=CERT, tls_key=missing), agent=EchoAgent(), memory="basic")
    with pytest.raises(ConfigError) as err:
        await srv.start()
    assert err.value.path == "server.tls_key" and missing in err.value.message


async def test_a_tls_client_on_a_plain_port_fails_and_leaves_the_users_sessions_alone(tmp_path):
    from testkit.server import running_server
    async with running_server(tmp_path) as (_, (host, port)):
        c = await V3Client.connect((host, port))
        before = (await c.call(MsgType.SESSION_LIST))["sessions"]
        for _ in range(3):                                  # `nplt-client --tls` against a plain server
            with pytest.raises((ssl.SSLError, ConnectionError)):
                reader, writer = await asyncio.wait_for(asyncio.open_connection(
                    host, port, ssl=ssl.create_default_context(), server_hostname="localhost"), 10)
                writer.close()
        assert (await c.call(MsgType.SESSION_LIST))["sessions"] == before     # no empty session per attempt
        await c.close()
