"""Cancellation of the caller is never swallowed by the client library (loopback TCP).

The server here answers HELLO and then stays silent, so a request stays pending as long as the test
wants; it speaks the real codec (protocol.Connection, server role) and the typed HELLO reply.
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator

import pytest

from client.connection import Backoff, Client
from client.events import Reconnecting
from client_testlib import next_event_of, wait_until
from protocol import Connection, Message, MsgType, Role
from protocol.objects import AgentInfo, SessionInfo
from protocol.replies import HelloReply


class SilentServer:
    """Answers HELLO, ignores every other request; ``drop()`` closes the client's connection."""

    def __init__(self) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self.requests: list[MsgType] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        conn = Connection(Role.SERVER)
        while data := await reader.read(65536):
            for item in conn.receive_data(data):
                if not isinstance(item, Message) or not isinstance(item.body, dict):
                    continue
                self.requests.append(MsgType(item.type))
                if item.type == MsgType.HELLO:
                    hello = HelloReply("silent/0", 3, "local", SessionInfo("s_1", "Chat"),
                                       agent=AgentInfo("none", True, "none"), re=item.body["id"])
                    writer.write(conn.send(MsgType.RESPONSE, hello.encode()))
        writer.close()

    def drop(self) -> None:
        for w in self.writers:
            w.close()


@pytest.fixture
async def silent() -> AsyncIterator[tuple[SilentServer, int]]:
    srv = SilentServer()
    server = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
    try:
        yield srv, server.sockets[0].getsockname()[1]
    finally:
        srv.drop()
        server.close()
        await server.wait_closed()


async def test_cancelling_a_caller_awaiting_a_request_propagates(silent: tuple[SilentServer, int]) -> None:
    srv, port = silent
    async with Client("127.0.0.1", port, request_timeout=60) as c:
        assert c.hello is not None and c.hello.session.session_id == "s_1" == c.session_id
        task = asyncio.create_task(c.ping())
        await wait_until(lambda: MsgType.PING in srv.requests and bool(c.link._pending), what="the PING pending")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled() and not c.link._pending   # forgotten: a late reply would be ignored
        assert c.connected


async def test_cancelling_close_propagates_and_still_closes(silent: tuple[SilentServer, int]) -> None:
    srv, port = silent
    c = Client("127.0.0.1", port, backoff=Backoff(initial=60, maximum=60, jitter=0))
    await c.connect()
    srv.drop()
    await next_event_of(c, Reconnecting)      # the reconnect task now waits 60 s before its attempt
    # a reconnect task that takes a while to stop: close() is waiting for it when its caller is cancelled
    stopping, never = asyncio.Event(), asyncio.Event()
    real = c.link._reconnect_task
    assert real is not None

    async def slow_to_stop() -> None:
        real.cancel()
        try:
            await never.wait()
        finally:
            stopping.set()
            await never.wait()   # cancelled again when close()'s caller is cancelled
    c.link._reconnect_task = asyncio.create_task(slow_to_stop())
    closing = asyncio.create_task(c.close())
    await stopping.wait()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert c.state == "closed" and c.link._queue.closed and not c.link._pending
