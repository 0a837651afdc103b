"""The sending half of ServerConnection: batched writes, back-pressure, SLOW_CONSUMER.

Writes are batched (one ``transport.write`` per ``data_received`` call or loop iteration, or at once
past ``FLUSH_BYTES``). Reading pauses while the transport is over its high-water mark (set to at
most ``max_output_buffer``), and so does the start of the connection's next request
(``server.request_queue``). A client whose transport buffer (what the kernel would not take)
exceeds ``max_output_buffer`` when more output is queued is dropped with SLOW_CONSUMER (one message
may go over the cap, never two).
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from protocol import MsgType, ProtocolError

if TYPE_CHECKING:  # pragma: no cover
    from protocol import Connection as Codec
    from server.config import LimitsConfig
    from server.request_queue import RequestQueue

log = logging.getLogger("nplt.conn")

FLUSH_BYTES = 256 * 1024
HIGH_WATER = 64 * 1024       # transport write buffer high-water mark (asyncio's and uvloop's default)
_MAX_PAYLOAD = 65535
_ERROR = int(MsgType.ERROR)


class OutputMixin:
    """Output state and methods of ServerConnection (which sets every attribute named here)."""

    server: Any
    limits: LimitsConfig
    loop: asyncio.AbstractEventLoop
    codec: Codec
    conn_id: int
    peer: str
    transport: asyncio.Transport | None
    closing: bool
    legacy: Any
    requests: RequestQueue
    last_tx: float
    _out: list[bytes]
    _out_size: int
    _flush_bytes: int
    _flush_handle: asyncio.Handle | None
    _in_rx: bool
    _write_paused: bool

    # -- asyncio.Protocol flow control ---------------------------------------------------------
    def pause_writing(self) -> None:
        self._write_paused = True
        if not self.closing and self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if not self.closing and self.transport is not None:
            self.transport.resume_reading()
            self.requests.resume()

    def output_full(self) -> bool:
        """True while the transport is over its high-water mark (no new request work starts)."""
        return self._write_paused

    # -- sending -------------------------------------------------------------------------------
    def send_msg(self, msg_type: int, body: dict[str, Any]) -> None:
        """Encode and queue one v3 message (fragmented if large). Raises ProtocolError if too large."""
        if self.closing or self.codec.closed:
            return
        self.write(self.codec.send(msg_type, body))

    def send_payload(self, msg_type: int, payload: bytes) -> None:
        """Queue an already JSON-encoded v3 body (shared between connections by the hub)."""
        if self.closing or self.codec.closed:
            return
        try:
            if len(payload) <= _MAX_PAYLOAD:
                data = self.codec.send_raw(msg_type, payload)
            else:
                data = self.codec.send(msg_type, payload)
        except ProtocolError as exc:
            log.warning("connection %s: event %s dropped: %s", self.conn_id, msg_type, exc.message)
            return
        self.write(data)

    def send_error(self, re: Any, code: str, message: str, fatal: bool = False) -> None:
        self.send_msg(_ERROR, {"re": re, "code": str(code), "message": message, "fatal": fatal})

    def write(self, data: bytes) -> None:
        """Batch ``data`` for the transport; drop the client if its backlog is over the cap."""
        if self.closing:
            return
        self._out.append(data)
        self._out_size += len(data)
        if self._out_size >= self._flush_bytes:
            self._flush()
        elif self._flush_handle is None and not self._in_rx:
            self._flush_handle = self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Hand the batch to the transport, unless what it already holds is over the cap."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        out = self._out
        tr = self.transport
        if not out or tr is None or tr.is_closing():
            return
        if tr.get_write_buffer_size() > self.limits.max_output_buffer and not self.closing:
            self._slow_consumer()
            return
        if self.legacy is not None:  # v2 cannot be pinged: what we send to it counts as activity
            self.last_tx = self.loop.time()
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self._out_size = 0
        tr.write(data)

    def _slow_consumer(self) -> None:
        log.warning("connection %s (%s) dropped: SLOW_CONSUMER (more than %d bytes unsent)",
                    self.conn_id, self.peer, self.limits.max_output_buffer)
        self.server.slow_consumers += 1
        self.closing = True
        self._out.clear()
        self._out_size = 0
        self.requests.drop()
        if self.transport is not None:
            self.transport.abort()
