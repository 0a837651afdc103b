"""ServerConnection: one client connection (asyncio.Protocol) around the sans-IO protocol.Connection.

Its life is the state machine of ``server.conn_state`` (grace, handshaking, ready, legacy, refused,
closing, closed); ``ready``, ``closing`` and ``rejected`` are read from the state. It holds, by
composition: the codec, an ``OutputBuffer`` (``server.output``: batching, back-pressure,
SLOW_CONSUMER), a ``V3Port`` (``server.v3_port``: the send port and hub subscriber handed to
handlers inside a ``RequestContext``), a ``Dispatcher`` (``server.handlers.dispatch``: the one v3
table) and a ``RequestQueue`` (``server.request_queue``: one request at a time, none started while
the output is over its high-water mark), or, for a v2 client, the ``LegacyV2`` adapter.

``data_received`` feeds the codec and hands each decoded message on without awaiting. Once the
handshake is done, well-formed PINGs are answered by the codec itself (``receive_and_pong``: no
event, no task, PONG bytes straight into the write batch); likewise, on a v2 connection whose request
worker is idle with nothing queued, the heartbeats at the head of a read (``receive_and_heartbeat``).

The version is known from the first byte: a v3 client's first frame is HELLO (0x20), anything else
is a legacy v2 client, served at once by ``server.legacy_v2`` (never sent a v3 type code); a
connection that sends nothing for ``legacy_grace_ms`` is v2 too. Timers: that grace period, the
handshake timeout, and idle detection with a server PING after ``ping_interval_s`` of silence.
Only complete messages count as activity (a frame trickled byte by byte, or a fragmented message
never finished, does not); for v2 connections, which cannot be pinged, so do frames sent to them,
and the ACK progress of a UDP download they asked for (``V2Files.note_activity`` sets ``last_rx``).
After the client's EOF (plain TCP) what it sent is still answered, then the connection is closed.

The admin slot (``server.conn_limits``): with an admin user configured, a connection arriving when
every slot is taken is not refused at once but kept on *standby* (counted against
``max_clients_per_ip`` only) for ``standby_timeout_s``: a v3 client's HELLO is read, and an admin's
takes the place of the oldest connection still in its handshake (``AdminSlot.make_room``, the
server's); anything else is refused. So an anonymous socket that never finishes its HELLO cannot
keep the operator out, however often it reconnects. Likewise for ``max_clients_per_ip``: a connection
from an address at its limit is kept on standby until its first read (``legacy_grace_ms`` at most,
as a refused one is), which must bring a whole HELLO (else it is refused at once); that HELLO is
checked (``IP_STANDBY`` at a time per address), and an admin's gets in, closing that address's oldest
connection still in its handshake when the address already has ``max_clients_per_ip +
IP_ADMIN_EXTRA`` (``_room_from_ip``). Sockets that never finish their HELLO hold no place an admin
needs, however many and however often they reconnect.

A connection that closes having held a large output backlog (``TRIM_OUTPUT_BYTES``: a client that
pipelined exports and never read them) asks for a ``malloc_trim`` (``InputBudget.trim_soon``), so
the memory its replies took is given back to the system once it is gone.

One read can bring 256 KiB: thousands of pipelined requests. Received bytes are fed to the codec
under the server-wide per-iteration budget of ``server.rx_budget`` (``RX_SLICE_BYTES`` per turn,
round-robin); what waits stays as bytes in ``_rx_backlog`` (not as decoded messages, which the
garbage collector would have to walk) with the connection's reading paused, so floods on many
connections at once cannot hold the loop for seconds (issue 15, item 9).
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, Callable

import orjson

from protocol import (FATAL_CODES, TLS_ON_PLAIN_PORT, ErrorCode, InvalidMessage, Message, MsgType, ProtocolError,
                      ProtocolVersion, Role, encode_frame, looks_like_tls)
from protocol import Connection as Codec
from protocol.messages import Hello, request_id
from protocol.objects import ClientInfo
from protocol.replies import ErrorReply
from server import conn_state
from server.conn_state import ConnState
from server.conn_input import InputWatch
from server.conn_limits import (FULL, IP_ADMIN_EXTRA, IP_STANDBY, STOPPING, TRIM_OUTPUT_BYTES, AdminSlot, count_from,
                                full_text, peer_ip, per_ip_text, refusal_frame, regular_clients)
from server.context import RequestContext
from server.errors import HandlerError
from server.handlers.dispatch import Dispatcher, run_handler
from server.handlers.hello import authenticate, handle_hello, parse_hello
from server.legacy_v2 import LegacyV2
from server.output import OutputBuffer
from server.request_queue import RequestQueue
from server.rx_budget import RX_SLICE_BYTES, SMALL_READ_BYTES
from server.services import Services
from server.timeutil import iso_at
from server.timeutil import pong_clock as _pong_clock
from server.v3_port import V3Port
from server.wire import encode_reply

log = logging.getLogger("nplt.conn")

_PING, _PONG, _HELLO, _ERROR = int(MsgType.PING), int(MsgType.PONG), int(MsgType.HELLO), int(MsgType.ERROR)
_CHAT_TEXT = int(MsgType.CHAT_TEXT)
_STANDBY_REFUSALS = (ErrorCode.SERVER_FULL, ErrorCode.TOO_MANY_CONNECTIONS)   # (what _join raises, but AUTH_FAILED)
_UPLOAD_DATA = int(MsgType.KB_UPLOAD_DATA)
_GRACE, _HANDSHAKING, _READY, _LEGACY, _REFUSED, _CLOSING, _CLOSED = ConnState
_dumps = orjson.dumps
_PROTO = {ProtocolVersion.V3: "v3", ProtocolVersion.V2: "v2", ProtocolVersion.UNKNOWN: None}


class ServerConnection(asyncio.Protocol):
    """One TCP (or TLS) connection: v3 requests/replies/events, or a legacy v2 session.

    ``refuse_reason()`` is asked when the transport is made: a reason to refuse the client (over
    max_clients, stopping) or None. ``admin_slot`` (the server's, when an admin user is configured)
    keeps the connections on standby, and is asked when an admin's HELLO arrives on one.
    """

    # slots: CPython 3.11 gives up its shared-key instance dicts past 30 attributes, and the
    # per-read attribute loads of the PING path then go through dict lookups (bench/roundtrip.py)
    __slots__ = ("services", "limits", "loop", "conn_id", "state", "codec", "transport", "peer", "ip",
                 "admin", "started", "_clock", "_rx", "_receiver", "_pong_one", "_heartbeat_one", "input",
                 "output", "port", "ctx", "dispatcher", "requests", "legacy", "_refuse_reason", "_refusal",
                 "_hello", "_early", "_rx_backlog", "_rx_off", "_eof", "_eof_error", "_tls", "_grace",
                 "_handshake", "_idle", "last_rx", "_ping_sent", "_pings", "_admin_slot", "_standby",
                 "_standby_ip", "_out_peak", "__weakref__")

    def __init__(self, services: Services, conn_id: int, refuse_reason: Callable[[], str | None],
                 admin_slot: AdminSlot | None = None) -> None:
        self.services = services
        self.limits = services.config.limits
        self.loop = asyncio.get_running_loop()
        self.conn_id = conn_id
        self.state = _GRACE
        self.codec = Codec(Role.SERVER, max_message_size=self.limits.max_message_size)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.ip = "?"
        self.admin = False            # HELLO accepted for an admin user (who may hold the admin slot)
        self.started = self.loop.time()
        # the hot path's clock: loop.time() itself unless it is time.monotonic (asyncio's own loop)
        self._clock = time.monotonic if type(self.loop).time is asyncio.BaseEventLoop.time else self.loop.time
        self._rx = services.rx
        self._receiver = self.codec.receiver
        self._pong_one = self.codec.pong_one
        self._heartbeat_one = self.codec.heartbeat_one
        self.input = InputWatch(self.codec, services.input_budget, self.limits, self.loop,
                                self._on_message_timeout, str(conn_id))
        self.output = OutputBuffer(self.loop, self.limits.max_output_buffer, self._on_slow, str(conn_id))
        self.port = V3Port(self.codec, self.output, self.limits.max_message_size, str(conn_id))
        self.ctx = RequestContext(services, self.port)
        self.dispatcher = Dispatcher(self.ctx, self.port, self.loop)
        self.requests = RequestQueue(self.dispatcher, self._may_start, self.requests_done)
        self.legacy: LegacyV2 | None = None
        self._refuse_reason = refuse_reason
        self._admin_slot = admin_slot
        self._standby = False         # arrived with every slot taken: uncounted until an admin's HELLO
        self._standby_ip = False      # ... or with its address at max_clients_per_ip (IP_STANDBY)
        self._out_peak = 0            # the largest output backlog seen (TRIM_OUTPUT_BYTES)
        self._refusal = (ErrorCode.SERVER_FULL, "", "")  # what a REFUSED connection is told (v3, v2)
        self._hello: asyncio.Task | None = None     # the HELLO being answered
        self._early: list[Message] = []              # requests pipelined behind it
        self._rx_backlog: bytes | None = None        # a read over RX_SLICE_BYTES, fed from _rx_off on
        self._rx_off = 0
        self._eof = False             # the client half-closed: answer what it sent, then close
        self._eof_error: str | None = None  # ... and it did so in the middle of a message
        self._tls = False
        self._grace: asyncio.Handle | None = None     # the grace timer, then its two hops
        self._handshake: asyncio.TimerHandle | None = None
        self._idle: asyncio.TimerHandle | None = None
        self.last_rx = self.loop.time()   # when the last complete message arrived
        self._ping_sent = False
        self._pings = 0

    # -- state ---------------------------------------------------------------------------------------
    def _set(self, new: ConnState) -> None:
        self.state = conn_state.check(self.state, new)

    @property
    def ready(self) -> bool:
        """v3 and HELLO accepted."""
        return self.state is _READY

    @property
    def closing(self) -> bool:
        return self.state is _CLOSING or self.state is _CLOSED

    @property
    def rejected(self) -> bool:
        return self.state is _REFUSED

    @property
    def in_handshake(self) -> bool:
        """Counted, and no HELLO accepted yet (nor decided v2): what an admin's HELLO may displace."""
        return (self.state is _GRACE or self.state is _HANDSHAKING) and not self._standby

    @property
    def pending(self) -> dict[Any, asyncio.Future]:
        """Requests in flight (running, or held by the RequestQueue), by id."""
        return self.dispatcher.pending

    @property
    def subscriber(self) -> Any:
        """What the hub knows this connection as: the v2 adapter or the v3 port."""
        return self.legacy if self.legacy is not None else self.port

    # -- admin (server.handlers.admin.Client) --------------------------------------------------------
    def info(self, me: bool) -> ClientInfo:
        """This connection as CLIENT_LIST shows it."""
        now = self.loop.time()
        sub = self.subscriber
        tr = self.transport
        unsent = self.output.size + (tr.get_write_buffer_size() if tr is not None and not tr.is_closing() else 0)
        return ClientInfo(self.conn_id, self.peer, sub.user_id, sub.session_id, self.state.value,
                          _PROTO[self.codec.version], round(now - self.started, 3), round(now - self.last_rx, 3),
                          self.codec.bytes_buffered, unsent, me)

    def kill(self, by: str) -> None:
        """CLIENT_KILL: v3 clients get ERROR CLIENT_KILLED (fatal), v2 clients a last CHAT_TEXT."""
        if self.closing:
            return
        if self.legacy is not None:
            self.legacy.send_text("Connection closed by an administrator.")
            self.close()
        else:
            self.fatal(ErrorCode.CLIENT_KILLED, f"connection closed by an administrator ({by})")

    # -- V2Host (server.legacy_v2) -------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        self.output.write(data)

    def pause_reading(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and self._rx_backlog is None:
            self.transport.resume_reading()

    # -- asyncio.Protocol ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.output.attach(transport)  # type: ignore[arg-type]
        self._tls = transport.get_extra_info("sslcontext") is not None
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.ip = peer_ip(peer)
        svc = self.services
        grace = svc.config.server.legacy_grace_ms / 1000
        reason = self._refuse_reason()
        slot = self._admin_slot
        standby = reason == FULL and slot is not None
        if reason is not None:
            self._refusal = (ErrorCode.SERVER_FULL, f"the server is full ({self.limits.max_clients} clients)",
                             full_text(self.limits.max_clients) if reason != STOPPING else "Server is shutting down.")
        if reason is None or standby:
            per_ip = self.limits.max_clients_per_ip
            if per_ip and count_from(svc.connections, self.ip) + (
                    count_from(slot.waiting, self.ip) if slot is not None else 0) >= per_ip:
                self._refusal = (ErrorCode.TOO_MANY_CONNECTIONS,
                                 f"too many connections from {self.ip} (max_clients_per_ip = {per_ip})",
                                 per_ip_text(self.ip, per_ip))
                if slot is not None:   # its first read may be an admin's HELLO (_on_v3, _receive)
                    standby = self._standby_ip = True
                else:
                    reason, standby = "max_clients_per_ip reached", False
        if standby:   # only an admin's HELLO, within standby_timeout_s, gets it a slot
            self._standby = True
            slot.waiting.add(self)   # type: ignore[union-attr]
            log.debug("connection %s from %s on standby (%s)", self.conn_id, self.peer,
                      "max_clients_per_ip reached" if self._standby_ip else "every slot taken")
            self._grace = self.loop.call_later(grace, self._on_grace)
            # (from the accept: with TLS, ``started`` is the TCP accept's, the handshake included)
            self._handshake = self.loop.call_at(self.started + self.limits.standby_s,
                                                self._on_handshake_timeout)
            return
        if reason is not None:
            self._set(_REFUSED)
            svc.counters.refusals.note(self.conn_id, self.peer, reason)
            self._grace = self.loop.call_later(grace, self._on_grace)   # silent: refused as a v2 client
            return
        svc.connections.add(self)
        log.debug("connection %s from %s", self.conn_id, self.peer)
        self._grace = self.loop.call_later(grace, self._on_grace)
        self._handshake = self.loop.call_later(self.limits.handshake_timeout_s, self._on_handshake_timeout)

    def _ip_place(self) -> bool:
        """A HELLO on standby over ``max_clients_per_ip`` may be checked: fewer than ``IP_STANDBY``
        of its address's are being checked (or held: a failed login answered late, in back-off)."""
        slot = self._admin_slot
        return slot is not None and sum(
            1 for w in slot.waiting if type(w) is ServerConnection and w._standby_ip and w.ip == self.ip
            and w._hello is not None and not w.closing) < IP_STANDBY

    def data_received(self, data: bytes) -> None:
        if len(data) <= SMALL_READ_BYTES and self._rx_backlog is None:  # handled at once, outside the budget
            output = self.output
            # the hottest paths: a read that is one PING (v3) or one heartbeat (v2, its worker idle),
            # answered straight to the transport when nothing waits to be sent before the reply and
            # the transport takes more. (The input side needs no test: the codec answers only when
            # no message is in progress, and then InputWatch holds nothing, as after_read left it.)
            if not output.out and not output.paused and not output.stopped:
                state = self.state
                reply = None
                if state is _READY:
                    if data[0] == _PING:
                        clock, pong_one = self._clock, self._pong_one   # (slots: a call through a local)
                        now = clock()
                        cached = _pong_clock                             # (when, its ISO time)
                        reply = pong_one(data, cached[1] if 0.0 <= now - cached[0] < 0.001 else iso_at(now))
                elif state is _LEGACY and data[0] == _CHAT_TEXT and self._handshake is None:
                    legacy = self.legacy
                    if legacy.idle and legacy.queue.empty():  # type: ignore[union-attr]
                        reply = self._heartbeat_one(data)
                        now = self._clock()
                if reply is not None:
                    self.last_rx = now
                    self._ping_sent = False
                    output.transport.write(reply)   # type: ignore[union-attr]
                    return
            self._receive(data)
            return
        if self._rx_backlog is not None:   # (reading is paused: only bytes already in flight)
            self._rx_backlog = self._rx_backlog[self._rx_off:] + data
            self._rx_off = 0
            return
        rx = self._rx
        if not rx.room(len(data)) or len(data) > RX_SLICE_BYTES:   # (part of) it waits its turn
            now = 0 if not rx.room(len(data)) else RX_SLICE_BYTES
            self._rx_backlog, self._rx_off = data, now
            if self.transport is not None:
                self.transport.pause_reading()
            rx.wait(self)
            if not now:
                return
            data = data[:now]
        rx.charge(len(data))
        self._receive(data)

    def rx_step(self) -> bool:
        """Feed the next RX_SLICE_BYTES of the backlog (``server.rx_budget`` calls it); True while more
        waits. Reading resumes once it is empty (unless the output is over its high-water mark)."""
        backlog, off = self._rx_backlog, self._rx_off
        if backlog is None:
            return False
        if self.closing:
            self._rx_backlog = None
            return False
        end = off + RX_SLICE_BYTES
        if end >= len(backlog):
            self._rx_backlog = None
        else:
            self._rx_off = end
        piece = backlog[off:end]
        self.services.rx.charge(len(piece))
        self._receive(piece)
        if self._rx_backlog is not None:
            return True
        if not self.closing and not self.output.paused:
            self.resume_reading()
        return False

    def _receive(self, data: bytes) -> None:
        state = self.state
        hot = state is _READY  # handshake done (v3): the codec answers well-formed PINGs itself
        if not hot:
            if state is _CLOSING or state is _CLOSED:
                return
            if state is _REFUSED:
                self._refuse(data)
                return
            if state is _GRACE:
                if data[0] == _HELLO:
                    self._cancel_grace()
                    self._set(_HANDSHAKING)
                elif looks_like_tls(data):  # `--tls` against a plain port: not a v2 SESSION_NEW
                    self.fatal(ErrorCode.UNSUPPORTED, TLS_ON_PLAIN_PORT)
                    return
                else:  # not a HELLO: a v2 client, whatever follows
                    self.codec.set_legacy()
                    self._start_legacy()
                    if self.closing:  # over max_clients: the admin slot is not for v2
                        return
        output = self.output
        output.in_rx = True  # replies written meanwhile go out in one write at the end
        out = output.out
        n_out = len(out)
        try:
            legacy = self.legacy
            try:
                if hot:
                    events = self.codec.receive_and_pong(data, iso_at(self._clock()), out)
                elif legacy is not None and legacy.idle and legacy.queue.empty():
                    # v2, nothing queued or running: leading heartbeats are answered by the codec
                    events = self.codec.receive_and_heartbeat(data, out)
                else:
                    events = self.codec.receive_data(data)
            except ProtocolError as exc:
                self._handle(exc.events)
                self.fatal(exc.code, exc.message)
                return
            completed = bool(events) or len(out) != n_out
            if completed:  # a complete message (PONGs/heartbeats in out) arrived
                self.last_rx = self._clock()
                self._ping_sent = False
                if legacy is not None:
                    if self._handshake is not None:
                        self._handshake.cancel()  # a v2 client, not a silent socket
                        self._handshake = None
                    if not events:  # only heartbeats answered: sent like PONGs (last_rx is now)
                        hot = True
            inp = self.input  # partial input: counted server-wide, timed (message_timeout_s)
            if inp.counted or inp.started is not None or self._receiver.in_message:  # (InputWatch.busy inline)
                inp.after_read(completed)
            if events:
                self._handle(events)
            if self._standby_ip and self._hello is None and not self.closing:
                # over max_clients_per_ip, its first read brought no whole HELLO: refused now, so
                # that sockets that never finish theirs hold nothing (an admin's comes in one read)
                self.services.counters.refusals.note(self.conn_id, self.peer, "max_clients_per_ip reached")
                self.fatal(*self._refusal[:2])
        finally:
            output.end_rx(hot)

    def eof_received(self) -> bool | None:
        """The client will send nothing more: answer what it sent, then close (plain TCP only)."""
        if self.closing or self.rejected:
            return None
        self._eof = True
        if self.codec.bytes_buffered:  # (not fed to the codec: that would close it for sending too)
            self._eof_error = (f"the client closed the connection in the middle of a message "
                               f"({self.codec.bytes_buffered} bytes of it received)")
        if self._tls:  # asyncio's TLS transport cannot stay half-open
            return None
        if self.legacy is not None:
            self.legacy.stop()  # its worker ends after the requests already queued
            worker = self.legacy.worker
            if worker is None or worker.done():
                self._close_after_eof()
            else:
                worker.add_done_callback(lambda _t: self._close_after_eof())
            return True
        self.requests_done()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state is not _CLOSED:
            self._set(_CLOSED)
        for timer in (self._grace, self._handshake, self._idle):
            if timer is not None:
                timer.cancel()
        self._note_backlog()
        self.output.stop()
        self.output.discard()
        self.requests.drop()
        self.codec.close()        # partial input is given back now, not when a gc cycle finds us
        self.input.release()
        if self._out_peak >= TRIM_OUTPUT_BYTES:   # the memory its replies took goes back to the system
            self.services.input_budget.trim_soon()
        self._early.clear()
        svc = self.services
        svc.connections.discard(self)
        if self._admin_slot is not None:
            self._admin_slot.waiting.discard(self)
        svc.hub.remove(self.subscriber)
        svc.uploads.detach_port(self.port)
        if self.legacy is not None:
            self.legacy.abort()
        log.debug("connection %s closed%s", self.conn_id, f": {exc}" if exc else "")

    def pause_writing(self) -> None:
        self.output.paused = True
        self._note_backlog()
        if not self.closing:
            self.pause_reading()

    def resume_writing(self) -> None:
        self.output.resumed()
        if not self.closing:
            self.resume_reading()
            self.requests.resume()

    # -- incoming ------------------------------------------------------------------------------------
    def _handle(self, events: list) -> None:
        if self.legacy is not None:
            if self._handshake is not None:  # its first message: a v2 client, not a silent socket
                self._handshake.cancel()
                self._handshake = None
            self.legacy.on_events(events)
            return
        for ev in events:
            if self.closing:
                return
            self._on_v3(ev)

    def _on_v3(self, ev: Message | InvalidMessage) -> None:
        if type(ev) is InvalidMessage:
            self.port.send_error(ev.re, ev.error.code, ev.error.message)
            return
        t = ev.type
        if self.state is not _READY:
            if self._hello is not None:
                if len(self._early) >= self.limits.max_pending_requests:
                    self.port.send_error(request_id(ev.body), ErrorCode.TOO_MANY_PENDING,
                                         "too many requests sent before the HELLO reply")
                else:
                    self._early.append(ev)
            elif t == _HELLO:
                if self._standby_ip and not self._ip_place():
                    self.services.counters.refusals.note(self.conn_id, self.peer, "max_clients_per_ip reached")
                    self.fatal(*self._refusal[:2], request_id(ev.body))
                    return
                self._hello = self.loop.create_task(self._run_hello(ev))
            else:
                self.fatal(ErrorCode.HANDSHAKE_REQUIRED, "the first request must be a valid HELLO",
                           request_id(ev.body))
            return
        if t == _UPLOAD_DATA:  # raw file bytes: not a request, not queued behind one
            self.services.uploads.on_data(self.port, ev.body, self)
        elif t != _PONG and t != _ERROR:  # a client's PONG or ERROR needs no answer
            self.requests.submit(ev)

    async def _run_hello(self, ev: Message) -> None:
        rid = request_id(ev.body)
        if self.closing:   # (closed before this task ran: timed out, displaced for an admin)
            return
        joining = self._standby
        try:
            req = parse_hello(ev.body)
            if self._standby:
                self._join(req)
        except HandlerError as exc:
            reply, err = None, exc
        else:
            joining = False
            reply, err = await run_handler(handle_hello, self.ctx, req)
        if err is not None:
            if err.code == ErrorCode.AUTH_FAILED:
                self._login_failed(err.message, rid)
                return
            guard = self.services.auth.guard
            if joining and err.code in _STANDBY_REFUSALS and guard.retry_after(self.ip):
                # refused on standby with a right token: from an address in back-off, after the same
                # delay as a wrong one (a guess answered at once would be a guess that was right)
                if self._handshake is not None:
                    self._handshake.cancel()
                self._handshake = self.loop.call_later(guard.delay_s, self.fatal, err.code, err.message, rid)
                return
            self._hello = None
            if err.code == ErrorCode.INTERNAL:
                self.fatal(ErrorCode.INTERNAL, "internal error during HELLO", rid)
            elif err.code in FATAL_CODES:
                self.fatal(err.code, err.message, rid)
            else:
                self.port.send_error(rid, err.code, err.message)
                self._replay_early()
                self.requests_done()
            return
        guard = self.services.auth.guard
        if guard.retry_after(self.ip):
            # an address in back-off has every HELLO answered after the same delay, right tokens too:
            # were only failures delayed, hanging up early would tell a guess was wrong (review s31)
            await asyncio.sleep(guard.delay_s)
        if self.closing:  # the client left while we were answering
            self.services.hub.remove(self.port)
            return
        self.admin = self.services.auth.is_admin(self.port.user_id)
        if self._over_regular_slots():
            self.services.counters.refusals.note(self.conn_id, self.peer, "max_clients reached (admin slot)")
            self.fatal(ErrorCode.SERVER_FULL, self.full_message(), rid)
            return
        self._set(_READY)
        self._hello = None
        if self._handshake is not None:
            self._handshake.cancel()
            self._handshake = None
        self._arm_idle()
        self.port.respond(rid, reply)  # a running turn's text may have to be cut to fit
        self._replay_early()
        self.requests_done()

    def _login_failed(self, message: str, rid: Any) -> None:
        """AUTH_FAILED (fatal), counted against the address (``LoginGuard``). From an address in
        back-off it is sent only after the guard's ``delay_s`` (a tarpit): the connection holds its
        slot meanwhile, so ``max_clients_per_ip`` bounds the guesses an address has in flight. The
        wait is a timer (the HELLO deadline's), cancelled when the connection closes (the client
        leaves, the server stops); ``_hello`` stays set, so nothing sent behind the HELLO is run."""
        guard = self.services.auth.guard
        wait = guard.retry_after(self.ip)
        note = guard.failed(self.ip)
        if not wait:
            self._hello = None
            self.fatal(ErrorCode.AUTH_FAILED, message + note, rid)
            return
        if self._handshake is not None:
            self._handshake.cancel()
        self._handshake = self.loop.call_later(
            guard.delay_s, self.fatal, ErrorCode.AUTH_FAILED,
            f"{message}; too many failed logins from this address: for {math.ceil(wait)} s more its failed "
            f"logins are answered after {guard.delay_s:g} s", rid)

    def _join(self, req: Hello) -> None:
        """A standby connection's HELLO: an admin's takes a slot, made by the server (``make_room``)
        closing the oldest connection still in its handshake when a non-admin holds the admin slot.
        HandlerError for anything else (AUTH_FAILED, SERVER_FULL, TOO_MANY_CONNECTIONS)."""
        svc = self.services
        user = authenticate(svc, req.token)
        slot = self._admin_slot
        admin = slot is not None and svc.auth.is_admin(user)
        per_ip = self.limits.max_clients_per_ip
        live = [c for c in svc.connections if c.ip == self.ip and not c.closing]
        if per_ip and (len(live) >= per_ip or (self._standby_ip and not admin)) and \
                not (admin and self._room_from_ip(live, per_ip)):
            svc.counters.refusals.note(self.conn_id, self.peer, "max_clients_per_ip reached")
            raise HandlerError(ErrorCode.TOO_MANY_CONNECTIONS,
                               f"too many connections from {self.ip} (max_clients_per_ip = {per_ip})")
        if not admin or not slot.make_room(self):   # type: ignore[union-attr]
            svc.counters.refusals.note(self.conn_id, self.peer, "max_clients reached (admin slot)")
            raise HandlerError(ErrorCode.SERVER_FULL, self.full_message())
        self._standby = self._standby_ip = False
        slot.waiting.discard(self)
        svc.connections.add(self)
        if self._handshake is not None:   # the standby deadline becomes the usual HELLO deadline
            self._handshake.cancel()
        self._handshake = self.loop.call_at(self.started + self.limits.handshake_timeout_s,
                                            self._on_handshake_timeout)

    def _room_from_ip(self, live: list[ServerConnection], per_ip: int) -> bool:
        """Whether an admin's HELLO on standby may add a connection from its address, which has ``live``
        (``max_clients_per_ip`` or more): yes while fewer than ``per_ip + IP_ADMIN_EXTRA``, else by
        closing the address's oldest connection still in its handshake (TOO_MANY_CONNECTIONS)."""
        if len(live) < per_ip + IP_ADMIN_EXTRA:
            return True
        waiting = [c for c in live if c.in_handshake]
        if not waiting:
            return False
        victim = min(waiting, key=lambda c: c.started)
        self.services.counters.refusals.note(victim.conn_id, victim.peer, "closed in its handshake to let an "
                                                                          "admin in (max_clients_per_ip)")
        victim.fatal(ErrorCode.TOO_MANY_CONNECTIONS, f"too many connections from {self.ip} (max_clients_per_ip = "
                                                     f"{per_ip}); closed in its handshake to let an admin in")
        return True

    def full_message(self, taken: bool = False) -> str:
        """SERVER_FULL's message when the one slot beyond max_clients is an admin's (``taken``: this
        connection is closed to give it to one)."""
        return (f"the server is full ({self.limits.max_clients} clients; the one slot beyond is reserved "
                f"for an admin{', who needed it' if taken else ''})")

    def _replay_early(self) -> None:
        early, self._early = self._early, []
        for e in early:
            if self.closing:
                break
            self._on_v3(e)

    def _may_start(self) -> bool:
        """Whether new request work may start: not closing, and the output under its high-water mark."""
        return not self.closing and not self.output.paused

    def requests_done(self) -> None:
        """A request was answered: after the client's EOF, close once everything is answered."""
        self._note_backlog()
        if self._eof and not self.closing and self.legacy is None and self._hello is None \
                and not self._early and not self.dispatcher.pending and self.requests.idle:
            self._close_after_eof()

    def _close_after_eof(self) -> None:
        if self._eof_error is not None:
            self.fatal(ErrorCode.CONNECTION_CLOSED, self._eof_error)
        else:
            self.close()

    # -- closing -------------------------------------------------------------------------------------
    def fatal(self, code: ErrorCode, message: str, re: Any = None) -> None:
        """Send ERROR (fatal) when the peer speaks v3, then close. v2 peers just see the close."""
        if self.closing:
            return
        if self.state is _READY or self.state is _LEGACY:
            log.info("connection %s (%s): %s %s", self.conn_id, self.peer, code, message)
        else:   # no HELLO accepted: anyone can cause these lines, so they are logged without flooding
            self.services.auth.guard.log_closed(self.conn_id, self.peer, f"{code} {message}",
                                                login=code == ErrorCode.AUTH_FAILED)
        if self.state is _HANDSHAKING or self.state is _READY:
            payload = _dumps(encode_reply(re, ErrorReply(ErrorCode(code), message, True)))
            if self.codec.closed:  # a fatal receive error closed the codec: frame it by hand
                self.output.out.append(encode_frame(_ERROR, self.codec.tx_seq, payload))
            else:
                self.output.out.append(self.codec.send_raw(_ERROR, payload))
        self.close()

    def close(self) -> None:
        """Flush what is queued and close the transport (which sends what it holds first)."""
        if self.closing:
            return
        self.output.flush()
        if self.closing:  # the flush found the client over its output cap: dropped (SLOW_CONSUMER)
            return
        self._set(_CLOSING)
        self.output.stop()
        self._note_backlog()
        self.requests.drop()
        if self.transport is not None:
            self.transport.close()

    def _note_backlog(self) -> None:
        """Keep the largest output backlog seen (``_out_peak``): the transport's buffer is gone by
        ``connection_lost``, so it is read while the connection lives (here, at ``pause_writing``,
        after each request, at a close or a drop)."""
        n = self.output.unsent
        if n > self._out_peak:
            self._out_peak = n

    def _on_slow(self) -> None:
        """The output buffer dropped the client (it aborts the transport itself)."""
        self.services.counters.slow_consumers += 1
        self._note_backlog()             # (what was held here is discarded already: the transport's)
        if not self.closing:
            self._set(_CLOSING)
        self.requests.drop()

    def shutdown(self) -> None:
        """The server is stopping: tell the client, then close."""
        if self.legacy is not None:
            self.legacy.send_text("Server is shutting down.")
            self.close()
        else:
            self.fatal(ErrorCode.SHUTTING_DOWN, "the server is stopping")

    def _refuse(self, data: bytes) -> None:
        """Over max_clients (SERVER_FULL) or max_clients_per_ip (TOO_MANY_CONNECTIONS), on the first
        read ``data`` (b"": nothing came within the grace period): a v3 client (first byte HELLO) gets
        the ERROR; a v2 client, or a silent one, one CHAT_TEXT saying why (``refusal_frame``); the
        first bytes of a TLS handshake, only the close."""
        frame = refusal_frame(data, *self._refusal)
        if frame:
            self.output.out.append(frame)
        self.close()

    def _refuse_v2(self, text: str) -> None:
        """A connection already served as v2 refused before its welcome (the admin slot is not for
        v2): one CHAT_TEXT saying why, then the close."""
        if not self.codec.closed:
            self.output.out.append(self.codec.send(MsgType.CHAT_TEXT, text.encode()))
        self.close()

    # -- timers --------------------------------------------------------------------------------------
    def _cancel_grace(self) -> None:
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None

    def _on_grace(self) -> None:
        """The grace period is over: decide once the loop has polled the socket again. An event
        loop runs its due timers before it reads (libuv's order, so uvloop's), so after a stall (a
        long GC, a slow callback) the HELLO of a v3 client that connected in time may still wait
        unread. Two call_soon hops run after the next I/O poll on uvloop and on asyncio's loop."""
        self._grace = self.loop.call_soon(self._grace_hop)

    def _grace_hop(self) -> None:
        self._grace = self.loop.call_soon(self._grace_over)

    def _grace_over(self) -> None:
        self._grace = None
        if self.state is _REFUSED:   # refused and silent (as a v2 client is): told why, then closed
            self._refuse(b"")
            return
        if self.state is not _GRACE:
            return
        self.codec.set_legacy()
        self._start_legacy()

    def _over_regular_slots(self) -> bool:
        """This connection is in the admin slot (over max_clients) without being an admin's."""
        conns = self.services.connections
        cap = self.limits.max_clients
        return not self.admin and len(conns) > cap and regular_clients(conns) > cap

    def _start_legacy(self) -> None:
        self._cancel_grace()  # (the handshake timer runs on until a first message)
        if self._standby_ip:
            self.services.counters.refusals.note(self.conn_id, self.peer, "max_clients_per_ip reached")
            self._refuse_v2(self._refusal[2])
            return
        if self._standby or self._over_regular_slots():
            self.services.counters.refusals.note(self.conn_id, self.peer, "max_clients reached (admin slot)")
            self._refuse_v2(full_text(self.limits.max_clients, admin_slot=True))
            return
        self._set(_LEGACY)
        self.legacy = LegacyV2(self, self.services)
        self._arm_idle()
        self.legacy.start()

    def _on_message_timeout(self, message: str) -> None:
        if not self.closing:
            self.fatal(ErrorCode.MESSAGE_TIMEOUT, message)

    def _on_handshake_timeout(self) -> None:
        self._handshake = None
        if self.closing:
            return
        if self.state is _LEGACY:  # v2 by its silence or its first bytes, yet no whole message
            self.services.auth.guard.log_closed(self.conn_id, self.peer, "no message within "
                                                f"{self.limits.handshake_timeout_s:g} s; closed")
            self.close()
        elif self._standby_ip:   # no admin's HELLO in time
            self.services.counters.refusals.note(self.conn_id, self.peer, "max_clients_per_ip reached")
            self.fatal(*self._refusal[:2])
        elif self._standby:
            self.services.counters.refusals.note(self.conn_id, self.peer, "max_clients reached (admin slot)")
            self.fatal(ErrorCode.SERVER_FULL, self.full_message())
        elif self.state is not _READY:
            self.fatal(ErrorCode.HANDSHAKE_TIMEOUT,
                       f"no valid HELLO within {self.limits.handshake_timeout_s:g} s")

    def _arm_idle(self, delay: float | None = None) -> None:
        if delay is None:
            delay = self.limits.ping_interval_s
        self._idle = self.loop.call_later(max(delay, 0.01), self._on_idle)

    def _on_idle(self) -> None:
        self._idle = None
        if self.closing:
            return
        lim = self.limits
        legacy = self.state is _LEGACY
        last = max(self.last_rx, self.output.last_tx) if legacy else self.last_rx
        quiet = self.loop.time() - last
        if quiet >= lim.idle_timeout_s:
            self.fatal(ErrorCode.IDLE_TIMEOUT, f"no message received for {lim.idle_timeout_s:g} s")
            return
        if quiet >= lim.ping_interval_s and not self._ping_sent and not legacy:
            self._pings += 1
            self._ping_sent = True
            self.write(self.codec.send_raw(_PING, _dumps({"id": f"srv-{self._pings}"})))
        if self._ping_sent or legacy:  # (config: ping_interval_s < idle_timeout_s)
            self._arm_idle(lim.idle_timeout_s - quiet)
        else:
            self._arm_idle(lim.ping_interval_s - quiet)
