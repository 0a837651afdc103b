"""The HTTP health and metrics endpoint: GET /healthz, /readyz, /metrics on asyncio (h11 parses HTTP/1.1).

- ``/healthz``: 200 while the process runs its event loop.
- ``/readyz``: 200 when every readiness check passes within ``readiness_timeout_s``, else 503 with the
  failing check named. Checks are pluggable (``Readiness``): the storage check uses the store's own
  ``async check_ready()`` when it has one (a PostgreSQL store runs a query there), else it writes,
  fsyncs and removes a probe file in the storage directory, in a worker thread. A stopping server
  is not ready.
- ``/metrics``: the Prometheus text format of ``server.metrics.Metrics``. With ``[http]
  token_sha256`` or ``[auth] users`` configured it needs ``Authorization: Bearer TOKEN``: the
  ``[http]`` token from any client; a user's NPLT login token only from a loopback peer (sent over
  plain HTTP across a network it would be readable, and it also reads that user's history). Bearer
  attempts that fail are logged (``ThrottledLog``: the first at once, then one line per interval)
  and counted per address by a ``server.auth.LoginGuard`` (the NPLT port's own when it counts, so
  guesses on either count towards one back-off): from an address in back-off every bearer attempt,
  right or wrong, is answered only after the guard's ``delay_s``, its connection holding its slot.

One request per connection (``Connection: close``); GET and HEAD only. Limits (``HttpConfig``):

- at most ``max_connections`` connections at once, at most ``max_connections_per_ip`` from one client
  address (``client_key``: an IPv4 address, an IPv6 /64). At a cap the newcomer closes the oldest
  connection (of that address, at the per-address cap) whose request head has not arrived yet, so a
  health probe gets in while slow clients hold every slot; the newcomer is refused only when every
  such connection has a complete head (its request is being answered).
- the request line and headers must arrive within ``header_timeout_s`` of the connection; the whole
  request must be answered within ``request_timeout_s``.
- a request with a body (``Content-Length`` > 0 or chunked) is answered at once without reading the body:
  405 for a method other than GET/HEAD, 413 for GET/HEAD, and the connection is closed.

Nothing here blocks the event loop.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
import os
import time
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Awaitable, Callable

import h11
from prometheus_client import CONTENT_TYPE_LATEST

from server.auth import LoginGuard
from server.config import AuthConfig, is_loopback
from server.http_config import HttpConfig, check_http_bind
from server.metrics import LoopLagSampler, Metrics
from server.refusals import ThrottledLog

log = logging.getLogger("nplt.http")

ReadyCheck = Callable[[], Awaitable[None]]   # returns when ready, raises (with a reason) when not


def probe_directory(root: str) -> None:
    """Create, write, fsync and remove a small file in ``root`` (blocking)."""
    path = os.path.join(root, f".nplt-ready-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.write(fd, b"ready\n")
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(path)


def storage_check(store: Any, root: str | os.PathLike[str]) -> ReadyCheck:
    """The store's own ``check_ready()`` if it has one, else a probe write under ``root``."""
    own = getattr(store, "check_ready", None)
    if callable(own):
        return own

    async def check() -> None:
        await asyncio.to_thread(probe_directory, os.fspath(root))
    return check


class Readiness:
    """Named async checks run concurrently under one deadline."""

    def __init__(self, checks: dict[str, ReadyCheck], timeout_s: float) -> None:
        self.checks, self.timeout_s = dict(checks), timeout_s

    async def _one(self, name: str, check: ReadyCheck) -> str | None:
        try:
            async with asyncio.timeout(self.timeout_s):
                await check()
        except TimeoutError:
            return f"{name}: no answer within {self.timeout_s:g} s"
        except Exception as exc:
            log.warning("readiness check %s failed: %s", name, exc)
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            return f"{name}: {reason}"
        return None

    async def run(self) -> list[str]:
        """The failures (empty when ready)."""
        results = await asyncio.gather(*(self._one(n, c) for n, c in self.checks.items()))
        return [r for r in results if r is not None]


def client_key(peer: Any) -> str:
    """The per-address cap's key of a peer address (``getpeername()``): the IPv4 address (also of an
    IPv4-mapped IPv6 address), the /64 network of an IPv6 address (one host usually holds a whole /64)."""
    host = peer[0] if isinstance(peer, (tuple, list)) and peer else peer
    try:
        ip = ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return str(host)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def peer_ip(peer: Any) -> str:
    """The IP literal of a peer address (``getpeername()``), without an IPv6 zone; "?" when none."""
    host = peer[0] if isinstance(peer, (tuple, list)) and peer else peer
    if not host:
        return "?"
    text = str(host).split("%", 1)[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return text
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def has_body(request: h11.Request) -> bool:
    """Content-Length > 0 or Transfer-Encoding (h11 accepts only chunked) -- h11 has validated both."""
    for name, value in request.headers:
        if name == b"transfer-encoding" or (name == b"content-length" and int(value) > 0):
            return True
    return False


@dataclass(eq=False)
class _Conn:
    """One accepted connection: its handler task, client key, and whether its request head has arrived."""
    task: asyncio.Task
    writer: asyncio.StreamWriter
    key: str
    started: float                  # loop time of the accept
    peer: str = "?"                 # the client's address (IP literal)
    head_done: bool = False
    evicted: bool = False


class BearerGuard(LoginGuard):
    """A ``LoginGuard`` for /metrics bearer tokens that counts failures whether or not ``[auth] users``
    are configured (the ``[http]`` token alone is guessable too)."""

    def __init__(self, config: AuthConfig, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(config, clock)
        self.limit = config.max_failed_logins


def bearer_guard(auth: AuthConfig) -> LoginGuard:
    """A ``BearerGuard`` of the ``[auth]`` settings, the endpoint's own: never the NPLT port's, so a
    scraper with a stale token (or guesses through a local proxy) slows /metrics from its address,
    not every local user's login. (Users' login tokens are taken only from loopback clients, so
    guessing them from the network through /metrics is not possible at all.)"""
    return BearerGuard(auth)


def bearer_failures_log() -> ThrottledLog:
    return ThrottledLog(
        level=logging.WARNING, first="HTTP %(id)s from %(peer)s: %(reason)s",
        summary="%(n)d refused /metrics bearer tokens in the last %(s).0f s; latest: HTTP %(id)s from "
                "%(peer)s: %(reason)s")


class HttpEndpoint:
    """The listening HTTP server of one NPLT server (``server`` is read duck-typed: stopping, metrics).

    ``tokens``: sha256 digests accepted for /metrics from any client (the ``[http]`` token);
    ``local_tokens``: digests accepted only from a loopback peer (the users' NPLT login tokens). Both
    empty: /metrics is open. ``guard`` counts failed bearer attempts per address (None: a
    ``BearerGuard`` of the default ``[auth]`` settings)."""

    def __init__(self, cfg: HttpConfig, server: Any, metrics: Metrics, readiness: Readiness,
                 tokens: list[bytes], local_tokens: list[bytes] | None = None,
                 guard: LoginGuard | None = None) -> None:
        self.cfg, self.server, self.metrics, self.readiness = cfg, server, metrics, readiness
        self.tokens = list(tokens)
        self.local_tokens = list(local_tokens or ())
        self.guard = guard if guard is not None else BearerGuard(AuthConfig())
        self.failed_log = bearer_failures_log()
        self._requests = 0              # request numbers for the log lines
        self.sampler = LoopLagSampler(metrics, cfg.loop_lag_interval_s)
        self.host: str = ""
        self.port: int = 0
        self.refused = 0                # newcomers closed unanswered (every slot had a complete request head)
        self.evicted = 0                # connections closed to make room for a newcomer (head not arrived yet)
        self._listener: asyncio.base_events.Server | None = None
        self._conns: dict[asyncio.Task, _Conn] = {}   # in accept order: the first pending one is the oldest

    async def start(self) -> tuple[str, int]:
        host, port = self.cfg.address or ("127.0.0.1", 0)
        self._listener = await asyncio.start_server(self._accept, host, port, limit=self.cfg.max_request_bytes)
        self.host, self.port = self._listener.sockets[0].getsockname()[:2]
        self.sampler.start()
        log.info("HTTP health and metrics on %s:%d", self.host, self.port)
        return self.host, self.port

    async def stop(self) -> None:
        await self.sampler.stop()
        if self._listener is not None:
            self._listener.close()
        tasks = list(self._conns)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        if self._listener is not None:
            try:
                await asyncio.wait_for(self._listener.wait_closed(), timeout=1.0)
            except TimeoutError:   # pragma: no cover
                pass

    def _victim(self, key: str) -> _Conn | None | bool:
        """Room for a newcomer from ``key``: True (a free slot), the connection to close for it, or None (refuse)."""
        cfg = self.cfg
        if sum(1 for c in self._conns.values() if c.key == key) >= cfg.max_connections_per_ip:
            return next((c for c in self._conns.values() if c.key == key and not c.head_done), None)
        if len(self._conns) >= cfg.max_connections:
            return next((c for c in self._conns.values() if not c.head_done), None)
        return True

    def _evict(self, conn: _Conn) -> None:
        """Free ``conn``'s slot now; closing its transport ends its pending read (EOF), so its task returns."""
        self._conns.pop(conn.task, None)
        self.evicted += 1
        conn.evicted = True
        conn.writer.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peername = writer.get_extra_info("peername")
        key = client_key(peername)
        room = self._victim(key)
        if room is None:
            self.refused += 1
            writer.close()
            return
        if isinstance(room, _Conn):
            log.debug("HTTP connections at their cap: closing a slow one from %s for a newcomer", room.key)
            self._evict(room)
        conn = self._conns[task] = _Conn(task, writer, key, asyncio.get_running_loop().time(), peer_ip(peername))
        cfg = self.cfg
        try:
            async with asyncio.timeout(min(cfg.header_timeout_s, cfg.request_timeout_s)) as deadline:
                await self._serve(reader, writer, conn, deadline)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # stop(): end quietly (Python 3.11 logs an error for a cancelled client_connected_cb task)
            task.uncancel()
        except Exception:
            log.exception("HTTP request failed")
        finally:
            if self._conns.get(task) is conn:
                del self._conns[task]
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: _Conn,
                     deadline: asyncio.Timeout) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.cfg.max_request_bytes)
        request: h11.Request | None = None
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                await self._send(writer, conn, exc.error_status_hint, b"bad request\n", "text/plain")
                return
            if event is h11.NEED_DATA:
                data = await reader.read(4096)
                if slot.evicted:            # its slot went to a newcomer: whatever was buffered is not served
                    return
                conn.receive_data(data)
                if not data and conn.their_state is not h11.DONE:
                    try:
                        conn.next_event()
                    except h11.RemoteProtocolError:
                        pass
                    return
                continue
            if isinstance(event, h11.Request):
                request = event
                slot.head_done = True
                deadline.reschedule(slot.started + self.cfg.request_timeout_s)
                if has_body(request):       # GET/HEAD only: answer now and close, never read the body
                    if request.method in (b"GET", b"HEAD"):
                        answer = 413, b"request body not accepted\n", "text/plain; charset=utf-8", []
                    else:
                        answer = await self._route(request, slot.peer)
                    await self._answer(writer, conn, request, *answer)
                    return
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                return
        assert request is not None
        await self._answer(writer, conn, request, *await self._route(request, slot.peer))

    async def _answer(self, writer: asyncio.StreamWriter, conn: h11.Connection, request: h11.Request,
                      status: int, body: bytes, ctype: str, extra: list[tuple[str, str]]) -> None:
        if request.method == b"HEAD":
            await self._send(writer, conn, status, b"", ctype, extra, length=len(body))
        else:
            await self._send(writer, conn, status, body, ctype, extra)

    async def _send(self, writer: asyncio.StreamWriter, conn: h11.Connection, status: int, body: bytes,
                    ctype: str, extra: list[tuple[str, str]] | None = None, length: int | None = None) -> None:
        headers = [("content-type", ctype), ("content-length", str(len(body) if length is None else length)),
                   ("connection", "close"), ("cache-control", "no-store"), *(extra or [])]
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        try:
            out = conn.send(h11.Response(status_code=status, headers=headers, reason=reason(status)))
            if body:
                out += conn.send(h11.Data(data=body))
            out += conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError:
            return
        writer.write(out)
        await writer.drain()

    def _bearer(self, request: h11.Request) -> bytes | None:
        """The token of an ``Authorization: Bearer`` header (None: no such header)."""
        for name, value in request.headers:
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                return value[7:].strip()
        return None

    def _token_ok(self, token: bytes, peer: str) -> bool:
        digest = hashlib.sha256(token).digest()
        accepted = self.tokens + self.local_tokens if is_loopback(peer) else self.tokens
        found = False
        for expected in accepted:           # every digest compared: no early exit
            found |= hmac.compare_digest(digest, expected)
        return found

    async def _authorized(self, request: h11.Request, peer: str) -> bool:
        """Whether /metrics may be answered. A bearer token from an address in back-off (its
        ``guard``) is answered after the guard's ``delay_s``, right or wrong (were only failures
        delayed, hanging up early would tell a guess was wrong); a wrong one is counted and logged."""
        if not self.tokens and not self.local_tokens:
            return True
        token = self._bearer(request)
        if token is None:
            return False
        guard = self.guard
        if guard.retry_after(peer):
            await asyncio.sleep(guard.delay_s)
        if self._token_ok(token, peer):
            return True
        note = guard.failed(peer)
        self._requests += 1
        why = "/metrics: wrong bearer token"
        if self.local_tokens and not is_loopback(peer):
            why += " (users' login tokens are accepted from loopback clients only)"
        self.failed_log.note(self._requests, peer, why + note)
        return False

    async def _route(self, request: h11.Request, peer: str = "?") -> tuple[int, bytes, str, list[tuple[str, str]]]:
        text = "text/plain; charset=utf-8"
        path = request.target.split(b"?", 1)[0]
        if path not in (b"/healthz", b"/readyz", b"/metrics"):
            return 404, b"not found: try /healthz, /readyz or /metrics\n", text, []
        if request.method not in (b"GET", b"HEAD"):
            return 405, b"method not allowed\n", text, [("allow", "GET, HEAD")]
        if path == b"/healthz":
            return 200, b"ok\n", text, []
        if path == b"/readyz":
            if getattr(self.server, "stopping", False):
                return 503, b"not ready: the server is stopping\n", text, []
            failures = await self.readiness.run()
            if failures:
                return 503, ("not ready: " + "; ".join(failures) + "\n").encode(), text, []
            return 200, b"ready\n", text, []
        if not await self._authorized(request, peer):
            return 401, b"unauthorized: send Authorization: Bearer TOKEN\n", text, [("www-authenticate", "Bearer")]
        return 200, await self.metrics.render(self.server), CONTENT_TYPE_LATEST, []


async def start_http(server: Any) -> HttpEndpoint | None:
    """Start the endpoint when ``[http] listen`` is set (else None). Raises ConfigError for a refused address."""
    cfg = server.config
    http: HttpConfig = cfg.http
    if http.address is None:
        return None
    check_http_bind(http, bool(cfg.auth.users), is_loopback)
    tokens = [bytes.fromhex(http.token_sha256)] if http.token_sha256 else []
    local_tokens = [bytes.fromhex(u.token_sha256) for u in cfg.auth.users]   # loopback clients only
    readiness = Readiness({"storage": storage_check(server.store, cfg.storage.root)}, http.readiness_timeout_s)
    endpoint = HttpEndpoint(http, server, server.metrics, readiness, tokens, local_tokens,
                            bearer_guard(cfg.auth))
    await endpoint.start()
    if not is_loopback(http.address[0]):
        log.warning("HTTP health and metrics on %s:%d is plain HTTP (no TLS) beyond loopback: the /metrics "
                    "bearer token crosses the network in clear; prefer a loopback address behind a TLS proxy "
                    "or an SSH tunnel%s", endpoint.host, endpoint.port,
                    "" if tokens or local_tokens else
                    " (and /metrics is open to anyone who can reach it: [http] insecure = true)")
    return endpoint


async def stop_http(endpoint: HttpEndpoint | None) -> None:
    if endpoint is not None:
        await endpoint.stop()
