"""Server: owns the listening socket, the store, the agent, the hub and the turn runner.

``await start()`` opens the store (unless one is given), wires agent and memory, and listens;
``await stop()`` shuts down gracefully: stop accepting, cancel running turns (their partial answers are
saved), send SHUTTING_DOWN to every client, close connections, close the agent and the store (which
compacts its journals).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
import time
from typing import Any

from protocol import MsgType
from server.auth import Authenticator
from server.config import ServerConfig, check_bind_policy
from server.config_base import ConfigError
from server.connection import ServerConnection
from server.httpd import start_http, stop_http
from server.hub import Hub
from server.metrics import Metrics
from server.refusals import Refusals
from server.sessions import SessionService
from server.turns import TurnRunner
from server.wiring import build_runtime
from storage import AsyncHistoryStore, HistoryStore

log = logging.getLogger("nplt.server")

VERSION = "0.1.0"
SESSION_EVENT_KINDS = {"created", "renamed", "deleted", "cleared", "updated", "summary", "model"}


def _check_readable(key: str, path: str) -> None:
    """A ConfigError naming the config key and the file when ``path`` cannot be opened for reading.

    ssl's own errors do not say which of the two files is missing (``FileNotFoundError`` has no filename).
    """
    try:
        with open(path, "rb"):
            pass
    except FileNotFoundError:
        raise ConfigError(f"server.{key}", f"file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"server.{key}", f"is a directory, not a PEM file: {path}") from None
    except OSError as exc:
        raise ConfigError(f"server.{key}", f"cannot read {path}: {exc.strerror}") from None


def make_ssl_context(cert: str, key: str) -> ssl.SSLContext:
    """A server TLS context from PEM files; missing, unreadable or invalid files are config errors."""
    _check_readable("tls_cert", cert)
    _check_readable("tls_key", key)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError("server.tls_cert",
                          f"cannot load certificate {cert} with key {key} (server.tls_key): {exc}") from None
    return ctx


class Server:
    """The NPLT server. Tests run it in-process on port 0."""

    version = VERSION

    def __init__(self, config: ServerConfig, agent: Any = None, store: Any = None, memory: Any = None) -> None:
        self.config = config
        self._agent_arg, self._store_arg, self._memory_arg = agent, store, memory
        self.agent: Any = agent
        self.store: Any = None
        self.memory: Any = memory
        self.hub = Hub()
        self.runner = TurnRunner(self)
        self.sessions: SessionService | None = None
        self.auth = Authenticator(config.auth)
        self.connections: set[ServerConnection] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.host: str = config.server.host
        self.port: int | None = None
        self.stopping = False
        self.started_monotonic = time.monotonic()
        self.slow_consumers = 0
        self.refusals = Refusals()
        self.metrics = Metrics()
        self.http: Any = None   # server.httpd.HttpEndpoint when [http] listen is set
        self._ids = itertools.count(1)
        self._listener: asyncio.base_events.Server | None = None
        self._stopped: asyncio.Event | None = None
        self._owns_store = store is None

    def next_conn_id(self) -> int:
        return next(self._ids)

    def sessions_loaded(self) -> int:
        count = getattr(self.store.sync, "loaded_count", None)
        if callable(count):
            count = count()
        return int(count) if count is not None else self.hub.attached_sessions()

    async def start(self) -> tuple[str, int]:
        """Open everything and listen; returns the bound (host, port)."""
        cfg = self.config
        check_bind_policy(cfg)
        ssl_ctx = make_ssl_context(cfg.server.tls_cert, cfg.server.tls_key) if cfg.server.tls_cert else None
        self.loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        store = self._store_arg
        if store is None:
            store = await AsyncHistoryStore.open(cfg.storage)
        elif isinstance(store, HistoryStore):
            store = AsyncHistoryStore(store)
        self.store = store
        self.sessions = SessionService(self)
        self.agent, self.memory = build_runtime(cfg, store, self.notify, self._agent_arg, self._memory_arg)
        try:
            self._listener = await self.loop.create_server(
                lambda: ServerConnection(self), cfg.server.host, cfg.server.port, ssl=ssl_ctx,
                backlog=min(4096, max(128, cfg.limits.max_clients)))
        except BaseException:
            if self._owns_store:
                await store.close()
            raise
        sock = self._listener.sockets[0].getsockname()
        self.host, self.port = sock[0], sock[1]
        self.started_monotonic = time.monotonic()
        log.info("listening on %s:%d (%s, agent %s, %s)", self.host, self.port, "TLS" if ssl_ctx else "TCP",
                 self.agent.name, "single user" if cfg.single_user else f"{len(cfg.auth.users)} users")
        try:
            self.http = await start_http(self)
        except BaseException:
            await self.stop()
            raise
        return self.host, self.port

    def notify(self, kind: str, session_id: str, payload: Any = None) -> asyncio.Future:
        """Callback for the memory layer: session events (e.g. "summary") and notices.

        Returns a finished future, so the caller may await it or not.
        """
        if kind in SESSION_EVENT_KINDS:
            self.runner._spawn(self.sessions.publish_updated(session_id, kind))
        else:
            p = payload if isinstance(payload, dict) else {"message": str(payload or kind)}
            self.hub.publish_session_v3(session_id, MsgType.NOTICE, {
                "level": p.get("level", "warning"), "code": p.get("code", str(kind).upper()),
                "message": p.get("message", ""), "session_id": session_id})
        fut = self.loop.create_future()
        fut.set_result(None)
        return fut

    async def stop(self, grace_s: float | None = None) -> None:
        """Graceful shutdown; safe to call twice. Each waiting step (turns saving their partial
        answers, requests in progress, connections closing) takes at most ``limits.shutdown_grace_s``."""
        if grace_s is None:
            grace_s = self.config.limits.shutdown_grace_s
        if self.stopping:
            if self._stopped is not None:
                await self._stopped.wait()
            return
        self.stopping = True
        log.info("shutting down")
        if self._listener is not None:
            self._listener.close()
        await self.runner.shutdown(timeout=grace_s)
        for conn in list(self.connections):
            conn.shutdown()
        tasks = [t for conn in list(self.connections) for t in conn.pending.values()]
        if tasks:  # requests already being answered (e.g. an append in progress) may finish
            _, late = await asyncio.wait(tasks, timeout=grace_s)
            for t in late:
                t.cancel()
        if hasattr(self.memory, "aclose"):  # background summaries are cancelled: they change nothing
            try:
                await self.memory.aclose()
            except Exception:
                log.exception("memory close failed")
        if self.agent is not None and hasattr(self.agent, "aclose"):
            try:
                await self.agent.aclose()
            except Exception:
                log.exception("agent close failed")
        if self._owns_store and self.store is not None:
            await self.store.close()
        if self._listener is not None:
            try:
                await asyncio.wait_for(self._listener.wait_closed(), timeout=grace_s)
            except asyncio.TimeoutError:
                log.warning("some connections did not close in time")
        await stop_http(self.http)
        self._stopped.set()
        log.info("stopped")
