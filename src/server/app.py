"""Server: owns the listening socket and builds the ``Services`` (store, hub, sessions, runner, agent,
memory, auth) once; connections and handlers get those, never the Server.

``await start()`` opens the store (unless one is given), wires agent and memory, and listens;
with TLS the server accepts the TCP connections itself: each counts against ``max_clients`` /
``max_clients_per_ip`` from its accept, and its TLS handshake must end within ``handshake_timeout_s``
(``_Handshake``, ``loop.connect_accepted_socket``). With an admin user, a connection arriving when
every slot is taken waits on standby (``AdminSlot``) for an admin's HELLO, for which ``make_room``
closes the oldest connection still in its handshake (``server.conn_limits``, "The admin slot");
``await stop()`` shuts down gracefully: stop accepting, cancel running turns (their partial answers are
saved), send SHUTTING_DOWN to every client, close connections, close the agent and the store (which
compacts its journals).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import resource
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any, Callable

from protocol import ErrorCode
from protocol.server_events import SESSION_EVENT_KINDS, Notice
from server.config import ServerConfig, check_bind_policy, is_loopback
from server.config_base import ConfigError
from server.memory.config import MIN_PROMPT_BUDGET
from server.conn_limits import (FULL, STOPPING, AdminSlot, count_from, peer_ip, plain_on_tls_reply, regular_clients,
                                 reply_plain_and_close)
from server.connection import ServerConnection
from server.services import VERSION, Counters, Services, build_services
from server.httpd import start_http, stop_http
from server.recovery import close_interrupted_turns
from server.legacy_v2_files import clear_incoming
from storage import AsyncHistoryStore, HistoryStore, open_store

log = logging.getLogger("nplt.server")
ACCEPT_RETRY_S = 1.0    # after a failed accept (out of file descriptors, ...), as asyncio's own accept loop
#: ``start`` waits this long (seconds) for the knowledge base to load its stored documents once the
#: server listens; a longer load goes on in the background (knowledge requests answer SERVER_BUSY
#: "still loading" until it ends; PING, chat and everything else are served meanwhile)
KNOWLEDGE_LOAD_WAIT_S = 5.0
#: descriptors the server needs beyond one per client connection and one per open session journal
#: (``[storage] lru_size``): listening sockets, log files, the WAL, LLM and PostgreSQL connections,
#: knowledge and upload files, the event loop's own. ``check_fd_limit`` warns below that sum.
FD_MARGIN = 128
#: the soft open-file limit is raised to the hard one at start, to at most this many (a hard limit
#: of "unlimited" cannot be the soft one)
FD_RAISE_CAP = 1 << 20


def _peer(addr: Any) -> str:
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)


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


def check_fd_limit(cfg: ServerConfig) -> tuple[int, int]:
    """At start: raise the soft open-file limit (RLIMIT_NOFILE) to the hard one when it is lower
    (INFO), then WARN when it is below what a full server may hold open: ``max_clients`` (plus the
    admin slot) connections, ``lru_size`` journals (JSON storage) and FD_MARGIN for the rest.
    (Nothing is capped: the store closes its idle journals when it runs out of descriptors, but a
    connection refused for want of one cannot be helped by the store.) Returns (needed, limit)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 0, 0
    target = min(FD_RAISE_CAP, hard) if hard != resource.RLIM_INFINITY else FD_RAISE_CAP
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
        else:
            log.info("open-file limit raised from %d to %d (the hard limit)", soft, target)
            soft = target
    journals = cfg.storage.lru_size if cfg.storage.url is None else 0
    clients = cfg.limits.max_clients + cfg.auth.reserved_slots
    needed = clients + journals + FD_MARGIN
    if soft != resource.RLIM_INFINITY and needed > soft:
        log.warning("the open-file limit is %d, under the %d a full server may need (%d client connections + "
                    "%d session journals ([storage] lru_size) + %d for the rest): past it new connections "
                    "are refused and sessions fail with STORAGE_ERROR; raise it (ulimit -n, systemd "
                    "LimitNOFILE=) or lower [limits] max_clients / [storage] lru_size",
                    soft, needed, clients, journals, FD_MARGIN)
    return needed, soft


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


@dataclass(eq=False, slots=True)
class _Handshake:
    """A TLS connection between its TCP accept (``started``, loop time) and the end of its TLS
    handshake: counted against ``max_clients`` and ``max_clients_per_ip`` (``count_from`` reads
    ``ip``), unless it is on ``standby`` (it came with every slot taken: in ``AdminSlot.waiting``
    instead, counted against ``max_clients_per_ip`` only). ``sock`` is None once
    ``loop.connect_accepted_socket`` owns it."""
    ip: str
    sock: socket.socket | None
    conn_id: int
    peer: str
    started: float
    standby: bool = False
    task: asyncio.Task | None = None

    def drop(self) -> None:
        """Close it, wherever its handshake is."""
        if self.task is not None:
            self.task.cancel()     # (connect_accepted_socket closes the socket)
        if self.sock is not None:  # (its task had not started)
            self.sock.close()
            self.sock = None


def warn_tool_schema_budget(agent: Any, cfg: ServerConfig) -> None:
    """One start-up warning when the schemas of the tools a model is offered leave less than
    ``MIN_PROMPT_BUDGET`` of the context budget: every prompt is then squeezed into that floor and
    requests exceed the model's window (each turn says ``budget_floored``; before, only the turns said
    so). ``search_knowledge`` is offered only to a user who can see a document, so it is counted apart:
    the warning says whether every request is affected or only those of users with documents."""
    registry, count = getattr(agent, "registry", None), getattr(agent, "count_schemas", None)
    if registry is None or count is None:
        return                              # (the offline agent sends no schemas)
    disabled = getattr(registry, "disabled", frozenset())
    offered = [s for s in registry.schemas() if s["function"]["name"] not in disabled]
    always = count([s for s in offered if s["function"]["name"] != "search_knowledge"])
    most = count(offered)
    budget = cfg.memory.context.budget
    if budget - most >= MIN_PROMPT_BUDGET:
        return
    who = "every request" if budget - always < MIN_PROMPT_BUDGET else \
        "the requests of users who can see a document (search_knowledge is offered to them)"
    log.warning("the tool schemas take about %d (%d with search_knowledge) of the %d tokens "
                "context.max_input_tokens - context.reserve_output_tokens leaves for a prompt: for %s the "
                "prompt is squeezed into %d tokens and the request exceeds the model's window; raise "
                "context.max_input_tokens", always, most, budget, who, MIN_PROMPT_BUDGET)


class Server:
    """The NPLT server. Tests run it in-process on port 0.

    ``services`` exists once ``start()`` has run; ``store``, ``runner``, ``hub``, ``agent``,
    ``memory``, ``connections`` and ``slow_consumers`` read it (for tests and tools).
    """

    version = VERSION

    def __init__(self, config: ServerConfig, agent: Any = None, store: Any = None, memory: Any = None) -> None:
        self.config = config
        self._max_connections = config.limits.max_clients + config.auth.reserved_slots   # (checked per accept)
        self._agent_arg, self._store_arg, self._memory_arg = agent, store, memory
        self.services: Services | None = None
        self.counters = Counters()
        self.host: str = config.server.host
        self.port: int | None = None
        self.stopping = False
        self.http: Any = None   # server.httpd.HttpEndpoint when [http] listen is set
        self._ids = itertools.count(1)
        self._listener: asyncio.base_events.Server | None = None
        self._stopped: asyncio.Event | None = None
        self._owns_store = store is None
        self._ssl: ssl.SSLContext | None = None
        self._tls_sockets: list[socket.socket] = []     # the listening sockets of TLS (accepted by _accept_tls)
        self._accepting: list[asyncio.Task] = []
        self._handshakes: set[_Handshake] = set()       # TLS connections before the end of their handshake
        self.knowledge_loaded: asyncio.Task | None = None   # the knowledge base's load (``start``)
        # with an admin user: connections on standby for the admin slot (server.conn_limits)
        self._admin_slot = AdminSlot(self.make_room) if config.auth.reserved_slots else None

    # -- views of the services ------------------------------------------------------------------------
    def _svc(self) -> Services:
        if self.services is None:
            raise RuntimeError("the server is not started")
        return self.services

    store = property(lambda self: self._svc().store)
    hub = property(lambda self: self._svc().hub)
    sessions = property(lambda self: self._svc().sessions)
    runner = property(lambda self: self._svc().runner)
    agent = property(lambda self: self._svc().agent)
    memory = property(lambda self: self._svc().memory)
    connections = property(lambda self: self._svc().connections)
    slow_consumers = property(lambda self: self.counters.slow_consumers)
    refusals = property(lambda self: self.counters.refusals)
    metrics = property(lambda self: self._svc().metrics)
    tls_handshakes = property(lambda self: len(self._handshakes))   # TLS connections in their handshake

    def _refuse_reason(self) -> str | None:
        if self.stopping:
            return STOPPING
        if len(self._svc().connections) + len(self._handshakes) >= self._max_connections:
            return FULL
        return None

    def make_room(self, newcomer: ServerConnection) -> bool:
        """Whether an admin's HELLO on the standby connection ``newcomer`` may take a slot.

        With every slot taken while a non-admin holds the admin slot, the oldest connection still in
        its handshake (a TLS handshake, or no HELLO accepted yet) is closed for it (SERVER_FULL): an
        anonymous client can hold the admin slot, but not keep an admin out, however fast it
        reconnects. When an admin holds the admin slot, the server stays full (False).
        """
        live = [c for c in self._svc().connections if not c.closing]
        if len(live) + len(self._handshakes) < self._max_connections:
            return True            # (a slot was freed meanwhile)
        if regular_clients(live) + len(self._handshakes) <= self.config.limits.max_clients:
            return False
        waiting: list[ServerConnection | _Handshake] = [c for c in live if c.in_handshake and c is not newcomer]
        waiting.extend(self._handshakes)
        if not waiting:            # (their HELLOs are being answered: one of them will be refused)
            return False
        victim = min(waiting, key=lambda c: c.started)
        self.counters.refusals.note(victim.conn_id, victim.peer, "closed in its handshake to let an admin in "
                                                                 "(admin slot)")
        if isinstance(victim, _Handshake):
            self._handshakes.discard(victim)
            victim.drop()
        else:
            victim.fatal(ErrorCode.SERVER_FULL, victim.full_message(taken=True))
        return True

    def _new_connection(self) -> ServerConnection:
        return ServerConnection(self._svc(), next(self._ids), self._refuse_reason, self._admin_slot)

    async def _listen_tls(self, ssl_ctx: ssl.SSLContext, host: str, port: int, backlog: int) -> None:
        """Listen on every address of ``host`` (as ``loop.create_server`` does) and accept in _accept_tls."""
        loop = asyncio.get_running_loop()
        self._ssl = ssl_ctx
        for family, kind, proto, _, addr in dict.fromkeys(
                await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)):
            sock = socket.socket(family, kind, proto)
            self._tls_sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(addr)
            except OSError as exc:   # (worded as loop.create_server words it)
                raise OSError(exc.errno, f"error while attempting to bind on address {addr!r}: "
                                         f"{(exc.strerror or str(exc)).lower()}") from None
            sock.listen(backlog)
            sock.setblocking(False)
        self._accepting = [loop.create_task(self._accept_tls(sock)) for sock in self._tls_sockets]

    async def _accept_tls(self, listening: socket.socket) -> None:
        """Accept TLS connections. A connection over ``max_clients`` or ``max_clients_per_ip`` (those
        in their handshake counted) is closed at once, before any TLS work: without a handshake it
        cannot be told why (a plain-TCP client gets SERVER_FULL / TOO_MANY_CONNECTIONS); with an admin
        user, one over ``max_clients`` is handshaken on standby instead (uncounted, within
        ``standby_timeout_s``), for an admin's HELLO. Otherwise it is counted from its accept on, and
        handshaken in a task of its own."""
        loop = asyncio.get_running_loop()
        per_ip = self.config.limits.max_clients_per_ip
        slot = self._admin_slot
        while True:
            try:
                sock, addr = await loop.sock_accept(listening)
            except (ConnectionAbortedError, InterruptedError):
                continue
            except OSError as exc:   # out of file descriptors, ...: as asyncio's own accept loop does
                log.error("cannot accept a TLS connection: %s; retrying in %g s", exc, ACCEPT_RETRY_S)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            conn_id, ip = next(self._ids), peer_ip(addr)
            reason = self._refuse_reason()
            standby = reason == FULL and slot is not None
            if (reason is None or standby) and per_ip and count_from(self._svc().connections, ip) + \
                    count_from(self._handshakes, ip) + (count_from(slot.waiting, ip) if slot else 0) >= per_ip:
                reason, standby = "max_clients_per_ip reached", False
            if reason is not None and not standby:
                self.counters.refusals.note(conn_id, _peer(addr), f"{reason} (closed before the TLS handshake)")
                sock.close()
                continue
            hs = _Handshake(ip, sock, conn_id, _peer(addr), loop.time(), standby=standby)
            (slot.waiting if standby else self._handshakes).add(hs)   # type: ignore[union-attr]
            hs.task = loop.create_task(self._tls_handshake(hs))

    async def _tls_handshake(self, hs: _Handshake) -> None:
        """The TLS handshake of an accepted connection, within ``handshake_timeout_s`` (on standby:
        ``standby_timeout_s``); the ServerConnection is made when it is done (its own HELLO timer
        starts then; on standby, its deadline stays ``standby_timeout_s`` from the accept)."""
        limits = self.config.limits
        timeout = limits.standby_s if hs.standby else limits.handshake_timeout_s
        sock, hs.sock = hs.sock, None
        conn_id, peer = hs.conn_id, hs.peer

        def refuse_reason() -> str | None:   # asked by the connection once its handshake is done
            self._forget(hs)
            return self._refuse_reason()

        def connection() -> ServerConnection:
            conn = ServerConnection(self._svc(), conn_id, refuse_reason, self._admin_slot)
            conn.started = hs.started   # from the TCP accept: a standby's deadline includes its TLS handshake
            return conn

        loop = asyncio.get_running_loop()
        try:
            try:
                reply = await plain_on_tls_reply(sock, timeout)   # bytes no TLS client sends: told in plain text
            except BaseException:
                sock.close()
                raise
            if reply is not None:
                self._svc().auth.guard.log_closed(conn_id, peer, "no TLS record on the TLS port; told so in plain text")
                reply_plain_and_close(sock, reply)
                return
            await loop.connect_accepted_socket(connection, sock, ssl=self._ssl,
                                               ssl_handshake_timeout=max(timeout - (loop.time() - hs.started), 0.01))
        except Exception as exc:   # the socket is closed by connect_accepted_socket
            if isinstance(exc, ConnectionAbortedError):   # (anyone can cause it: logged without flooding)
                self._svc().auth.guard.log_closed(conn_id, peer, f"no TLS handshake within {timeout:g} s; closed")
            else:
                log.debug("connection %s (%s): TLS handshake failed: %s", conn_id, peer, exc)
        finally:
            self._forget(hs)

    def _forget(self, hs: _Handshake) -> None:
        """``hs`` is no longer a TLS connection in its handshake."""
        self._handshakes.discard(hs)
        if self._admin_slot is not None:
            self._admin_slot.waiting.discard(hs)

    async def _close_tls(self) -> None:
        """Stop accepting TLS connections; handshakes in progress are closed."""
        for task in self._accepting:
            task.cancel()
        await asyncio.gather(*self._accepting, return_exceptions=True)   # (no reader left on the sockets)
        for sock in self._tls_sockets:
            sock.close()
        waiting = self._admin_slot.waiting if self._admin_slot is not None else ()
        for hs in [*self._handshakes, *(w for w in waiting if isinstance(w, _Handshake))]:
            self._forget(hs)
            hs.drop()

    async def start(self, before_listening: Callable[[], None] | None = None) -> tuple[str, int]:
        """Open everything and listen; returns the bound (host, port). ``before_listening`` is called
        just before the listener opens (``main``: the garbage collector's tuning). The knowledge
        base's documents are loaded once the server listens (``knowledge_loaded``: that task), waited
        for ``KNOWLEDGE_LOAD_WAIT_S`` at most here."""
        cfg = self.config
        check_bind_policy(cfg)
        check_fd_limit(cfg)
        tls = cfg.server.tls_cert is not None      # (both or neither, never empty: ServerSection)
        ssl_ctx = make_ssl_context(cfg.server.tls_cert, cfg.server.tls_key) if tls else None
        loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        store = self._store_arg
        if store is None:
            store = await open_store(cfg.storage)   # JSON files, or PostgreSQL when [storage] url is set
        elif isinstance(store, HistoryStore):
            store = AsyncHistoryStore(store)
        self.services = svc = build_services(cfg, store, self.notify, agent=self._agent_arg,
                                             memory=self._memory_arg, counters=self.counters)
        try:
            await close_interrupted_turns(store, svc.runner.inflight, svc.sessions.model_of)
            await svc.knowledge.open()      # (its documents are loaded once the server listens)
            await svc.uploads.start()
            await clear_incoming(cfg)
            if cfg.single_user:   # UDP downloads serve v2 clients only, which are refused when users are configured
                await svc.udp.start(cfg.transfer.udp_host or cfg.server.host)
            if svc.cluster is not None:
                await svc.cluster.start()   # before listening: every turn is relayed and locked
            backlog = min(4096, max(128, cfg.limits.max_clients))
            if before_listening is not None:
                before_listening()
            if ssl_ctx is None:
                self._listener = await loop.create_server(self._new_connection, cfg.server.host, cfg.server.port,
                                                          backlog=backlog)
            else:   # TLS under the connection limits from the accept on
                await self._listen_tls(ssl_ctx, cfg.server.host, cfg.server.port, backlog)
        except BaseException:
            await self._close_tls()
            if svc.cluster is not None:
                await svc.cluster.close()
            await svc.udp.close()
            await svc.knowledge.close()
            if self._owns_store:
                await store.close()
            raise
        sock = (self._listener.sockets[0] if self._listener is not None else self._tls_sockets[0]).getsockname()
        self.host, self.port = sock[0], sock[1]
        self.counters.started_monotonic = time.monotonic()
        loading = self.knowledge_loaded = svc.knowledge.load_in_background()
        log.info("listening on %s:%d (%s, agent %s, %s)", self.host, self.port, "TLS" if ssl_ctx else "TCP",
                 svc.agent.name, "single user" if cfg.single_user else f"{len(cfg.auth.users)} users")
        if self._agent_arg is None:
            log.log(*cfg.llm.startup_note())
        warn_tool_schema_budget(svc.agent, cfg)
        if ssl_ctx is None and not is_loopback(cfg.server.host):
            log.warning("listening on %s without TLS: %s cross the network in clear; set tls_cert and tls_key "
                        "(or use an SSH tunnel)", cfg.server.host,
                        "conversations" if cfg.single_user else "tokens and conversations")
        if not cfg.single_user:
            log.info("no UDP downloads: v2 clients are refused when users are configured")
        try:
            self.http = await start_http(self)
            # a small knowledge base is ready when start returns; a large one goes on loading (logged)
            await asyncio.wait((loading,), timeout=KNOWLEDGE_LOAD_WAIT_S)
        except BaseException:
            await self.stop()
            raise
        if not loading.done():
            log.info("knowledge base still loading: knowledge requests answer SERVER_BUSY until it is done")
        return self.host, self.port

    def notify(self, kind: str, session_id: str, payload: Any = None) -> asyncio.Future:
        """Callback for the memory layer: session events (e.g. "summary") and notices.

        Returns a finished future, so the caller may await it or not.
        """
        svc = self._svc()
        if kind in SESSION_EVENT_KINDS:
            svc.runner.spawn(svc.sessions.publish_updated(session_id, kind))
        else:
            p = payload if isinstance(payload, dict) else {"message": str(payload or kind)}
            svc.hub.publish_session(session_id, Notice(p.get("level", "warning"), p.get("code", str(kind).upper()),
                                                       p.get("message", ""), session_id))
        fut = asyncio.get_running_loop().create_future()
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
        await self._close_tls()
        svc = self.services
        if svc is None:  # never started
            return
        await svc.runner.shutdown(timeout=grace_s)
        for conn in [*svc.connections, *(self._admin_slot.waiting if self._admin_slot is not None else ())]:
            conn.shutdown()   # (connections on standby too; their TLS handshakes were closed above)
        tasks = [t for conn in list(svc.connections) for t in conn.pending.values()]
        if tasks:  # requests already being answered (e.g. an append in progress) may finish
            _, late = await asyncio.wait(tasks, timeout=grace_s)
            for t in late:
                t.cancel()
        for name, part in (("memory", svc.memory), ("agent", svc.agent)):
            if hasattr(part, "aclose"):  # background summaries are cancelled: they change nothing
                try:
                    await part.aclose()
                except Exception:  # the rest of the shutdown (the store's compaction) must still run
                    log.exception("%s close failed", name)
        if svc.cluster is not None:   # after the turns: their last events reach the other nodes
            await svc.cluster.close()
        await asyncio.to_thread(svc.runner.inflight.close)
        await svc.uploads.close()
        await svc.udp.close()
        await svc.knowledge.close()
        if self._owns_store:
            await svc.store.close()
        if self._listener is not None:
            try:
                await asyncio.wait_for(self._listener.wait_closed(), timeout=grace_s)
            except asyncio.TimeoutError:
                log.warning("some connections did not close in time")
        await stop_http(self.http)
        self._stopped.set()
        log.info("stopped")
