"""Connections that go away in the middle of their requests never leave an unhandled task exception.

A seeded fuzzer opens v2 and v3 connections that send a few real requests (chats, history, session
lists and switches, heartbeats), then end abruptly: a fatal frame (FRAGMENT on v2, a bad seq on v3),
a reset, a close in the middle of a frame, or a half-close. The captured log must hold no traceback,
no "v2 request failed", and asyncio must report no "Task exception was never retrieved".
"""
from __future__ import annotations

import asyncio
import gc
import logging
import random
import socket
import struct

import orjson
import pytest

from server import legacy_v2
from testkit.server import poll, running_server

HEADER = struct.Struct(">BHH")
CHAT, HISTORY, SESSION_LIST, SESSION_NEW, SESSION_SWITCH, CLEAR, MODEL = 0x01, 0x10, 0x14, 0x16, 0x15, 0x11, 0x0F
HELLO, STATS, SESSION_INFO, V3_HISTORY = 0x20, 0x2A, 0x2B, 0x10
FRAGMENT = 0x7F
ENDINGS = ("fatal", "reset", "mid_frame", "half_close", "close")


def _frame(t: int, seq: int, payload: bytes) -> bytes:
    return HEADER.pack(t, seq & 0xFFFF, len(payload)) + payload


def _v2_requests(rng: random.Random) -> list[tuple[int, bytes]]:
    pool = [(CHAT, b"hello"), (CHAT, b"HEARTBEAT"), (CHAT, b"!tool disk"), (CHAT, "你好".encode()),
            (HISTORY, b""), (HISTORY, b'{"limit": 3}'), (SESSION_LIST, b""), (SESSION_NEW, b""),
            (SESSION_SWITCH, b"s_"), (CLEAR, b""), (MODEL, b"nope"), (CHAT, b"\xff\xfe")]
    return [rng.choice(pool) for _ in range(rng.randint(1, 6))]


def _v3_requests(rng: random.Random) -> list[tuple[int, dict]]:
    pool = [(0x01, {"text": "hello"}), (V3_HISTORY, {"limit": 5}), (SESSION_LIST, {}), (SESSION_NEW, {}),
            (STATS, {}), (SESSION_INFO, {}), (0x28, {}), (0x23, {})]
    return [rng.choice(pool) for _ in range(rng.randint(1, 6))]


async def _one(addr: tuple[str, int], rng: random.Random, v3: bool) -> None:
    reader, writer = await asyncio.open_connection(*addr)
    seq = 0
    data = b""
    if v3:
        data += _frame(HELLO, seq, orjson.dumps({"id": 0, "proto": 3, "client": "fuzz"}))
        seq += 1
        for i, (t, body) in enumerate(_v3_requests(rng), 1):
            data += _frame(t, seq, orjson.dumps({"id": i, **body}))
            seq += 1
    else:
        for t, payload in _v2_requests(rng):
            data += _frame(t, seq, payload)
            seq += 1
    ending = rng.choice(ENDINGS)
    if ending == "fatal":   # v2: FRAGMENT is fatal; v3: a frame out of sequence is
        data += _frame(FRAGMENT, seq, b"x") if not v3 else _frame(0x23, seq + 7, b'{"id":1}')
    elif ending == "mid_frame":
        data += _frame(CHAT if not v3 else 0x01, seq, b"x" * 100)[:rng.randint(1, 50)]
    cut = rng.randint(0, len(data))  # sometimes in two writes, the request work started in between
    writer.write(data[:cut])
    await writer.drain()
    if rng.random() < 0.5:
        try:
            await asyncio.wait_for(reader.read(rng.randint(1, 4096)), 0.5)
        except (asyncio.TimeoutError, ConnectionError):
            pass
    writer.write(data[cut:])
    try:
        await writer.drain()
    except ConnectionError:
        pass
    if ending == "reset":
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
        return
    if ending == "half_close":
        writer.write_eof()
        try:
            await asyncio.wait_for(reader.read(), 5)
        except (asyncio.TimeoutError, ConnectionError):
            pass
    writer.close()
    try:
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass


@pytest.mark.parametrize("v3", [False, True], ids=["v2", "v3"])
async def test_connections_closed_mid_request_leave_no_traceback(tmp_path, caplog, monkeypatch, v3):
    caplog.set_level(logging.DEBUG)
    loop = asyncio.get_running_loop()
    unhandled: list[dict] = []
    old_handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    workers: list[asyncio.Task] = []
    start = legacy_v2.LegacyV2.start

    def recording_start(self) -> None:
        start(self)
        workers.append(self.worker)

    monkeypatch.setattr(legacy_v2.LegacyV2, "start", recording_start)
    rng = random.Random(1515 + v3)
    try:
        async with running_server(tmp_path, legacy_grace_ms=50) as (srv, addr):
            for _ in range(5):
                await asyncio.gather(*(_one(addr, random.Random(rng.random()), v3) for _ in range(12)))
            await poll(lambda: not srv.connections)
            if workers:
                done, late = await asyncio.wait(workers, timeout=10)
                assert not late
                assert all(t.cancelled() or t.exception() is None for t in done)
            assert bool(workers) is not v3
        gc.collect()   # an unretrieved task exception is reported when the task is collected
    finally:
        loop.set_exception_handler(old_handler)
    assert unhandled == []
    bad = [r for r in caplog.records
           if r.exc_info or "never retrieved" in r.getMessage() or "request failed" in r.getMessage()]
    assert bad == [], [r.getMessage() for r in bad]
