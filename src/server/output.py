"""OutputBuffer: the sending half of one connection: batched writes, back-pressure, SLOW_CONSUMER.

Writes are batched: one ``transport.write`` per ``data_received`` call, or at once past
``FLUSH_BYTES``; otherwise the first write arms a flush two loop iterations later, so what the
tasks it woke (or created) publish in the next iteration leaves in the same write (a turn's
TURN_START, SESSION_EVENT, TURN_STATUS and first deltas: one send instead of three). The connection pauses reading while the transport is over its high-water mark
(set to at most ``max_output_buffer``; ``paused``), and no new request starts meanwhile
(``server.request_queue``).

A client is judged by its progress, not by the size of its backlog alone (review s33: a client
reading an 8 MB export steadily at 200 KB/s was dropped as soon as an unrelated event was due).
While the transport's buffer (what the kernel would not take yet) is over ``max_output_buffer``,
more output is held here, unframed bytes in ``out``, at most ``max_output_buffer`` of them, and goes
out once the transport has drained under its low-water mark. The client is dropped with
SLOW_CONSUMER (the buffer aborts the transport and calls ``on_slow``) when what is held passes
``max_output_buffer``, or when the transport's buffer stays over ``max_output_buffer`` without
shrinking by ``STALL_PROGRESS_BYTES`` for ``SLOW_CONSUMER_STALL_S``: checked by a timer, so a client
that stopped reading is dropped then, not at the next output due (the server's PING, up to
``ping_interval_s`` later). So one connection holds at most about twice ``max_output_buffer`` plus
one message, and a client that does not read holds it for ``SLOW_CONSUMER_STALL_S`` at most.

A connection whose output something waits on (``when_drained``: an export's slot, server-wide
``max_concurrent_exports``) is judged by the same rule from its first unsent byte, not only over
``max_output_buffer`` (review s33, export_hold.py: a ~6 MB export leaves ~1.5 MB in the transport
once the kernel took the rest, under the cap, so two clients that never read held both export
slots until ``idle_timeout_s``, 300 s, and every other export waited). Such a client is dropped
``SLOW_CONSUMER_STALL_S`` after it stops reading, and the slot goes back.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Iterable

log = logging.getLogger("nplt.conn")

FLUSH_BYTES = 256 * 1024
HIGH_WATER = 64 * 1024       # transport write buffer high-water mark (asyncio's and uvloop's default)
#: A client whose transport buffer is over ``max_output_buffer`` and has not shrunk by
#: ``STALL_PROGRESS_BYTES`` for this long (seconds) does not read: it is dropped (SLOW_CONSUMER).
#: Above a network hiccup or TCP's first retransmission back-offs (0.2 + 0.4 + 0.8 + 1.6 s), well
#: below the default ``ping_interval_s`` (60 s), at which such a client used to be dropped.
SLOW_CONSUMER_STALL_S = 6.0
#: The progress that counts as reading: this many bytes taken within SLOW_CONSUMER_STALL_S (the
#: slowest reader kept over the cap is 32 KiB per 6 s, ~5.5 KB/s, at which 4 MiB take 13 minutes to
#: drain: a client trickling a few bytes now and then to keep megabytes held is not).
STALL_PROGRESS_BYTES = 32 * 1024
STALL_CHECKS = 6             # the stall is checked this many times per SLOW_CONSUMER_STALL_S


def backlog_of(transport: Any) -> int:
    """What ``transport`` holds unsent (0 once it is gone)."""
    if transport is None:
        return 0
    try:
        return transport.get_write_buffer_size()
    except Exception:          # (a transport torn down under us holds nothing)
        return 0


def total_unsent(connections: Iterable[Any]) -> int:
    """The unsent output of every connection together (``OutputBuffer.unsent``): what
    ``[limits] max_total_output_buffer`` is counted against."""
    total = 0
    for c in connections:
        out = getattr(c, "output", None)
        if out is not None:
            total += out.unsent
    return total


class OutputBuffer:
    """Frames waiting for the transport. ``out`` is public: the codec's PONG fast path appends to it."""

    __slots__ = ("transport", "loop", "cap", "out", "size", "flush_bytes", "in_rx", "paused", "stopped",
                 "last_tx", "stall_s", "_handle", "_on_slow", "_name", "_waiters", "_drained", "_watch",
                 "_mark", "_progress_at")

    def __init__(self, loop: asyncio.AbstractEventLoop, cap: int, on_slow: Callable[[], None], name: str,
                 *, stall_s: float | None = None) -> None:
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
        self.stall_s = SLOW_CONSUMER_STALL_S if stall_s is None else stall_s
        self._handle: asyncio.Handle | None = None
        self._on_slow = on_slow
        self._name = name
        self._waiters: list[asyncio.Future] = []  # wait_writable() callers (a streamed download)
        self._drained: list[Callable[[], None]] = []  # when_drained() callbacks
        self._watch: asyncio.TimerHandle | None = None   # the stall check, while over the cap
        self._mark = 0                        # the transport's backlog at the last progress seen
        self._progress_at = 0.0               # ... and when

    def attach(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        high = min(HIGH_WATER, self.cap)  # backlog over the cap => paused
        transport.set_write_buffer_limits(high=high, low=high // 4)  # type: ignore[attr-defined]

    @property
    def unsent(self) -> int:
        """Bytes queued here plus those the transport holds."""
        return self.size + backlog_of(self.transport)

    def write(self, data: bytes) -> None:
        """Batch ``data`` for the transport (``flush``: held while the client is behind)."""
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
            if self._drained:
                self._after_write(self.transport)   # type: ignore[arg-type]

    def flush(self) -> None:
        """Hand the batch to the transport, unless what it already holds is over the cap: then the
        batch is held (the client is dropped if what is held passes the cap too)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        out = self.out
        tr = self.transport
        if not out or tr is None or tr.is_closing():
            return
        if not self.stopped and backlog_of(tr) > self.cap:
            if self.size > self.cap:
                self._slow_consumer(f"more than {self.cap} bytes held behind {self.cap} unsent")
            else:
                self._watch_stall()   # held until the transport drains (``resumed``)
            return
        self._write_out(tr)

    def _write_out(self, tr: asyncio.Transport) -> None:
        out = self.out
        self.last_tx = self.loop.time()
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self.size = 0
        tr.write(data)
        self._after_write(tr)

    def _after_write(self, tr: asyncio.Transport) -> None:
        """After a write to the transport: a client that stopped reading is dropped without more
        output due, whether it is over the cap or holds output something waits on (``when_drained``)."""
        if self._drained:
            self._check_drained()
        if self._judged(backlog_of(tr)):
            self._watch_stall()

    async def wait_writable(self) -> None:
        """Return once the transport is under its high-water mark (at once if it is), or stopped."""
        self.flush()
        while self.paused and not self.stopped:
            fut = self.loop.create_future()
            self._waiters.append(fut)
            await fut

    def resumed(self) -> None:
        """The transport drained under its low-water mark: what was held goes out (in the next loop
        iteration, not inside the transport's callback), writers waiting may go on."""
        self.paused = False
        if self.out and not self.stopped and self._handle is None and not self.in_rx:
            self._handle = self.loop.call_soon(self.flush)
        self._wake()
        if self._drained:
            self._check_drained()
        if self._watch is not None and not self._judged(backlog_of(self.transport)):
            self._watch.cancel()    # caught up: the next time it is judged starts afresh (mark, time)
            self._watch = None

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    # -- drained -------------------------------------------------------------------------------------
    def when_drained(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once everything queued by then and the next output written (a reply
        about to be sent) has left: nothing queued here and the transport under its high-water
        mark (at most 64 KiB left in it); or once the connection stops (closed, dropped). Not checked at once: a caller registers
        right before it queues that output (``server.handlers.history``: the export slot is held
        until its reply has drained). Meanwhile the client is judged from its first unsent byte
        (``_judged``): one that does not read is dropped after ``stall_s``, which calls ``callback``."""
        if self.stopped or self.transport is None:
            callback()
            return
        self._drained.append(callback)

    def _check_drained(self) -> None:
        """Drained: nothing queued here, and the transport not over its high-water mark (the
        transport calls ``pause_writing`` from inside the write that takes it over, so ``paused``
        is up to date; once over, ``resumed`` comes when it is back under its low-water mark)."""
        if not self.out and not self.paused:
            self._fire_drained()

    def _fire_drained(self) -> None:
        callbacks, self._drained = self._drained, []
        for cb in callbacks:
            try:
                cb()
            except Exception:
                log.exception("connection %s: a drained callback failed", self._name)

    # -- stall ---------------------------------------------------------------------------------------
    def _judged(self, backlog: int) -> bool:
        """Whether the client must show progress: its transport is over the cap, or holds output
        that a ``when_drained`` callback waits on (an export slot: judged from the first byte)."""
        return backlog > self.cap or (backlog > 0 and bool(self._drained))

    def _watch_stall(self) -> None:
        """The client is judged (``_judged``): from now on, check that it reads."""
        if self._watch is not None:
            return
        self._mark = backlog_of(self.transport)
        self._progress_at = self.loop.time()
        self._watch = self.loop.call_later(self.stall_s / STALL_CHECKS, self._stall_check)

    def _stall_check(self) -> None:
        self._watch = None
        tr = self.transport
        backlog = backlog_of(tr)
        if tr is None or not self._judged(backlog):
            return                  # caught up (or gone): the next time judged starts afresh
        now = self.loop.time()
        if backlog > self._mark:    # more was written meanwhile: not the client's doing, nor progress
            self._mark = backlog
        elif self._mark - backlog >= STALL_PROGRESS_BYTES:
            self._mark, self._progress_at = backlog, now
        elif now - self._progress_at >= self.stall_s:
            where = f"over {self.cap}" if backlog > self.cap else "a reply holding a slot"
            self._slow_consumer(f"{backlog} bytes unsent, {where}, for {self.stall_s:g} s "
                                f"without {STALL_PROGRESS_BYTES} bytes read")
            return
        self._watch = self.loop.call_later(self.stall_s / STALL_CHECKS, self._stall_check)

    # -- closing -------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Nothing more is queued (the connection is closing or closed); pending timers are cancelled.
        What was held for a client that is behind goes to the transport now (bounded by the cap),
        which sends it after what it holds, then closes; the stall check goes on meanwhile, so a
        closing client that does not read is still aborted."""
        if self.stopped:
            return
        tr = self.transport
        if self.out and tr is not None and not tr.is_closing():
            self._write_out(tr)
        self.stopped = True
        self._wake()
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._fire_drained()

    def discard(self) -> None:
        self.out.clear()
        self.size = 0
        if self._watch is not None and backlog_of(self.transport) == 0:
            self._watch.cancel()
            self._watch = None

    def _slow_consumer(self, why: str) -> None:
        log.warning("connection %s dropped: SLOW_CONSUMER (%s)", self._name, why)
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self.discard()
        self.stop()
        self._on_slow()
        if self.transport is not None:
            self.transport.abort()
