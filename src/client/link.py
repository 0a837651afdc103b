"""The client's link to the server: one TCP (or TLS) connection driven by the sans-IO
``protocol.Connection``, under ``client.connection.Client`` (which turns requests into typed methods).

``Link`` connects and sends HELLO, matches replies to requests by id (futures), answers server
PINGs, delivers server events through a bounded queue (``events()`` / ``next_event()``, see
``client.events`` for the backpressure rule) and, when the connection drops after a successful
HELLO, reconnects with exponential backoff, re-sending HELLO with the current session id
(``session_id``, which ``track_session`` follows). State
changes are reported as ``Connected`` / ``Reconnecting`` / ``Disconnected`` events.

Liveness: a frozen server or a dead network path (no FIN, no RST) would otherwise leave the link
"connected" forever, since ``request_timeout`` bounds requests only. While connected, a watchdog
(``_watch``) notes when a byte last arrived; after ``liveness_timeout`` seconds without any (default:
twice the server's ``ping_interval_s`` from the HELLO limits, at least ``LIVENESS_MIN_S``; the server
PINGs a silent connection every ``ping_interval_s``, so a healthy one is never that quiet) it sends
PING, and when still nothing arrives within ``min(liveness_timeout, LIVENESS_PONG_S)`` the connection
is aborted and handled as lost (pending requests fail with CONNECTION_LOST, then the reconnect or
``Disconnected``, as for a closed socket).

Replies and events are decoded into the typed classes of ``protocol.replies`` and
``protocol.server_events``. A reply that does not validate fails its request with
``ClientError(INVALID_MESSAGE)``; an event that does not validate is delivered as ``InvalidFrame``.
Cancelling a caller that awaits a request (or ``close``) propagates its CancelledError.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import random
import ssl
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, AsyncIterator

from protocol import BINARY_TYPES, Connection, ErrorCode, InvalidMessage, MsgType, ProtocolError, Role
from protocol.binary import data_frames
from protocol.objects import SessionInfo
from protocol.replies import ErrorReply, HelloReply, Reply, decode_reply
from protocol.server_events import EVENT_TYPES, SessionEvent, decode_event

from client import errors
from client.errors import ClientError
from client.events import Connected, Disconnected, Event, EventQueue, InvalidFrame, Reconnecting, ServerError

log = logging.getLogger(__name__)

DEFAULT_CLIENT_NAME = "nplt-client/0.1"
READ_CHUNK = 65536
NOT_TLS = "the server does not speak TLS on this port (drop --tls)"
EXPECTS_TLS = "the server expects TLS (use --tls)"
# a connection closed during the TLS handshake: a plain-TCP server does that, and so does a TLS server
# that refuses the connection before its handshake (full, or too many connections from this address)
CLOSED_IN_HANDSHAKE = (f"{NOT_TLS}, or it refused the connection before the handshake (full, or too many "
                       "connections from this address: try again later)")
# OpenSSL's reasons for a handshake answered by bytes that are not TLS (a plain-TCP server)
NOT_TLS_REASONS = frozenset({"WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE",
                             "UNKNOWN_PROTOCOL", "HTTP_REQUEST"})
#: liveness (module docstring): without a ``liveness_timeout`` given, the silence allowed is twice the
#: server's ``ping_interval_s`` (HELLO ``limits``), never less than LIVENESS_MIN_S (a server pinging
#: every 50 ms must not get its clients dropped by one slow PONG), or LIVENESS_DEFAULT_S when the
#: server does not say
LIVENESS_DEFAULT_S = 120.0
LIVENESS_MIN_S = 5.0
#: after the client's PING, how long it waits for any byte at most (capped by the liveness timeout)
LIVENESS_PONG_S = 10.0


@dataclass(slots=True)
class Backoff:
    """Reconnect delays: ``initial * factor**(attempt-1)`` capped at ``maximum``, +/- ``jitter`` fraction."""
    initial: float = 0.25
    maximum: float = 10.0
    factor: float = 2.0
    jitter: float = 0.1
    max_attempts: int | None = None  # None = keep trying until closed

    def delay(self, attempt: int) -> float:
        base = min(self.maximum, self.initial * self.factor ** max(0, attempt - 1))
        return max(0.0, base * (1.0 + random.uniform(-self.jitter, self.jitter)))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _why(exc: BaseException) -> str:
    """An exception's text, or its class when it has none (``ConnectionResetError()``)."""
    return str(exc) or type(exc).__name__


def _tls_record(data: bytes) -> bool:
    """Whether ``data`` starts like a TLS record (alert 0x15 or handshake 0x16, version 0x03 0x00..0x04):
    a TLS server answering a plain HELLO. No NPLT server sends these types."""
    return len(data) >= 2 and data[0] in (0x15, 0x16) and data[1] == 0x03 and (len(data) < 3 or data[2] <= 0x04)


class _Dropped(ClientError):
    """The server dropped the connection before any answer (during the TLS handshake, or a plain
    HELLO closed unanswered): TLS_ERROR naming the likely mismatch once ``_establish`` saw it twice."""

    def __init__(self, message: str) -> None:
        super().__init__(errors.TLS_ERROR, message)


async def _cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait for it to end. The task's own CancelledError is absorbed; the
    caller's (this coroutine being cancelled meanwhile) propagates."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception as exc:  # the task failed while stopping: nothing left to do but say so
        log.debug("task %s ended with %r while being stopped", task.get_name(), exc)


class Link:
    """One client's connection to the server, reconnected as needed (see the module docstring)."""

    def __init__(self, host: str, port: int, *, token: str | None = None, tls: ssl.SSLContext | None = None,
                 client_name: str = DEFAULT_CLIENT_NAME, session_id: str | None = None, reconnect: bool = True,
                 backoff: Backoff | None = None, request_timeout: float = 30.0, connect_timeout: float = 10.0,
                 event_queue_size: int = 1000, max_message_size: int = 8 << 20,
                 liveness_timeout: float | None = None) -> None:
        self.host, self.port = host, port
        self.token, self.tls, self.client_name = token, tls, client_name
        self.reconnect_enabled = reconnect
        self.backoff = backoff or Backoff()
        self.request_timeout, self.connect_timeout = request_timeout, connect_timeout
        self.max_message_size = max_message_size
        #: seconds without a byte from the server before the link PINGs it (None: from the HELLO limits)
        self.liveness_timeout = liveness_timeout
        self.session_id = session_id          # the session HELLO attaches to (a reconnect too)
        self.hello: HelloReply | None = None
        self.state = "disconnected"
        self._queue = EventQueue(event_queue_size)
        self._ids = itertools.count(1)
        self._pending: dict[int | str, tuple[MsgType, asyncio.Future[Reply]]] = {}
        self._conn: Connection | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._reconnect_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._last_rx = 0.0                    # loop time a byte last arrived on the current connection
        self._dispatching = False              # the reader is handing on what it read (not reading)
        self.liveness_pings = 0                #: PINGs the liveness watchdog sent (all connections)
        self._closing = False
        self._ever_connected = False
        self._hello_id: int | None = None
        self._connected = asyncio.Event()      # set while connected (wait_connected)
        #: message type -> callback taking the message instead of the event queue: the raw payload of a
        #: binary data frame, the ``ErrorReply`` of an ERROR that answers no request (MsgType.ERROR: an
        #: upload's refused bytes), the typed event (``KbProgress`` of a running upload) otherwise; the
        #: callback returns False to leave an event (or ERROR) to the queue
        self.taps: dict[int, Any] = {}

    # -- public surface -------------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self.state == "connected"

    @property
    def liveness(self) -> float:
        """The silence (seconds without a byte from the server) after which the link PINGs the server:
        ``liveness_timeout``, else twice the server's ``ping_interval_s`` (at least ``LIVENESS_MIN_S``),
        else ``LIVENESS_DEFAULT_S``."""
        if self.liveness_timeout is not None:
            return self.liveness_timeout
        ping = self.hello.limits.get("ping_interval_s") if self.hello is not None else None
        if isinstance(ping, (int, float)) and not isinstance(ping, bool) and ping > 0:
            return max(LIVENESS_MIN_S, 2.0 * float(ping))
        return LIVENESS_DEFAULT_S

    def track_session(self, session: SessionInfo | None) -> None:
        """Follow the session a reply names (HELLO, a session switch): a reconnect re-attaches to it.
        None (a delete's ``current: null``: the connection has no session, docs/protocol.md §5.2): none,
        so the next ``chat_send`` creates one instead of going to the deleted session."""
        if session is None:
            self.session_id = None
        elif session.session_id:
            self.session_id = session.session_id

    async def connect(self) -> HelloReply:
        """Open the connection and complete HELLO; returns the HELLO reply. Raises ClientError."""
        if self._closing:
            raise ClientError(errors.CLOSED, "the client is closed")
        self.state = "connecting"
        try:
            return await self._establish()
        except ClientError:
            self.state = "disconnected"
            raise

    async def close(self) -> None:
        """Close the connection for good; pending requests fail with CLOSED and ``events()`` ends."""
        if self._closing:
            return
        self._closing = True
        try:
            if self._reconnect_task is not None:
                await _cancel_and_wait(self._reconnect_task)
            await self._teardown()
        finally:  # also when the caller is cancelled meanwhile: nothing is left open or waiting
            if self._writer is not None:
                self._writer.close()
            self._fail_pending(ClientError(errors.CLOSED, "the client was closed"))
            self.state = "closed"
            self._queue.close()

    async def request(self, msg_type: MsgType, body: dict[str, Any] | None = None,
                      timeout: float | None = None) -> Reply:
        """Send one request and wait for its typed reply (``protocol.replies``; ``Pong`` for PING).

        An ERROR reply raises ClientError with its code."""
        if self.state != "connected" and msg_type != MsgType.HELLO:
            raise ClientError(errors.NOT_CONNECTED, f"not connected ({self.state})")
        return await self._request(msg_type, dict(body or {}), timeout)

    async def events(self) -> AsyncIterator[Event]:
        """Server events and STATE changes, in order, until the client is closed or gives up."""
        while True:
            event = await self._queue.get()
            if event is None:
                return
            yield event

    async def wait_connected(self, timeout: float) -> None:
        """Return once connected (after a reconnect, say); ClientError TIMEOUT or CLOSED otherwise."""
        if self._closing:
            raise ClientError(errors.CLOSED, "the client is closed")
        try:
            await asyncio.wait_for(self._connected.wait(), timeout)
        except asyncio.TimeoutError as exc:
            raise ClientError(errors.TIMEOUT, f"not connected within {timeout:g} s ({self.state})") from exc

    async def send_data(self, msg_type: MsgType, handle: int, offset: int, data: bytes) -> None:
        """Send ``data`` as binary data frames (docs/protocol.md §5.8) and wait for the socket to drain."""
        conn, writer = self._conn, self._writer
        if conn is None or writer is None or writer.is_closing() or self.state != "connected":
            raise ClientError(errors.NOT_CONNECTED, f"not connected ({self.state})")
        try:
            writer.write(b"".join(data_frames(conn.send_raw, msg_type, handle, offset, data)))
            await writer.drain()
        except (ConnectionError, OSError) as exc:
            raise ClientError(errors.CONNECTION_LOST, f"send failed: {_why(exc)}") from exc

    async def next_event(self, timeout: float | None = None) -> Event | None:
        """The next event (None once closed); raises TimeoutError after ``timeout`` seconds."""
        return await self._queue.get(timeout)

    # -- connection lifecycle -------------------------------------------------------------------------
    async def _establish(self) -> HelloReply:
        """Connect and complete HELLO. A server that heard nothing from this client for its v2 grace
        period (``legacy_grace_ms``: the HELLO was late, e.g. the loop stalled after the connect)
        serves the connection as v2 and answers with v2 text instead of the HELLO reply: then the
        connection is dropped and made again at once, once (docs/protocol.md §2).

        A connection dropped before any answer (``_Dropped``: reset or closed during the TLS
        handshake, or a plain HELLO closed unanswered) is also made again at once, once: a server
        going down does that to a connection or two, and the next attempt finds it gone or back.
        Twice in a row it is a TLS mismatch: TLS_ERROR, which no reconnect retries."""
        try:
            return await self._establish_once()
        except _Dropped as exc:
            log.info("%s: trying once more", exc.message)
        except ClientError as exc:
            if exc.code != errors.SERVED_AS_V2:
                raise
            log.info("served as a v2 client (the HELLO came after the server's grace period): reconnecting")
        return await self._establish_once()

    async def _establish_once(self) -> HelloReply:
        where = f"{self.host}:{self.port}"
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self.tls,
                                        server_hostname=self.host if self.tls else None,
                                        limit=READ_CHUNK * 4),
                self.connect_timeout)
        except ConnectionRefusedError as exc:
            raise ClientError(errors.CONNECTION_REFUSED, f"connection refused by {where}") from exc
        except ssl.SSLCertVerificationError as exc:
            raise ClientError(errors.TLS_ERROR, f"the certificate of {where} is not trusted: {exc.verify_message} "
                              "(the CA to trust: --tls-ca FILE, or tls.ca_file)") from exc
        except (ssl.SSLEOFError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError) as exc:
            if self.tls is None:
                raise ClientError(errors.CONNECTION_FAILED, f"cannot connect to {where}: {_why(exc)}") from exc
            raise _Dropped(f"{where} closed the connection during the TLS handshake ({_why(exc)}): "
                           f"{CLOSED_IN_HANDSHAKE}") from exc
        except ssl.SSLError as exc:
            hint = f": {NOT_TLS}" if exc.reason in NOT_TLS_REASONS else ""
            raise ClientError(errors.TLS_ERROR, f"TLS handshake with {where} failed: {_why(exc)}{hint}") from exc
        except asyncio.TimeoutError as exc:
            raise ClientError(errors.TIMEOUT, f"connecting to {where} timed out") from exc
        except OSError as exc:
            raise ClientError(errors.CONNECTION_FAILED, f"cannot connect to {where}: {_why(exc)}") from exc
        self._conn = Connection(Role.CLIENT, max_message_size=self.max_message_size)
        self._writer = writer
        self._last_rx = asyncio.get_running_loop().time()
        self._reader_task = asyncio.create_task(self._read_loop(reader, self._conn), name="nplt-client-reader")
        body: dict[str, Any] = {"proto": 3, "client": self.client_name}
        if self.token is not None:
            body["token"] = self.token
        if self.session_id is not None:
            body["session_id"] = self.session_id
        try:
            hello = await self._request(MsgType.HELLO, body, self.connect_timeout)
        except BaseException:  # ClientError, or the caller cancelled: do not leave the socket open
            await self._teardown()
            raise
        assert isinstance(hello, HelloReply)
        return hello

    async def _on_hello(self, hello: HelloReply) -> None:
        """HELLO accepted (called by the reader, so Connected precedes every later event)."""
        reconnected = self._ever_connected
        self.hello = hello
        limit = hello.limits.get("max_message_size")
        if self._conn is not None and isinstance(limit, int) and 0 < limit < self._conn.max_message_size:
            self._conn.max_message_size = limit  # a request the server would discard fails here, at once
        # the session HELLO attached to: none when the asked one is gone and the user has no other
        # (then ``ask --session <gone id>`` is NOT_FOUND, not a new session answered in silence)
        self.session_id = hello.session.session_id if hello.session is not None else None
        self.state = "connected"
        self._connected.set()
        self._ever_connected = True
        self._stop_watch()
        if self._conn is not None:
            self._watch_task = asyncio.create_task(self._watch(self._conn), name="nplt-client-liveness")
        await self._queue.put(Connected(hello, reconnected))

    def _stop_watch(self) -> None:
        task, self._watch_task = self._watch_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _watch(self, conn: Connection) -> None:
        """The liveness watchdog of connection ``conn`` (module docstring): PING the server after
        ``liveness`` seconds without a byte from it; abort the connection when still nothing comes."""
        loop = asyncio.get_running_loop()
        while self._conn is conn and not self._closing:
            limit = self.liveness
            quiet = 0.0 if self._dispatching else loop.time() - self._last_rx
            if quiet < limit:
                await asyncio.sleep(limit - quiet)    # (a timer: woken to look again, not to synchronise)
                continue
            bound = min(limit, LIVENESS_PONG_S)
            self.liveness_pings += 1
            try:
                await asyncio.wait_for(self._request(MsgType.PING, {}, bound), bound)
                continue
            except (ClientError, asyncio.TimeoutError) as exc:
                if self._conn is not conn or self._closing:
                    return                               # lost or closed meanwhile: handled there
                if not (isinstance(exc, asyncio.TimeoutError) or exc.code == errors.TIMEOUT):
                    log.debug("liveness PING not sent: %s", exc)
                    return                               # the connection is going away: the reader sees it
            silent = 0.0 if self._dispatching else loop.time() - self._last_rx
            if silent < limit:
                continue                                 # bytes came meanwhile (a PONG behind a big frame)
            log.warning("no byte from %s:%d for %.1f s, nor an answer to PING: the connection is taken as lost",
                        self.host, self.port, silent)
            self._abort(f"no answer from the server for {silent:.0f} s (liveness_timeout_s {limit:g})")
            return

    def _abort(self, reason: str) -> None:
        """Drop the current connection at once (``transport.abort``: the unsent bytes are discarded, a
        frozen peer would never take them) and handle it as lost for ``reason``."""
        reader, writer = self._reader_task, self._writer
        if writer is not None:
            writer.transport.abort()
        self._connection_lost(reason)
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()

    async def _teardown(self) -> None:
        """Close the socket and stop the reader of the current connection (no reconnect)."""
        task, writer, watch = self._reader_task, self._writer, self._watch_task
        self._reader_task, self._writer, self._conn, self._watch_task = None, None, None, None
        if watch is not None and watch is not asyncio.current_task():
            await _cancel_and_wait(watch)
        if writer is not None:
            writer.close()
        if task is not None and task is not asyncio.current_task():
            await _cancel_and_wait(task)
        if writer is not None:
            try:
                await asyncio.wait_for(writer.wait_closed(), 2.0)
            except (OSError, asyncio.TimeoutError) as exc:  # the socket is closed either way
                log.debug("closing the connection to %s:%d: %r", self.host, self.port, exc)

    def _connection_lost(self, reason: str) -> None:
        """Called by the reader when the socket ends: fail pending requests, maybe start reconnecting."""
        self._reader_task = None
        writer, self._writer, self._conn = self._writer, None, None
        self._stop_watch()
        if writer is not None:
            writer.close()
        was_connected = self.state == "connected"
        self._connected.clear()
        self._fail_pending(ClientError(errors.CONNECTION_LOST, f"connection lost: {reason}"))
        if self._closing or not was_connected:
            return
        if self.reconnect_enabled and self._ever_connected:
            self.state = "reconnecting"
            self._reconnect_task = asyncio.create_task(self._reconnect_loop(reason), name="nplt-client-reconnect")
        else:
            self.state = "disconnected"
            self._reconnect_task = asyncio.create_task(
                self._give_up(errors.CONNECTION_LOST, f"connection lost: {reason}"))

    async def _reconnect_loop(self, reason: str) -> None:
        attempt = 0
        error = reason
        while not self._closing:
            attempt += 1
            if self.backoff.max_attempts is not None and attempt > self.backoff.max_attempts:
                await self._give_up(errors.CONNECTION_LOST, f"gave up after {attempt - 1} attempts: {error}")
                return
            delay = self.backoff.delay(attempt)
            await self._queue.put(Reconnecting(attempt, round(delay, 3), error))
            await asyncio.sleep(delay)
            try:
                await self._establish()
            except ClientError as exc:
                error = exc.message
                if exc.code in errors.PERMANENT_CODES:
                    await self._give_up(exc.code, exc.message)
                    return
                continue
            return

    async def _give_up(self, code: str, message: str) -> None:
        self.state = "disconnected"
        await self._queue.put(Disconnected(code, message))
        self._queue.close()

    # -- requests -------------------------------------------------------------------------------------
    async def _request(self, msg_type: MsgType, body: dict[str, Any], timeout: float | None) -> Reply:
        rid = next(self._ids)
        body["id"] = rid
        if msg_type == MsgType.HELLO:
            self._hello_id = rid
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[rid] = (msg_type, fut)
        try:
            await self._send(msg_type, body)
            return await asyncio.wait_for(fut, timeout if timeout is not None else self.request_timeout)
        except asyncio.TimeoutError as exc:
            raise ClientError(errors.TIMEOUT, f"no reply to {msg_type.name} within the timeout") from exc
        finally:
            self._pending.pop(rid, None)

    async def _send(self, msg_type: MsgType | int, body: dict[str, Any]) -> None:
        conn, writer = self._conn, self._writer
        if conn is None or writer is None or writer.is_closing():
            raise ClientError(errors.NOT_CONNECTED, "not connected")
        try:
            writer.write(conn.send(msg_type, body))  # one write: the frames of a message stay contiguous
            await writer.drain()
        except ProtocolError as exc:
            raise ClientError(exc.code, exc.message) from exc
        except (ConnectionError, OSError) as exc:
            raise ClientError(errors.CONNECTION_LOST, f"send failed: {_why(exc)}") from exc

    def _fail_hello(self, error: ClientError) -> bool:
        """Fail the HELLO still waiting for its reply with ``error``; False when there is none."""
        pending = self._pending.get(self._hello_id) if self._hello_id is not None else None
        if pending is None or pending[0] != MsgType.HELLO or pending[1].done():
            return False
        pending[1].set_exception(error)
        return True

    def _fail_pending(self, error: ClientError) -> None:
        pending, self._pending = self._pending, {}
        for _, fut in pending.values():
            if not fut.done():
                fut.set_exception(error)
                fut.exception()  # mark retrieved: the waiter may already be gone

    # -- reading --------------------------------------------------------------------------------------
    async def _read_loop(self, reader: asyncio.StreamReader, conn: Connection) -> None:
        """Read and dispatch until the connection ends. Before the HELLO reply, a plain connection
        answered with TLS fails the HELLO with TLS_ERROR, and one closed without a byte with
        ``_Dropped`` (``_establish`` tries once more, then says the server expects TLS)."""
        reason = "closed by the server"
        heard = False
        try:
            while True:
                try:
                    data = await reader.read(READ_CHUNK)
                except (ConnectionError, OSError) as exc:
                    reason = _why(exc)
                    break
                if not data:
                    break
                if self._conn is conn:
                    self._last_rx = asyncio.get_running_loop().time()
                if not heard:
                    heard = True
                    if self.tls is None and _tls_record(data) and self._fail_hello(ClientError(
                            errors.TLS_ERROR, f"{self.host}:{self.port} answered in TLS: {EXPECTS_TLS}")):
                        reason = "the server speaks TLS"
                        break
                try:
                    items = conn.receive_data(data)
                except ProtocolError as exc:
                    for item in getattr(exc, "events", None) or ():
                        await self._dispatch(item)
                    reason = f"protocol error {exc.code}: {exc.message}"
                    break
                self._dispatching = True     # (waits while the event queue is full: our stall, not the server's)
                try:
                    for item in items:
                        await self._dispatch(item)
                finally:
                    self._dispatching = False
                    if self._conn is conn:
                        self._last_rx = asyncio.get_running_loop().time()
        finally:
            if not heard and self.tls is None and not self._closing:
                self._fail_hello(_Dropped(f"{self.host}:{self.port} closed the connection without answering "
                                          f"HELLO: {EXPECTS_TLS}, or it is out of resources (its log may say "
                                          f"'Too many open files'), or it is not an NPLT server"))
            if not self._closing and self._reader_task is asyncio.current_task():
                self._connection_lost(reason)

    async def _dispatch(self, item: Any) -> None:
        if isinstance(item, InvalidMessage):
            await self._on_invalid(item)
            return
        mtype = item.type
        tap = self.taps.get(mtype)
        if mtype in BINARY_TYPES:
            if tap is not None:
                tap(item.body)
            return          # (without a tap: data frames of a transfer nobody waits for, given up)
        body = item.body if isinstance(item.body, dict) else {}
        if mtype in (MsgType.RESPONSE, MsgType.PONG, MsgType.ERROR):
            await self._on_reply(mtype, body)
        elif mtype == MsgType.PING:
            try:
                await self._send(MsgType.PONG, {"re": body.get("id"), "time": _now()})
            except ClientError as exc:  # the connection is going away: the reader sees it next
                log.debug("PONG not sent: %s", exc)
        elif mtype in EVENT_TYPES:
            try:
                event = decode_event(mtype, body)
            except ProtocolError as exc:
                log.warning("invalid %s from the server: %s", MsgType(mtype).name, exc.message)
                await self._queue.put(InvalidFrame(exc.code, f"{MsgType(mtype).name}: {exc.message}"))
                return
            if tap is not None and tap(event) is not False:
                return
            self._follow_session_event(event)
            await self._queue.put(event)  # type: ignore[arg-type]
        else:
            log.warning("unexpected %s from the server, ignored", MsgType(mtype).name)

    def _follow_session_event(self, event: Any) -> None:
        """Our session deleted or purged elsewhere: the server moved this connection to the user's newest
        remaining session (or left it without one, docs/protocol.md §5.2) without naming it, so a
        reconnect must not ask for the deleted one; without a session id HELLO attaches to the newest,
        and the next reply that names a session (``chat_send``, a switch) is tracked again."""
        if isinstance(event, SessionEvent) and event.kind in ("deleted", "purged") \
                and event.session.session_id == self.session_id:
            self.session_id = None

    async def _on_invalid(self, item: InvalidMessage) -> None:
        err = item.error
        hello = self._pending.get(self._hello_id) if self._hello_id is not None else None
        if item.type == MsgType.CHAT_TEXT and hello is not None and not hello[1].done() \
                and hello[0] == MsgType.HELLO:   # v2 text before the HELLO reply: taken for a v2 client
            hello[1].set_exception(ClientError(errors.SERVED_AS_V2, "the server took this connection for a "
                                               "v2 client (the HELLO came after its grace period)"))
            return
        pending = self._pending.get(item.re) if item.re is not None else None
        if pending is not None and not pending[1].done():
            pending[1].set_exception(ClientError(err.code, err.message))
        else:
            await self._queue.put(InvalidFrame(err.code, err.message))
        if err.code == ErrorCode.UNKNOWN_TYPE:
            try:
                await self._send(MsgType.ERROR, ErrorReply(ErrorCode.UNKNOWN_TYPE,
                                                           f"unknown type code {item.type}").encode())
            except ClientError as exc:  # the connection is going away: the reader sees it next
                log.debug("UNKNOWN_TYPE error not sent: %s", exc)

    async def _on_reply(self, mtype: MsgType, body: dict[str, Any]) -> None:
        """A RESPONSE, PONG or ERROR: settle the pending request it answers (or report the ERROR)."""
        re = body.get("re")
        pending = self._pending.get(re) if re is not None and not isinstance(re, (dict, list)) else None
        if pending is None or pending[1].done():
            if mtype == MsgType.ERROR:
                try:
                    err = ErrorReply.decode(body)
                except ProtocolError as exc:
                    await self._queue.put(InvalidFrame(exc.code, f"ERROR: {exc.message}"))
                    return
                tap = self.taps.get(MsgType.ERROR)    # (an upload taking the refusal of its bytes)
                if tap is not None and tap(err) is not False:
                    return
                await self._queue.put(ServerError(err))
            else:
                log.debug("%s for no pending request (re=%r), ignored", mtype.name, re)
            return
        request, fut = pending
        try:
            reply = decode_reply(request, mtype, body)
        except ProtocolError as exc:
            fut.set_exception(ClientError(exc.code, f"invalid reply to {request.name}: {exc.message}"))
            return
        if isinstance(reply, ErrorReply):
            fut.set_exception(ClientError(reply.code, reply.message, reply.fatal))
            return
        if re == self._hello_id and isinstance(reply, HelloReply):
            await self._on_hello(reply)
        fut.set_result(reply)
