"""What the bench scripts share: the event loop they run on and a minimal v3 client over asyncio streams.

Import it after putting ``src`` on ``sys.path`` (the scripts do, first thing).
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, NamedTuple

from protocol import Connection, Message, MsgType, Role

T = MsgType


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop when installed (as ``nplt-server`` uses), else asyncio's."""
    try:
        import uvloop
        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class Turned(NamedTuple):
    seconds: float          # CHAT_TEXT sent -> TURN_END received
    deltas: int             # ANSWER_DELTA events received
    span: float             # seconds from the first delta to the last
    session_id: str


class BenchClient:
    """Requests by id, PINGs answered, turns followed to their end; no reconnects, no checks beyond that."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.codec = Connection(Role.CLIENT, max_message_size=64 << 20)
        self.ids = 0
        self.pending: list[Message] = []

    @classmethod
    async def connect(cls, port: int) -> BenchClient:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def next(self) -> Message:
        while not self.pending:
            data = await self.reader.read(1 << 18)
            if not data:
                raise ConnectionError("server closed the connection")
            self.pending.extend(self.codec.receive_data(data))
            self.pending.reverse()          # pop() from the end = oldest first
        return self.pending.pop()

    async def call(self, t: int, **body: Any) -> dict:
        self.ids += 1
        rid = body["id"] = self.ids
        self.writer.write(self.codec.send(t, body))
        while True:
            m = await self.next()
            if m.type == T.PING:
                self.writer.write(self.codec.send(T.PONG, {"re": m.body["id"], "time": "now"}))
            elif m.type in (T.RESPONSE, T.ERROR) and m.body.get("re") == rid:
                if m.type == T.ERROR:
                    raise RuntimeError(f"{m.body['code']}: {m.body['message']}")
                return m.body

    async def turn(self, text: str) -> Turned:
        t0 = time.perf_counter()
        r = await self.call(T.CHAT_TEXT, text=text)
        deltas, first, last = 0, 0.0, 0.0
        while True:
            m = await self.next()
            if m.type == T.ANSWER_DELTA:
                last = time.perf_counter()
                if not deltas:
                    first = last
                deltas += 1
            elif m.type in (T.TURN_END, T.TURN_ERROR) and m.body.get("turn_id") == r["turn_id"]:
                if m.type == T.TURN_ERROR:
                    raise RuntimeError(f"turn failed: {m.body['code']}: {m.body['message']}")
                return Turned(time.perf_counter() - t0, deltas, last - first, r["session_id"])

    def close(self) -> None:
        self.writer.close()
