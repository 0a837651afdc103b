"""RequestQueue: when a v3 connection's requests start, so the memory they use stays bounded.

A reply is built whole before it is queued (an export of a large session is megabytes), so what a
connection can make the server hold is: its queued output, plus every reply being built. The
output is capped (``max_output_buffer``, SLOW_CONSUMER); the replies being built are bounded here:

- one request of a connection runs at a time, in arrival order; the next one starts once the
  previous one has answered;
- and only while the connection's transport is under its high-water mark: a client that does not
  read gets no new request work started until its transport drains (its reading is paused too, so
  its requests wait in its socket buffer). A client that never reads is dropped as SLOW_CONSUMER at
  the next output due (a server PING, a turn event) once over ``max_output_buffer``.

Requests waiting here count as pending (``max_pending_requests``: ``TOO_MANY_PENDING`` beyond, and
their ids cannot be reused meanwhile). Requests answered without any work (PING, a second HELLO,
a duplicate id, one too many, an id that is not valid) are answered at once, as before.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Callable

from protocol import Message, MsgType
from protocol.messages import request_id
from server.handlers.dispatch import Dispatcher

_INLINE = frozenset({int(MsgType.PING), int(MsgType.HELLO)})   # answered by dispatch, no task


class RequestQueue:
    """The requests of one v3 connection: the running one and those waiting for it.

    ``may_start()`` says whether the connection may start work now (not closing, output under its
    high-water mark); ``on_answered()`` is called after each answer.
    """

    __slots__ = ("dispatcher", "may_start", "on_answered", "held", "running", "_marker")

    def __init__(self, dispatcher: Dispatcher, may_start: Callable[[], bool],
                 on_answered: Callable[[], None]) -> None:
        self.dispatcher = dispatcher
        self.may_start = may_start
        self.on_answered = on_answered
        self.held: deque[tuple[Any, Message]] = deque()
        self.running: asyncio.Task | None = None
        self._marker: asyncio.Future | None = None   # dispatcher.pending's entry for a held request

    @property
    def idle(self) -> bool:
        """Nothing running and nothing waiting."""
        return self.running is None and not self.held

    def submit(self, ev: Message) -> None:
        """Start ``ev`` now if the connection may, else keep it (or refuse it at once)."""
        d = self.dispatcher
        if ev.type in _INLINE:
            d.dispatch(ev)
            return
        if self.running is None and not self.held and self.may_start():
            self._start(ev)
            return
        rid = request_id(ev.body)
        pending = d.pending
        if rid is None or rid in pending or len(pending) >= d.max_pending:
            d.dispatch(ev)   # an ERROR at once (invalid id, id in use, too many): no work
            return
        if self._marker is None:  # a finished future: Server.stop may wait on the pending values
            self._marker = d.loop.create_future()
            self._marker.set_result(None)
        pending[rid] = self._marker
        self.held.append((rid, ev))

    def resume(self) -> None:
        """Start the next held request if the connection may (after an answer, or a drain)."""
        pending = self.dispatcher.pending
        while self.held and self.running is None and self.may_start():
            rid, ev = self.held.popleft()
            if pending.get(rid) is self._marker:
                del pending[rid]
            self._start(ev)

    def drop(self) -> None:
        """The connection is closing: forget the requests that did not start."""
        pending = self.dispatcher.pending
        for rid, _ in self.held:
            if pending.get(rid) is self._marker:
                del pending[rid]
        self.held.clear()

    def _start(self, ev: Message) -> None:
        task = self.dispatcher.dispatch(ev)
        if task is not None and not task.done():
            self.running = task
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        if self.running is task:
            self.running = None
        self.resume()
        self.on_answered()
