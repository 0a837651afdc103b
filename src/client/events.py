"""Events the client delivers to its owner, and the bounded queue that carries them.

Server events arrive as the typed classes of ``protocol.server_events`` (``TurnStart``, ``AnswerDelta``,
``SessionEvent``, ``Notice``, ...), validated. The client adds its own, defined here:

- ``Connected`` (the HELLO reply, and whether it is a reconnection), ``Reconnecting`` (attempt, delay,
  error) and ``Disconnected`` (a stable code and the error): connection state changes.
- ``ServerError``: an ERROR frame not tied to a pending request (``re`` null).
- ``InvalidFrame``: a malformed frame from the server, or an event whose body does not validate.

Match on the classes (``match event: case AnswerDelta(): ...``), never on names.

Backpressure: the queue is bounded. When it is full the connection's reader waits before reading
more from the socket, so a slow consumer slows the TCP stream instead of growing memory or losing
events (no delta is ever dropped). Replies to requests do not go through this queue, but they are
read from the same socket: a consumer must therefore not wait for a request's reply while it stops
draining events (run such requests in another task).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Union

from protocol import ErrorCode
from protocol.replies import ErrorReply, HelloReply
from protocol.server_events import (AnswerDelta, Notice, SessionEvent, ToolCallEvent, ToolResultEvent, TurnEnd,
                                    TurnError, TurnEvent, TurnStart, TurnStatus)


@dataclass(frozen=True, slots=True)
class Connected:
    """HELLO succeeded (``reconnected``: after a connection loss)."""
    hello: HelloReply
    reconnected: bool = False


@dataclass(frozen=True, slots=True)
class Reconnecting:
    """The connection dropped; attempt ``attempt`` starts after ``delay`` seconds."""
    attempt: int
    delay: float
    error: str


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The client gave up (``code``: a client code of client.errors or a server code)."""
    code: str
    error: str


@dataclass(frozen=True, slots=True)
class ServerError:
    """An ERROR frame that answers no pending request."""
    error: ErrorReply


@dataclass(frozen=True, slots=True)
class InvalidFrame:
    """A frame from the server that could not be decoded or validated (it was skipped)."""
    code: ErrorCode
    message: str


StateEvent = Union[Connected, Reconnecting, Disconnected]
Event = Union[TurnStart, TurnStatus, ToolCallEvent, ToolResultEvent, AnswerDelta, TurnEnd, TurnError,
              SessionEvent, Notice, Connected, Reconnecting, Disconnected, ServerError, InvalidFrame]


def is_turn_event(event: object) -> bool:
    """True for the events of one turn (TURN_START ... TURN_END / TURN_ERROR)."""
    return isinstance(event, TurnEvent)


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
