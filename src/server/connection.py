"""ServerConnection: one client connection (asyncio.Protocol) around the sans-IO protocol.Connection.

``data_received`` feeds the codec and hands each decoded message on without awaiting. Once the
handshake is done, well-formed PINGs are answered by the codec itself (``receive_and_pong``: no
event, no task, PONG bytes straight into the write batch); other v3 requests go to the
connection's RequestQueue (``server.request_queue``: one runs at a time, and none starts while the
output is over its high-water mark). Output, batching and SLOW_CONSUMER: ``server.conn_output``.

The version is known from the first byte: a v3 client's first frame is HELLO (0x20), anything else
is a legacy v2 client, served at once by ``server.legacy_v2`` (never sent a v3 type code); a
connection that sends nothing for ``legacy_grace_ms`` is v2 too. Timers: that grace period, the
handshake timeout, and idle detection with a server PING after ``ping_interval_s`` of silence.
Only complete messages count as activity (a frame trickled byte by byte, or a fragmented message
never finished, does not); for v2 connections, which cannot be pinged, so do frames sent to them.
After the client's EOF (plain TCP) what it sent is still answered, then the connection is closed.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import orjson

from protocol import (FATAL_CODES, ErrorCode, InvalidMessage, Message, MsgType, ProtocolError,
                      ProtocolVersion, Role, encode_frame)
from protocol import Connection as Codec
from protocol.messages import request_id
from server.conn_output import FLUSH_BYTES, HIGH_WATER, OutputMixin
from server.errors import HandlerError, server_full_frame
from server.handlers.dispatch import send_response
from server.handlers.hello import handle_hello
from server.legacy_v2 import LegacyV2
from server.request_queue import RequestQueue
from server.timeutil import iso_now

if TYPE_CHECKING:  # pragma: no cover
    from server.app import Server

log = logging.getLogger("nplt.conn")

_PING, _PONG, _HELLO, _ERROR = int(MsgType.PING), int(MsgType.PONG), int(MsgType.HELLO), int(MsgType.ERROR)
_RESPONSE = int(MsgType.RESPONSE)
_UNKNOWN, _V2, _V3 = ProtocolVersion.UNKNOWN, ProtocolVersion.V2, ProtocolVersion.V3
_dumps = orjson.dumps


class ServerConnection(OutputMixin, asyncio.Protocol):
    """One TCP (or TLS) connection: v3 requests/replies/events, or a legacy v2 session."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.limits = server.config.limits
        self.loop = server.loop
        self.codec = Codec(Role.SERVER, max_message_size=self.limits.max_message_size)
        self.conn_id = server.next_conn_id()
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.user_id: str | None = None
        self.session_id: str | None = None
        self.legacy: LegacyV2 | None = None
        self.requests = RequestQueue(self)
        self.ready = False            # v3 HELLO accepted
        self.closing = False
        self.rejected = False         # over max_clients: answer SERVER_FULL and close
        self.pending: dict[Any, asyncio.Future] = {}
        self._hello_busy = False
        self._early: list[Message] = []
        self._first: int | None = None  # the first byte received (HELLO = a v3 client)
        self._eof = False             # the client half-closed: answer what it sent, then close
        self._eof_error: str | None = None  # ... and it did so in the middle of a message
        self._tls = False
        self._out: list[bytes] = []
        self._out_size = 0
        self._flush_bytes = min(FLUSH_BYTES, self.limits.max_output_buffer // 2)
        self._flush_handle: asyncio.Handle | None = None
        self._in_rx = False
        self._hot = False             # ready v3 connection: data_received takes its short path
        self._write_paused = False    # between pause_writing and resume_writing
        self._grace: asyncio.TimerHandle | None = None
        self._handshake: asyncio.TimerHandle | None = None
        self._idle: asyncio.TimerHandle | None = None
        self.last_rx = self.loop.time()   # when the last complete message arrived
        self.last_tx = 0.0                # v2 only: when we last sent it something
        self._ping_sent = False
        self._pings = 0

    # -- asyncio.Protocol ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        high = min(HIGH_WATER, self.limits.max_output_buffer)  # backlog over the cap => paused
        transport.set_write_buffer_limits(high=high, low=high // 4)  # type: ignore[attr-defined]
        self._tls = transport.get_extra_info("sslcontext") is not None
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        srv = self.server
        grace = srv.config.server.legacy_grace_ms / 1000
        if srv.stopping or len(srv.connections) >= self.limits.max_clients:
            self.rejected = True
            srv.refusals.note(self.conn_id, self.peer, "shutting down" if srv.stopping else "max_clients reached")
            self._grace = self.loop.call_later(grace, self.close)
            return
        srv.connections.add(self)
        log.debug("connection %s from %s", self.conn_id, self.peer)
        self._grace = self.loop.call_later(grace, self._on_grace)
        self._handshake = self.loop.call_later(self.limits.handshake_timeout_s, self._on_handshake_timeout)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        hot = self._hot  # handshake done (v3): the codec answers well-formed PINGs itself
        if not hot:
            if self.rejected:
                self._refuse(data)
                return
            if self._first is None:
                self._first = data[0]
                if data[0] != _HELLO and self.codec.version is _UNKNOWN:
                    self.codec.set_legacy()  # not a HELLO: a v2 client, whatever follows
                    self._start_legacy()
        self._in_rx = True  # replies written meanwhile go out in one write at the end
        out = self._out
        n_out = len(out)
        try:
            try:
                events = self.codec.receive_and_pong(data, iso_now(), out) if hot else \
                    self.codec.receive_data(data)
            except ProtocolError as exc:
                self._handle(exc.events)
                self.fatal(exc.code, exc.message)
                return
            if events or len(out) != n_out:  # a complete message (PONGs in out: PINGs) arrived
                self.last_rx = self.loop.time()
                self._ping_sent = False
                if events:
                    self._handle(events)
        finally:
            self._in_rx = False
            if out and not self.closing:
                if not hot or self._write_paused or self._flush_handle is not None:
                    self._flush()   # with the backlog check
                else:               # the transport's buffer is under its high-water mark
                    self.transport.write(out[0] if len(out) == 1 else b"".join(out))  # type: ignore[union-attr]
                    out.clear()
                    self._out_size = 0

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
            self.legacy.closed()  # its worker ends after the requests already queued
            worker = self.legacy.worker
            if worker is None or worker.done():
                self._close_after_eof()
            else:
                worker.add_done_callback(lambda _t: self._close_after_eof())
            return True
        self.requests_done()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        for timer in (self._grace, self._handshake, self._idle, self._flush_handle):
            if timer is not None:
                timer.cancel()
        self._out.clear()
        self.requests.drop()
        if self.rejected:
            return
        self.server.connections.discard(self)
        self.server.hub.remove(self)
        if self.legacy is not None:
            self.legacy.closed()
        log.debug("connection %s closed%s", self.conn_id, f": {exc}" if exc else "")

    # -- incoming ------------------------------------------------------------------------------------
    def _handle(self, events: list) -> None:
        if self.legacy is None and self.codec.version is _V2:
            self._start_legacy()
        if self.legacy is not None:
            if self._handshake is not None:  # its first message: a v2 client, not a silent socket
                self._handshake.cancel()
                self._handshake = None
            self.legacy.on_events(events)
            return
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        for ev in events:
            if self.closing:
                return
            self._on_v3(ev)

    def _on_v3(self, ev: Message | InvalidMessage) -> None:
        if type(ev) is InvalidMessage:
            self.send_error(ev.re, ev.error.code, ev.error.message)
            return
        t = ev.type
        if not self.ready:
            if self._hello_busy:
                if len(self._early) >= self.limits.max_pending_requests:
                    self.send_error(request_id(ev.body), ErrorCode.TOO_MANY_PENDING,
                                    "too many requests sent before the HELLO reply")
                else:
                    self._early.append(ev)
            elif t == _HELLO:
                self._hello_busy = True
                self.loop.create_task(self._run_hello(ev))
            else:
                self.fatal(ErrorCode.HANDSHAKE_REQUIRED, "the first request must be a valid HELLO",
                           request_id(ev.body))
            return
        if t != _PONG and t != _ERROR:  # a client's PONG or ERROR needs no answer
            self.requests.submit(ev)

    async def _run_hello(self, ev: Message) -> None:
        rid = request_id(ev.body)
        try:
            reply = await handle_hello(self, ev.body)
        except HandlerError as exc:
            self._hello_busy = False
            if exc.code in FATAL_CODES:
                self.fatal(exc.code, exc.message, rid)
            else:
                self.send_error(rid, exc.code, exc.message)
                early, self._early = self._early, []
                for e in early:  # requests pipelined behind a refused HELLO
                    self._on_v3(e)
                self.requests_done()
            return
        except Exception:
            log.exception("HELLO failed on connection %s", self.conn_id)
            self.fatal(ErrorCode.INTERNAL, "internal error during HELLO", rid)
            return
        if self.closing:  # the client left while we were answering
            self.server.hub.remove(self)
            return
        self.ready = True
        self._hot = self.legacy is None and self._grace is None
        self._hello_busy = False
        if self._handshake is not None:
            self._handshake.cancel()
            self._handshake = None
        self._arm_idle()
        send_response(self, rid, reply)  # a running turn's text may have to be cut to fit
        early, self._early = self._early, []
        for e in early:
            if self.closing:
                break
            self._on_v3(e)
        self.requests_done()

    def requests_done(self) -> None:
        """A request was answered: after the client's EOF, close once everything is answered."""
        if self._eof and not self.closing and self.legacy is None and not self._hello_busy \
                and not self._early and not self.pending and self.requests.idle:
            self._close_after_eof()

    def _close_after_eof(self) -> None:
        if self._eof_error is not None:
            self.fatal(ErrorCode.CONNECTION_CLOSED, self._eof_error)
        else:
            self.close()

    # -- closing -------------------------------------------------------------------------------------
    def _speaks_v3(self) -> bool:
        """Whether the peer may be sent v3 frames: v3, or undecided with a HELLO under way."""
        if self.legacy is not None:
            return False
        version = self.codec.version
        return version is _V3 or (version is _UNKNOWN and self._first == _HELLO)

    def fatal(self, code: str, message: str, re: Any = None) -> None:
        """Send ERROR (fatal) when the peer speaks v3, then close. v2 peers just see the close."""
        if self.closing:
            return
        log.info("connection %s (%s): %s %s", self.conn_id, self.peer, code, message)
        if self._speaks_v3():
            payload = _dumps({"re": re, "code": str(code), "message": message, "fatal": True})
            if self.codec.closed:  # a fatal receive error closed the codec: frame it by hand
                self._out.append(encode_frame(_ERROR, self.codec.tx_seq, payload))
            else:
                self._out.append(self.codec.send_raw(_ERROR, payload))
        self.close()

    def close(self) -> None:
        """Flush what is queued and close the transport (which sends what it holds first)."""
        if self.closing:
            return
        self._flush()
        self.closing = True
        self.requests.drop()
        if self.transport is not None:
            self.transport.close()

    def shutdown(self) -> None:
        """The server is stopping: tell the client, then close."""
        if self.legacy is not None:
            self.legacy.send_text("Server is shutting down.")
            self.close()
        else:
            self.fatal(ErrorCode.SHUTTING_DOWN, "the server is stopping")

    def _refuse(self, data: bytes) -> None:
        """Over max_clients: a v3 client (first byte HELLO) gets ERROR SERVER_FULL; v2 sees a close."""
        frame = server_full_frame(data, self.limits.max_clients)
        if frame:
            self._out.append(frame)
        self.close()

    # -- timers --------------------------------------------------------------------------------------
    def _on_grace(self) -> None:
        self._grace = None
        if self.closing or self.codec.version is not _UNKNOWN or self.codec.bytes_buffered:
            return
        self.codec.set_legacy()
        self._start_legacy()

    def _start_legacy(self) -> None:
        if self._grace is not None:  # (the handshake timer runs on until a first message)
            self._grace.cancel()
            self._grace = None
        self.legacy = LegacyV2(self)
        self._arm_idle()
        self.legacy.start()

    def _on_handshake_timeout(self) -> None:
        self._handshake = None
        if self.closing:
            return
        if self.legacy is not None:  # v2 by its silence or its first bytes, yet no whole message
            log.info("connection %s (%s): no message within %g s; closed", self.conn_id, self.peer,
                     self.limits.handshake_timeout_s)
            self.close()
        elif not self.ready:
            self.fatal(ErrorCode.HANDSHAKE_TIMEOUT,
                       f"no valid HELLO within {self.limits.handshake_timeout_s:g} s")

    def _arm_idle(self, delay: float | None = None) -> None:
        lim = self.limits
        if delay is None:
            delay = lim.ping_interval_s
        self._idle = self.loop.call_later(max(delay, 0.01), self._on_idle)

    def _on_idle(self) -> None:
        self._idle = None
        if self.closing:
            return
        lim = self.limits
        last = self.last_rx if self.legacy is None else max(self.last_rx, self.last_tx)
        quiet = self.loop.time() - last
        if quiet >= lim.idle_timeout_s:
            self.fatal(ErrorCode.IDLE_TIMEOUT, f"no message received for {lim.idle_timeout_s:g} s")
            return
        if quiet >= lim.ping_interval_s and not self._ping_sent and self.legacy is None:
            self._pings += 1
            self._ping_sent = True
            self.write(self.codec.send_raw(_PING, _dumps({"id": f"srv-{self._pings}"})))
        if self._ping_sent or self.legacy is not None:  # (config: ping_interval_s < idle_timeout_s)
            self._arm_idle(lim.idle_timeout_s - quiet)
        else:
            self._arm_idle(lim.ping_interval_s - quiet)
