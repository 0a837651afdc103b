"""Review s32: the HTTP /metrics endpoint does not take users' NPLT login tokens from the network,
refuses a non-loopback address authenticated only by [auth] users, warns when it serves plain HTTP
beyond loopback, and logs and slows down wrong bearer tokens (a real endpoint over loopback)."""
from __future__ import annotations

import asyncio
import logging
import time

import pytest

import server.httpd as httpd
from server.app import Server
from server.auth import hash_token
from server.config_base import ConfigError
from testkit.echo_agent import EchoAgent
from testkit.server import make_config, running_server

SCRAPER, ALICE = "scraper-token-s32", "alice-login-token-s32"
REMOTE = "127.0.0.3"     # a loopback source address this test makes the endpoint treat as a remote client


async def get(port: int, path: str = "/metrics", token: str | None = None, source: str = "127.0.0.1",
              timeout: float = 10.0) -> tuple[int, bytes]:
    """One HTTP/1.1 GET from ``source``; (status, whole response)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    return int(raw.split(b" ", 2)[1]), raw


@pytest.fixture
def remote_source(monkeypatch):
    """Make REMOTE count as a non-loopback peer (no test machine has a second, routable address)."""
    real = httpd.is_loopback
    monkeypatch.setattr(httpd, "is_loopback", lambda host: host != REMOTE and real(host))


async def test_user_login_tokens_open_metrics_only_for_loopback_clients(tmp_path, remote_source, caplog):
    sections = {"http": {"listen": "127.0.0.1:0", "token_sha256": hash_token(SCRAPER)}}
    async with running_server(tmp_path, sections=sections, users=[("alice", ALICE)]) as (srv, _):
        port = srv.http.port
        assert (await get(port, token=ALICE))[0] == 200                   # a local scraper, as documented
        assert (await get(port, token=SCRAPER))[0] == 200
        with caplog.at_level(logging.WARNING):
            status, raw = await get(port, token=ALICE, source=REMOTE)
        assert status == 401 and b"nplt_connections" not in raw            # a login token from the network
        assert any("wrong bearer token" in r.getMessage() and "loopback clients only" in r.getMessage()
                   and REMOTE in r.getMessage() for r in caplog.records)
        status, raw = await get(port, token=SCRAPER, source=REMOTE)        # the [http] token works from anywhere
        assert status == 200 and b"nplt_connections" in raw
        assert (await get(port, "/healthz", source=REMOTE))[0] == 200


async def test_non_loopback_address_needs_the_http_token_and_warns(tmp_path, caplog):
    cfg = make_config(tmp_path / "a", users=[("alice", ALICE)], sections={"http": {"listen": "0.0.0.0:0"}})
    srv = Server(cfg, agent=EchoAgent(), memory="basic")
    with pytest.raises(ConfigError) as ei:
        await srv.start()
    assert ei.value.path == "http.listen" and "loopback clients only" in str(ei.value)
    assert "token_sha256" in str(ei.value)
    cfg = make_config(tmp_path / "b", users=[("alice", ALICE)],
                      sections={"http": {"listen": "0.0.0.0:0", "token_sha256": hash_token(SCRAPER)}})
    srv = Server(cfg, agent=EchoAgent(), memory="basic")
    with caplog.at_level(logging.WARNING, logger="nplt.http"):
        await srv.start()
    try:
        warned = [r for r in caplog.records if r.name == "nplt.http" and r.levelno == logging.WARNING]
        assert len(warned) == 1 and "plain HTTP (no TLS)" in warned[0].getMessage()
        assert (await get(srv.http.port, token=SCRAPER))[0] == 200
    finally:
        await srv.stop()
    caplog.clear()
    async with running_server(tmp_path / "c", sections={"http": {"listen": "127.0.0.1:0"}}) as (srv, _):
        assert not [r for r in caplog.records if r.name == "nplt.http" and r.levelno >= logging.WARNING]


async def test_wrong_bearer_tokens_are_logged_throttled_and_slowed_down(tmp_path, caplog):
    delay = 0.4     # no [auth] users: the endpoint counts with a guard of its own, of the [auth] settings
    sections = {"http": {"listen": "127.0.0.1:0", "token_sha256": hash_token(SCRAPER)},
                "auth": {"max_failed_logins": 3, "failed_login_delay_s": delay, "login_backoff_s": 60}}
    async with running_server(tmp_path, sections=sections) as (srv, _):
        ep = srv.http
        guard = ep.guard
        assert isinstance(guard, httpd.BearerGuard) and guard is not srv.services.auth.guard
        with caplog.at_level(logging.WARNING):
            for i in range(3):                       # the first failures are answered at once
                started = time.monotonic()
                assert (await get(ep.port, token=f"guess-{i}"))[0] == 401
                assert time.monotonic() - started < delay
            assert guard.retry_after("127.0.0.1") > 0          # the third started the back-off
            lines = [r.getMessage() for r in caplog.records if "bearer token" in r.getMessage()]
            assert len(lines) == 1 and "127.0.0.1" in lines[0] and "guess" not in lines[0]   # no token logged
            for token, status in (("guess-3", 401), (SCRAPER, 200)):   # in back-off: right or wrong, after the delay
                started = time.monotonic()
                assert (await get(ep.port, token=token))[0] == status
                assert time.monotonic() - started >= delay * 0.9
            started = time.monotonic()
            assert (await get(ep.port, token=SCRAPER, source="127.0.0.2"))[0] == 200   # other addresses: no delay
            assert time.monotonic() - started < delay
        assert ep.failed_log.total == 4


async def test_metrics_guesses_never_slow_the_nplt_logins_of_the_same_address(tmp_path):
    """A local scraper with a stale token (or guesses through a local TLS proxy) puts /metrics from that
    address in back-off, not the NPLT port: every local user's login stays immediate."""
    from testkit.server import V3Client
    delay = 1.0
    sections = {"http": {"listen": "127.0.0.1:0", "token_sha256": hash_token(SCRAPER)},
                "auth": {"max_failed_logins": 3, "failed_login_delay_s": delay, "login_backoff_s": 60,
                         "users": [{"user_id": "alice", "token_sha256": hash_token(ALICE)}]}}
    async with running_server(tmp_path, sections=sections) as (srv, addr):
        assert isinstance(srv.http.guard, httpd.BearerGuard) and srv.http.guard is not srv.services.auth.guard
        for i in range(3):                    # the third starts /metrics' back-off (max_failed_logins 3)
            assert (await get(srv.http.port, token=f"guess-{i}"))[0] == 401
        assert srv.http.guard.retry_after("127.0.0.1") > 0                  # /metrics is in back-off
        assert srv.services.auth.guard.failures("127.0.0.1") == 0           # the NPLT port is not
        started = time.monotonic()
        c = await V3Client.connect(addr, token=ALICE)
        assert time.monotonic() - started < delay * 0.9
        await c.close()
