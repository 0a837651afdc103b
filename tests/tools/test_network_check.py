"""network_check: real loopback TCP; the allowlist is enforced on names and resolved addresses."""
from __future__ import annotations

import asyncio
import socket

import orjson
import pytest

from server.tools import ToolContext, ToolRegistry, ToolsConfig

CTX = ToolContext("alice", "s_1")


@pytest.fixture
async def listener():
    accepted = asyncio.Event()

    def on_connect(reader, writer):
        accepted.set()
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1], accepted
    server.close()
    await server.wait_closed()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def check(tools, **args):
    call = await tools.run("network_check", args, CTX)
    return call.status, orjson.loads(call.result)


async def test_open_port(listener):
    port, accepted = listener
    status, d = await check(ToolRegistry(ToolsConfig()), host="127.0.0.1", port=port)
    assert status == "success" and d["reachable"] is True and d["address"] == "127.0.0.1"
    assert d["latency_ms"] >= 0 and d["resolved"] == ["127.0.0.1"]
    async with asyncio.timeout(5):
        await accepted.wait()            # the server really saw the connection


async def test_localhost_name_is_resolved_and_allowed(listener):
    port, _ = listener
    status, d = await check(ToolRegistry(ToolsConfig()), host="LOCALHOST", port=port)
    assert status == "success" and d["reachable"] is True
    assert set(d["resolved"]) <= {"127.0.0.1", "::1"}


async def test_closed_port_is_refused():
    port = closed_port()
    status, d = await check(ToolRegistry(ToolsConfig()), host="127.0.0.1", port=port, timeout=2)
    assert status == "success" and d["reachable"] is False
    assert d["attempts"] == [{"address": "127.0.0.1", "result": "connection refused"}]


@pytest.mark.parametrize("host", ["example.com", "10.0.0.1", "8.8.8.8", "127.0.0.2", "169.254.169.254"])
async def test_disallowed_hosts_rejected_without_connecting(host):
    status, d = await check(ToolRegistry(ToolsConfig()), host=host, port=80)
    assert status == "error"
    assert d["error"].startswith(f"host '{host}' is not allowed")


async def test_allowed_name_must_resolve_to_allowed_addresses(listener):
    port, _ = listener
    status, d = await check(ToolRegistry(ToolsConfig(allowed_hosts=["localhost"])), host="localhost", port=port)
    assert status == "error"
    assert "resolves to 127.0.0.1" in d["error"] and "not allowed" in d["error"]


async def test_cidr_entries(listener):
    port, _ = listener
    tools = ToolRegistry(ToolsConfig(allowed_hosts=["127.0.0.0/8"]))
    status, d = await check(tools, host="127.0.0.1", port=port)
    assert status == "success" and d["reachable"] is True
    status, d = await check(tools, host="::1", port=port)
    assert status == "error" and "not allowed" in d["error"]


async def test_timeout_argument_is_bounded():
    status, d = await check(ToolRegistry(ToolsConfig.from_dict({"max_network_timeout_s": 2})), host="127.0.0.1", port=1, timeout=5)
    assert status == "error" and d["error"] == "argument 'timeout': expected a number in 0.05..2.0, got 5"
