"""The HTTP health and metrics endpoint: a real server started in-process, probed with a real HTTP client (httpx2, which the openai SDK ships)."""
from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from types import SimpleNamespace

import httpx2 as httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server.agent.base import AgentError
from server.app import Server
from server.auth import hash_token
from server.cli import load_config
from server.config import ServerConfig
from server.config_base import ConfigError
from server.http_config import HttpConfig
from server.httpd import HttpEndpoint, Readiness
from server.metrics import Metrics
from protocol import ErrorCode, MsgType
from testkit.echo_agent import EchoAgent
from testkit.server import V3Client, make_config, poll, running_server

HTTP = {"http": {"listen": "127.0.0.1:0"}}


def url(srv: Server, path: str) -> str:
    return f"http://127.0.0.1:{srv.http.port}{path}"


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


async def test_off_by_default(tmp_path):
    async with running_server(tmp_path) as (srv, _):
        assert srv.http is None and srv.config.http.listen is None


async def test_healthz_readyz_and_errors(tmp_path):
    async with running_server(tmp_path, sections=HTTP) as (srv, _):
        async with httpx.AsyncClient(timeout=5) as client:
            r = await client.get(url(srv, "/healthz"))
            assert (r.status_code, r.text, r.headers["connection"]) == (200, "ok\n", "close")
            assert r.reason_phrase == "OK"
            r = await client.get(url(srv, "/readyz"))
            assert (r.status_code, r.text) == (200, "ready\n")
            r = await client.head(url(srv, "/healthz"))
            assert r.status_code == 200 and r.content == b"" and r.headers["content-length"] == "3"
            r = await client.get(url(srv, "/nope"))
            assert r.status_code == 404 and "/healthz" in r.text and r.reason_phrase == "Not Found"
            r = await client.post(url(srv, "/metrics"), content=b"x")
            assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
            assert r.reason_phrase == "Method Not Allowed"


async def test_malformed_and_oversized_requests(tmp_path):
    async with running_server(tmp_path, sections=HTTP) as (srv, _):
        for raw in (b"NOT HTTP AT ALL\r\n\r\n", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000 + b"\r\n\r\n"):
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.http.port)
            writer.write(raw)
            await writer.drain()
            reply = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert reply.split(b"\r\n", 1)[0] in (b"HTTP/1.1 400 Bad Request",
                                                   b"HTTP/1.1 431 Request Header Fields Too Large")
        async with httpx.AsyncClient(timeout=5) as client:        # still serving
            assert (await client.get(url(srv, "/healthz"))).status_code == 200


async def test_readyz_fails_when_storage_is_not_writable(tmp_path):
    async with running_server(tmp_path, sections=HTTP) as (srv, _):
        root = Path(srv.config.storage.root)
        async with httpx.AsyncClient(timeout=5) as client:
            assert (await client.get(url(srv, "/readyz"))).status_code == 200
            moved = root.with_name("moved")
            os.rename(root, moved)          # the data directory is gone (unmounted disk)
            try:
                r = await client.get(url(srv, "/readyz"))
                assert r.status_code == 503 and r.text.startswith("not ready: storage: ")
                assert (await client.get(url(srv, "/healthz"))).status_code == 200
            finally:
                os.rename(moved, root)
            assert (await client.get(url(srv, "/readyz"))).status_code == 200


class _Store:
    """Wraps the real store and adds the pluggable readiness hook a PostgreSQL store would implement."""

    def __init__(self, inner, outcome):
        self._inner, self.outcome = inner, outcome

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def check_ready(self):
        if self.outcome == "down":
            raise ConnectionRefusedError(111, "Connection refused")
        if self.outcome == "hang":
            await asyncio.Event().wait()


@pytest.mark.parametrize("outcome,status,text", [
    ("up", 200, "ready\n"),
    ("down", 503, "not ready: storage: Connection refused\n"),
    ("hang", 503, "not ready: storage: no answer within 0.2 s\n"),
])
async def test_store_readiness_hook(tmp_path, outcome, status, text):
    from storage import AsyncHistoryStore
    cfg = make_config(tmp_path, sections={"http": {"listen": "127.0.0.1:0", "readiness_timeout_s": 0.2}})
    inner = await AsyncHistoryStore.open(cfg.storage)
    srv = Server(cfg, agent=EchoAgent(), store=_Store(inner, outcome), memory="basic")
    await srv.start()
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            r = await client.get(url(srv, "/readyz"))
            assert (r.status_code, r.text) == (status, text)
    finally:
        await srv.stop()
        await inner.close()


class FailingAgent(EchoAgent):
    async def run_turn(self, req, sink):
        if "fail" in req.user_message.content:
            raise AgentError(ErrorCode.LLM_ERROR, "endpoint 127.0.0.1 answered 500")
        return await super().run_turn(req, sink)


async def test_metrics_reflect_the_server(tmp_path):
    async with running_server(tmp_path, agent=FailingAgent(), sections=HTTP, max_clients=1) as (srv, (host, port)):
        async with httpx.AsyncClient(timeout=5) as client:
            r = await client.get(url(srv, "/metrics"))
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=")
            assert value(r.text, "nplt_connections") == 0
            assert value(r.text, "nplt_process_resident_memory_bytes") > 10 << 20
            c = await V3Client.connect((host, port))
            try:
                for text, end in (("hello", MsgType.TURN_END), ("please fail", MsgType.TURN_ERROR)):
                    r = await c.call(MsgType.CHAT_TEXT, text=text)
                    assert (await c.turn_events(r["turn_id"]))[-1].type == end
                # one more client is over max_clients: refused
                reader, writer = await asyncio.open_connection(host, port)
                await asyncio.wait_for(reader.read(), 5)
                writer.close()
                r = await client.get(url(srv, "/metrics"))
                text = r.text
                assert value(text, "nplt_connections") == 1
                assert value(text, "nplt_refused_connections_total") == 1
                assert value(text, "nplt_turns_total") == 2
                assert value(text, "nplt_turns_running") == 0 and value(text, "nplt_turns_queued") == 0
                assert value(text, "nplt_turn_duration_seconds_count") == 2
                assert value(text, "nplt_storage_append_duration_seconds_count") == 4   # user, answer, user, failed answer
                assert value(text, "nplt_provider_errors_total", code="LLM_ERROR") == 1
            finally:
                await c.close()
            await poll(lambda: value_sync(srv) > 0)


def value_sync(srv: Server) -> float:
    """Loop-lag samples taken so far (the sampler runs while the endpoint runs)."""
    from prometheus_client import generate_latest
    return value(generate_latest(srv.metrics.registry).decode(), "nplt_event_loop_lag_seconds_count")


async def test_turns_running_and_queued(tmp_path):
    gate = asyncio.Event()

    class SlowAgent(EchoAgent):
        async def run_turn(self, req, sink):
            await gate.wait()
            return await super().run_turn(req, sink)

    async with running_server(tmp_path, agent=SlowAgent(), sections=HTTP) as (srv, (host, port)):
        c = await V3Client.connect((host, port))
        try:
            await c.call(MsgType.CHAT_TEXT, text="one")
            await c.call(MsgType.CHAT_TEXT, text="two")
            async with httpx.AsyncClient(timeout=5) as client:
                text = (await client.get(url(srv, "/metrics"))).text
            assert value(text, "nplt_turns_running") == 1 and value(text, "nplt_turns_queued") == 1
        finally:
            gate.set()
            await c.close()


async def test_metrics_token(tmp_path):
    token = "scraper-token-123"
    sections = {"http": {"listen": "127.0.0.1:0", "token_sha256": hash_token(token)}}
    async with running_server(tmp_path, sections=sections, users=[("alice", "alice-token")]) as (srv, _):
        async with httpx.AsyncClient(timeout=5) as client:
            r = await client.get(url(srv, "/metrics"))
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            r = await client.get(url(srv, "/metrics"), headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401
            for good in (token, "alice-token"):
                r = await client.get(url(srv, "/metrics"), headers={"Authorization": f"Bearer {good}"})
                assert r.status_code == 200 and "nplt_connections" in r.text
            assert (await client.get(url(srv, "/healthz"))).status_code == 200     # probes need no token


async def test_non_loopback_rule(tmp_path):
    cfg = make_config(tmp_path, sections={"http": {"listen": "0.0.0.0:0"}})
    srv = Server(cfg, agent=EchoAgent(), memory="basic")
    with pytest.raises(ConfigError) as ei:
        await srv.start()
    assert ei.value.path == "http.listen" and "refusing to serve HTTP on '0.0.0.0'" in str(ei.value)
    assert srv.stopping    # everything it had opened is closed again
    for extra in ({"insecure": True}, {"token_sha256": hash_token("t")}):
        cfg = make_config(tmp_path / str(len(extra)), sections={"http": {"listen": "0.0.0.0:0", **extra}})
        srv = Server(cfg, agent=EchoAgent(), memory="basic")
        await srv.start()
        try:
            assert srv.http.host == "0.0.0.0"
        finally:
            await srv.stop()


def test_config_flags_and_env():
    cfg = load_config(["--http-listen", "127.0.0.1:9100"], env={})
    assert cfg.http.listen == "127.0.0.1:9100" and cfg.http.address == ("127.0.0.1", 9100)
    cfg = load_config([], env={"NPLT_HTTP_LISTEN": "[::1]:9101", "NPLT_HTTP_INSECURE": "yes"})
    assert cfg.http.address == ("::1", 9101) and cfg.http.insecure is True
    cfg = load_config(["--no-http-insecure"], env={"NPLT_HTTP_INSECURE": "1"})
    assert cfg.http.insecure is False and cfg.http.listen is None
    for bad, path in (({"listen": "9100"}, "http.listen"), ({"listen": "h:99999"}, "http.listen"),
                      ({"token_sha256": "xyz"}, "http.token_sha256"), ({"port": 1}, "http.port")):
        with pytest.raises(ConfigError) as ei:
            ServerConfig.from_dict({"http": bad}, env={})
        assert ei.value.path == path
    with pytest.raises(ConfigError) as ei:
        load_config([], env={"NPLT_HTTP_INSECURE": "maybe"})
    assert ei.value.path == "NPLT_HTTP_INSECURE"


# -- the endpoint alone: connection caps, deadlines, request bodies ------------------------------

@contextlib.asynccontextmanager
async def endpoint(checks=None, **http):
    ep = HttpEndpoint(HttpConfig(listen="127.0.0.1:0", **http), SimpleNamespace(stopping=False), Metrics(),
                      Readiness(checks or {}, 5.0), tokens=[])
    await ep.start()
    try:
        yield ep
    finally:
        await ep.stop()


async def connect(ep: HttpEndpoint, source: str = "127.0.0.1"):
    return await asyncio.open_connection("127.0.0.1", ep.port, local_addr=(source, 0))


async def slow_client(ep: HttpEndpoint, source: str = "127.0.0.1"):
    """A slowloris connection: part of a request head, then nothing."""
    reader, writer = await connect(ep, source)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-a: a")
    await writer.drain()
    return reader, writer


async def request(ep: HttpEndpoint, raw: bytes, source: str = "127.0.0.1", timeout: float = 3.0) -> bytes:
    """Send ``raw`` (and nothing more), return everything received until the server closes."""
    reader, writer = await connect(ep, source)
    try:
        writer.write(raw)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


async def test_slow_clients_cannot_shut_out_health_probes():
    # long deadlines: only the connection caps and the eviction of slow heads let the probes in
    held = []
    async with endpoint(max_connections=4, max_connections_per_ip=2, header_timeout_s=30,
                        request_timeout_s=60) as ep:
        try:
            # one address opens 6 slow connections: it keeps 2, its 4 oldest are closed for its newer ones
            first = [await slow_client(ep, "127.0.0.2") for _ in range(6)]
            held += first
            for reader, _ in first[:4]:
                assert await asyncio.wait_for(reader.read(), 5) == b""
            await poll(lambda: len(ep._conns) == 2)
            assert ep.evicted == 4 and ep.refused == 0
            # a second address takes the other 2 slots: every slot is held by a slow head
            held += [await slow_client(ep, "127.0.0.3") for _ in range(2)]
            await poll(lambda: len(ep._conns) == 4)
            for _ in range(3):
                # a probe from a third address and one from an attacking address both get in at once...
                for source in ("127.0.0.1", "127.0.0.2"):
                    reply = await request(ep, HEALTHZ, source)
                    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and reply.endswith(b"\r\n\r\nok\n")
                # ...and the attackers reconnect until they hold every slot again
                held += [await slow_client(ep, src) for src in ("127.0.0.2", "127.0.0.3") for _ in range(2)]
                await poll(lambda: len(ep._conns) == 4 and all(not c.head_done for c in ep._conns.values()))
            assert ep.refused == 0
        finally:
            for _, writer in held:
                writer.close()


async def test_request_head_has_its_own_deadline():
    async def slow_check():
        await asyncio.sleep(0.6)        # a slow readiness check (longer than the head deadline)

    async with endpoint({"slow": slow_check}, header_timeout_s=0.3, request_timeout_s=60) as ep:
        # bytes keep arriving, but the head is not complete within header_timeout_s: closed
        reader, writer = await slow_client(ep)
        t0 = time.monotonic()

        async def drip():
            while not reader.at_eof():
                writer.write(b"a")
                await writer.drain()
                await asyncio.sleep(0.05)       # attacker pacing, not synchronisation
        dripping = asyncio.create_task(drip())
        try:
            assert await asyncio.wait_for(reader.read(), 5) == b""
            assert 0.25 < time.monotonic() - t0 < 5
        finally:
            dripping.cancel()
            writer.close()
        # a complete head is answered under request_timeout_s, even when the answer takes longer
        reply = await request(ep, b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n", timeout=10)
        assert reply.startswith(b"HTTP/1.1 200 OK\r\n")


@pytest.mark.parametrize("head,status,allow", [
    (b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n", b"405 Method Not Allowed", True),
    (b"PUT /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", b"405 Method Not Allowed", True),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n", b"413 Request Entity Too Large", False),
    (b"HEAD /readyz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", b"413 Request Entity Too Large", False),
])
async def test_request_body_is_refused_without_reading_it(head, status, allow):
    # long deadlines: the answer must come from the head alone, before any body byte is sent
    async with endpoint(header_timeout_s=30, request_timeout_s=60) as ep:
        reply = await request(ep, head)                 # returns only once the server has closed
        status_line, _, rest = reply.partition(b"\r\n")
        assert status_line == b"HTTP/1.1 " + status
        assert (b"allow: GET, HEAD\r\n" in rest) == allow and b"connection: close\r\n" in rest
        await poll(lambda: not ep._conns)
        # a body-less request is still served
        assert (await request(ep, HEALTHZ)).startswith(b"HTTP/1.1 200 OK\r\n")


async def test_slow_heads_are_evicted_complete_requests_refused_and_readyz_503_while_stopping():
    release = asyncio.Event()

    async def slow_check():
        await release.wait()

    async with endpoint({"slow": slow_check}, max_connections=1) as ep:
        base = f"http://127.0.0.1:{ep.port}"
        async with httpx.AsyncClient(timeout=5) as client:
            # a silent connection holds the only slot: a newcomer closes it and is answered
            idle_reader, idle = await connect(ep)
            await poll(lambda: len(ep._conns) == 1)
            assert (await client.get(base + "/healthz")).status_code == 200
            assert await asyncio.wait_for(idle_reader.read(), 5) == b""
            idle.close()
            assert (ep.evicted, ep.refused) == (1, 0)
            # a request being answered (complete head) is never closed for a newcomer: the newcomer is refused
            ready = asyncio.create_task(client.get(base + "/readyz"))
            await poll(lambda: any(c.head_done for c in ep._conns.values()))
            with pytest.raises(httpx.TransportError):
                await client.get(base + "/healthz")
            assert (ep.evicted, ep.refused) == (1, 1)
            release.set()
            assert (await ready).status_code == 200
            await poll(lambda: not ep._conns)
            ep.server.stopping = True
            r = await client.get(base + "/readyz")
            assert (r.status_code, r.text) == (503, "not ready: the server is stopping\n")


def test_client_key_and_limit_settings():
    from server.httpd import client_key

    assert client_key(("10.0.0.1", 5000)) == "10.0.0.1"
    assert client_key(("::ffff:10.0.0.1", 5000, 0, 0)) == "10.0.0.1"
    assert client_key(("2001:db8:0:1::1", 1, 0, 0)) == client_key(("2001:db8:0:1:ffff::9", 2, 0, 0)) \
        == "2001:db8:0:1::/64"
    assert client_key(("2001:db8:0:2::1", 1, 0, 0)) != client_key(("2001:db8:0:1::1", 1, 0, 0))
    cfg = HttpConfig()
    assert (cfg.max_connections, cfg.max_connections_per_ip, cfg.header_timeout_s, cfg.request_timeout_s) == \
        (32, 8, 2.0, 5.0)
    for bad, path in (({"max_connections_per_ip": 0}, "http.max_connections_per_ip"),
                      ({"header_timeout_s": 0}, "http.header_timeout_s")):
        with pytest.raises(ConfigError) as ei:
            ServerConfig.from_dict({"http": bad}, env={})
        assert ei.value.path == path
