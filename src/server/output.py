"""OutputBuffer: the sending half of one connection: batched writes, back-pressure, SLOW_CONSUMER.

Writes are batched: one ``transport.write`` per ``data_received`` call, or at once past
``FLUSH_BYTES``; otherwise the first write arms a flush two loop iterations later, so what the
tasks it woke (or created) publish in the next iteration leaves in the same write (a turn's
TURN_START, SESSION_EVENT, TURN_STATUS and first deltas: one send instead of three). The connection pauses reading while the transport is over its high-water mark
(set to at most ``max_output_buffer``; ``paused``), and no new request starts meanwhile
(``server.request_queue``). A client whose transport buffer (what the kernel would not take)
exceeds ``max_output_buffer`` when more output is queued is dropped with SLOW_CONSUMER (one message
may go over the cap, never two): the buffer aborts the transport and calls ``on_slow``.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

log = logging.getLogger("nplt.conn")

FLUSH_BYTES = 256 * 1024
HIGH_WATER = 64 * 1024       # transport write buffer high-water mark (asyncio's and uvloop's default)


class OutputBuffer:
    """Frames waiting for the transport. ``out`` is public: the codec's PONG fast path appends to it."""

    __slots__ = ("transport", "loop", "cap", "out", "size", "flush_bytes", "in_rx", "paused", "stopped",
                 "last_tx", "_handle", "_on_slow", "_name", "_waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop, cap: int, on_slow: Callable[[], None], name: str) -> None:
        self.transport: asyncio.Transport | None = None
        self.loop = loop
        self.cap = cap                        # max_output_buffer
        self.out: list[bytes] = []
        self.size = 0
        self.flush_bytes = min(FLUSH_BYTES, cap // 2)
        self.in_rx = False                    # inside data_received: the connection flushes at its end
        self.paused = False                   # the transport is over its high-water mark
        self.stopped = False                  # the connection is closing: nothing more is queued
        self.last_tx = 0.0                    # when a batch last went to the transport
        self._handle: asyncio.Handle | None = None
        self._on_slow = on_slow
        self._name = name
        self._waiters: list[asyncio.Future] = []  # wait_writable() callers (a streamed download)

    def attach(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        high = min(HIGH_WATER, self.cap)  # backlog over the cap => paused
        transport.set_write_buffer_limits(high=high, low=high // 4)  # type: ignore[attr-defined]

    def write(self, data: bytes) -> None:
        """Batch ``data`` for the transport; drop the client if its backlog is over the cap."""
        if self.stopped:
            return
        self.out.append(data)
        self.size += len(data)
        if self.size >= self.flush_bytes:
            self.flush()
        elif self._handle is None and not self.in_rx:
            self._handle = self.loop.call_soon(self._flush_next)

    def _flush_next(self) -> None:
        """The armed flush, one iteration on: flush at the end of the next one."""
        self._handle = self.loop.call_soon(self.flush)

    def end_rx(self, hot: bool) -> None:
        """The end of one ``data_received``: send what it queued (PONGs, replies) in one write.

        ``hot``: a ready v3 connection, whose batch goes straight to the transport when it is under
        its high-water mark (no backlog check, no ``last_tx``: the PING fast path)."""
        self.in_rx = False
        out = self.out
        if not out or self.stopped:
            return
        if not hot or self.paused or self._handle is not None:
            self.flush()   # with the backlog check
        else:              # the transport's buffer is under its high-water mark
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))  # type: ignore[union-attr]
            out.clear()
            self.size = 0

    def flush(self) -> None:
        """Hand the batch to the transport, unless what it already holds is over the cap."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        out = self.out
        tr = self.transport
        if not out or tr is None or tr.is_closing():
            return
        if tr.get_write_buffer_size() > self.cap and not self.stopped:
            self._slow_consumer()
            return
        self.last_tx = self.loop.time()
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self.size = 0
        tr.write(data)

    async def wait_writable(self) -> None:
        """Return once the transport is under its high-water mark (at once if it is), or stopped."""
        self.flush()
        while self.paused and not self.stopped:
            fut = self.loop.create_future()
            self._waiters.append(fut)
            await fut

    def resumed(self) -> None:
        """The transport drained under its low-water mark: writers waiting may go on."""
        self.paused = False
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def stop(self) -> None:
        """Nothing more is queued (the connection is closing or closed); pending timers are cancelled."""
        self.stopped = True
        self._wake()
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def discard(self) -> None:
        self.out.clear()
        self.size = 0

    def _slow_consumer(self) -> None:
        log.warning("connection %s dropped: SLOW_CONSUMER (more than %d bytes unsent)", self._name, self.cap)
        self.stop()
        self.discard()
        self._on_slow()
        if self.transport is not None:
            self.transport.abort()
