"""Events between nodes over PostgreSQL LISTEN/NOTIFY: ``publish`` sends a small JSON payload on a
channel, ``Listener`` receives them on a dedicated connection and reconnects by itself.

Payloads go by reference: ids and kinds, never message content (NOTIFY payloads are limited to
under 8000 bytes); a listener reads the rows it needs. A notification is delivered only to
listeners connected when its transaction commits, so after a reconnect ``Listener`` calls
``on_gap()``: the consumer resynchronizes from the tables.
"""
from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import orjson

from ..errors import InvalidArgument
from .link import MAX_BACKOFF_S, PgLink

log = logging.getLogger("storage")

MAX_PAYLOAD_BYTES = 7900
CHANNEL_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def _check_channel(channel: str) -> str:
    if not isinstance(channel, str) or CHANNEL_RE.fullmatch(channel) is None:
        raise InvalidArgument(f"channel: expected a lowercase SQL identifier, got {channel!r}")
    return channel


def encode_payload(payload: dict[str, Any]) -> str:
    raw = orjson.dumps(payload)
    if len(raw) > MAX_PAYLOAD_BYTES:
        raise InvalidArgument(f"notification payload is {len(raw)} bytes, over {MAX_PAYLOAD_BYTES}: "
                              "send ids and read the rows")
    return raw.decode()


async def publish(link: PgLink, channel: str, payload: dict[str, Any]) -> None:
    """Send ``payload`` to every node listening on ``channel`` (committed at once)."""
    text = encode_payload(payload)
    _check_channel(channel)
    await link.run(lambda con: con.execute("SELECT pg_notify($1, $2)", channel, text), write=True)


async def publish_in(con: asyncpg.Connection, channel: str, payload: dict[str, Any]) -> None:
    """Queue ``payload`` inside the caller's transaction on ``con``: it is sent only if that
    transaction commits, so listeners never hear of a row they cannot read."""
    await con.execute("SELECT pg_notify($1, $2)", _check_channel(channel), encode_payload(payload))


class Listener:
    """LISTEN on channels over one dedicated connection; ``on_event(channel, payload)`` is called for
    each notification, one at a time in the order PostgreSQL delivered them, and ``on_gap()`` after
    every reconnect (notifications may have been missed)."""

    def __init__(self, link: PgLink, channels: list[str],
                 on_event: Callable[[str, dict[str, Any]], Awaitable[None] | None],
                 on_gap: Callable[[], Awaitable[None] | None] | None = None) -> None:
        self.link = link
        self.channels = [_check_channel(c) for c in channels]
        self.on_event = on_event
        self.on_gap = on_gap
        self.connected = asyncio.Event()
        self.connects = 0
        self._tasks: list[asyncio.Task] = []
        self._con: asyncpg.Connection | None = None
        self._queue: asyncio.Queue = asyncio.Queue()

    async def start(self) -> None:
        """Connect and LISTEN (raises StorageUnavailable if that fails), then keep it up."""
        await self._connect()
        self._tasks = [asyncio.create_task(self._watch(), name="pg-listener"),
                       asyncio.create_task(self._consume(), name="pg-listener-events")]

    async def _connect(self) -> None:
        lost = asyncio.Event()

        async def open_() -> asyncpg.Connection:
            con = await asyncpg.connect(**self.link.connect_args())
            con.add_termination_listener(lambda _c: lost.set())
            for ch in self.channels:
                await con.add_listener(ch, self._deliver)
            return con
        self._con = await self.link.retrying(open_, "listen for notifications")
        self._lost = lost
        self.connects += 1
        self.connected.set()

    def _deliver(self, _con: Any, _pid: int, channel: str, payload: str) -> None:
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            log.warning("storage: ignored a malformed notification on %s", channel)
            return
        self._queue.put_nowait((channel, data))

    async def _consume(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                if item is None:
                    if self.on_gap is not None:
                        await _maybe_await(self.on_gap())
                else:
                    await _maybe_await(self.on_event(*item))
            except Exception:
                log.exception("storage: a notification handler failed")

    async def _watch(self) -> None:
        delay = self.link.config.pg_retry_backoff_ms / 1000
        while True:
            await self._lost.wait()
            self.connected.clear()
            log.warning("storage: notification connection lost, reconnecting")
            while True:
                try:
                    await self._connect()
                    break
                except Exception as exc:                    # StorageUnavailable after its own retries
                    log.warning("storage: cannot listen yet (%s)", exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_BACKOFF_S)
            delay = self.link.config.pg_retry_backoff_ms / 1000
            self._queue.put_nowait(None)              # the gap, in order with the events

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        if self._con is not None and not self._con.is_closed():
            self._con.terminate()


async def _maybe_await(result: Awaitable[None] | None) -> None:
    if result is not None and asyncio.iscoroutine(result):
        await result
