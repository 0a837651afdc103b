"""Events the client delivers to its owner, and the bounded queue that carries them.

Server events keep their protocol name as ``type`` (``TURN_START``, ``ANSWER_DELTA``, ``SESSION_EVENT``,
``NOTICE``, ...) and their JSON body unchanged. The client adds:

- ``STATE``: connection state changes, body ``{"state": "connected" | "reconnecting" | "disconnected", ...}``
  (``connected`` carries ``hello`` (the HELLO reply) and ``reconnected``; ``reconnecting`` carries
  ``attempt``, ``delay`` and ``error``; ``disconnected`` carries ``code`` and ``error``).
- ``ERROR``: an ERROR frame not tied to a pending request (``re`` null), body as on the wire.
- ``INVALID``: a malformed frame from the server, body ``{"code", "message"}``.

Backpressure: the queue is bounded. When it is full the connection's reader waits before reading
more from the socket, so a slow consumer slows the TCP stream instead of growing memory or losing
events (no delta is ever dropped). Replies to requests do not go through this queue, but they are
read from the same socket: a consumer must therefore not wait for a request's reply while it stops
draining events (run such requests in another task).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

TURN_EVENTS = frozenset({"TURN_START", "TURN_STATUS", "TOOL_CALL", "TOOL_RESULT", "ANSWER_DELTA",
                         "TURN_END", "TURN_ERROR"})


@dataclass(slots=True)
class Event:
    """One event: ``type`` is the protocol message name (or STATE / ERROR / INVALID), ``body`` its JSON."""
    type: str
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def session_id(self) -> str | None:
        return self.body.get("session_id")

    @property
    def turn_id(self) -> str | None:
        return self.body.get("turn_id")

    @property
    def is_turn_event(self) -> bool:
        return self.type in TURN_EVENTS


class EventQueue:
    """A bounded FIFO of events that can be closed; ``get`` returns None once closed and drained."""

    def __init__(self, maxsize: int) -> None:
        self._queue: asyncio.Queue[Event] = asyncio.Queue(maxsize)
        self._closed = asyncio.Event()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def qsize(self) -> int:
        return self._queue.qsize()

    async def put(self, event: Event) -> None:
        """Wait for room (backpressure), unless the queue is closed (the event is then discarded)."""
        if self._closed.is_set():
            return
        if not self._queue.full():
            self._queue.put_nowait(event)
            return
        put = asyncio.ensure_future(self._queue.put(event))
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait({put, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for f in (put, closed):
                if not f.done():
                    f.cancel()

    async def get(self, timeout: float | None = None) -> Event | None:
        """The next event; None when closed and empty. Raises TimeoutError after ``timeout`` seconds."""
        if not self._queue.empty():
            return self._queue.get_nowait()
        if self._closed.is_set():
            return None
        get = asyncio.ensure_future(self._queue.get())
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            done, _ = await asyncio.wait({get, closed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
            if not get.done():
                get.cancel()
        if get.done() and not get.cancelled():
            return get.result()
        if not done:
            raise TimeoutError("no event within the timeout")
        return None

    def close(self) -> None:
        """Wake every waiter; events already queued can still be read."""
        self._closed.set()
