"""The HTTP health and metrics endpoint: a real server started in-process, probed with a real HTTP client (httpx2, which the openai SDK ships)."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx2 as httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server.agent.base import AgentError
from server.app import Server
from server.auth import hash_token
from server.cli import load_config
from server.config import ServerConfig
from server.config_base import ConfigError
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
            r = await client.get(url(srv, "/readyz"))
            assert (r.status_code, r.text) == (200, "ready\n")
            r = await client.head(url(srv, "/healthz"))
            assert r.status_code == 200 and r.content == b"" and r.headers["content-length"] == "3"
            r = await client.get(url(srv, "/nope"))
            assert r.status_code == 404 and "/healthz" in r.text
            r = await client.post(url(srv, "/metrics"), content=b"x")
            assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"


async def test_malformed_and_oversized_requests(tmp_path):
    async with running_server(tmp_path, sections=HTTP) as (srv, _):
        for raw in (b"NOT HTTP AT ALL\r\n\r\n", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000 + b"\r\n\r\n"):
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.http.port)
            writer.write(raw)
            await writer.drain()
            reply = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert reply.split(b"\r\n", 1)[0] in (b"HTTP/1.1 400 ", b"HTTP/1.1 431 ")
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


async def test_readyz_is_503_while_stopping_and_connections_are_capped():
    from types import SimpleNamespace

    from server.http_config import HttpConfig
    from server.httpd import HttpEndpoint, Readiness
    from server.metrics import Metrics

    state = SimpleNamespace(stopping=False)
    endpoint = HttpEndpoint(HttpConfig(listen="127.0.0.1:0", max_connections=1), state, Metrics(),
                            Readiness({}, 1.0), tokens=[])
    await endpoint.start()
    try:
        base = f"http://127.0.0.1:{endpoint.port}"
        async with httpx.AsyncClient(timeout=5) as client:
            assert (await client.get(base + "/readyz")).status_code == 200
            # a silent connection holds the only slot: the next one is closed at once, unanswered
            _, idle = await asyncio.open_connection("127.0.0.1", endpoint.port)
            await poll(lambda: len(endpoint._handlers) == 1)
            with pytest.raises(httpx.TransportError):
                await client.get(base + "/healthz")
            assert endpoint.refused == 1
            idle.close()
            await poll(lambda: not endpoint._handlers)
            state.stopping = True
            r = await client.get(base + "/readyz")
            assert (r.status_code, r.text) == (503, "not ready: the server is stopping\n")
    finally:
        await endpoint.stop()
