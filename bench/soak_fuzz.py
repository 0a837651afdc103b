"""Soak phase: a protocol fuzzer over TCP. Each connection is v3 (a HELLO first) or v2 (anything else
first); it sends a burst of frames, half of them valid requests and half mutated (bit flips, wrong
type codes, seq jumps, lengths that lie, cut frames, empty fragments, JSON that is not an object or
not UTF-8, oversized fields), half-closes, and reads what comes back until EOF or a deadline. The
server must stay up, answer a clean client afterwards, and log no traceback."""
from __future__ import annotations

import asyncio
import random
import struct
import time


from protocol import Connection, MsgType, Role
from soak_common import Row, SoakServer
from testkit.server import V3Client

HEADER = struct.Struct(">BHH")
V3_REQUESTS = [
    (MsgType.CHAT_TEXT, lambda r: {"text": "fuzz " + "x" * r.randrange(40)}),
    (MsgType.HISTORY_REQUEST, lambda r: {"limit": r.choice([1, 50, 0, -1, "a", None])}),
    (MsgType.HISTORY_SEARCH, lambda r: {"query": r.choice(["a", "", "x" * 300, 7])}),
    (MsgType.HISTORY_EXPORT, lambda r: {"format": r.choice(["json", "markdown", "pdf"])}),
    (MsgType.SESSION_LIST, lambda r: {"limit": r.choice([1, 10, 10**9])}),
    (MsgType.SESSION_NEW, lambda r: {"title": r.choice(["t", "", None, "x" * 500])}),
    (MsgType.SESSION_SWITCH, lambda r: {"session_id": r.choice(["s_20260101_000000000000", "../etc", ""])}),
    (MsgType.SESSION_RENAME, lambda r: {"title": "renamed"}),
    (MsgType.SESSION_INFO, lambda r: {}),
    (MsgType.SESSION_DELETE, lambda r: {"session_id": "s_20260101_000000000000"}),
    (MsgType.CLEAR_REQUEST, lambda r: {}),
    (MsgType.CHAT_CANCEL, lambda r: {}),
    (MsgType.MODEL_LIST, lambda r: {}),
    (MsgType.MODEL_SWITCH, lambda r: {"model": r.choice(["offline", "nope", ""])}),
    (MsgType.STATS, lambda r: {}),
    (MsgType.PING, lambda r: {}),
]
V2_TYPES = [0x01, 0x0A, 0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x14, 0x15, 0x16, 0x17, 0x18, 0x20, 0x23, 0x7F, 0xFF]


def _mutate(r: random.Random, frame: bytes) -> bytes:
    kind = r.randrange(9)
    b = bytearray(frame)
    if kind == 0 and len(b) > 5:                       # flip bytes of the payload
        for _ in range(r.randint(1, 4)):
            b[r.randrange(5, len(b))] = r.randrange(256)
    elif kind == 1:                                    # another type code
        b[0] = r.randrange(256)
    elif kind == 2:                                    # seq jump
        b[1:3] = struct.pack(">H", r.randrange(65536))
    elif kind == 3:                                    # a length that lies (longer: the next frame is eaten)
        b[3:5] = struct.pack(">H", min(65535, len(b) - 5 + r.randint(1, 40)))
    elif kind == 4:                                    # cut short
        b = b[:r.randrange(1, max(2, len(b)))]
    elif kind == 5:                                    # an empty FRAGMENT
        b = bytearray(HEADER.pack(0x7F, frame[1] << 8 | frame[2], 0))
    elif kind == 6:                                    # JSON that is not an object, or not UTF-8
        p = r.choice([b"[1,2]", b"\"s\"", b"\xff\xfe{", b"{\"id\":" + b"[" * 200, b"null", b"{\"id\":1e999}"])
        b = bytearray(HEADER.pack(b[0], frame[1] << 8 | frame[2], len(p)) + p)
    elif kind == 7:                                    # a fragment run that never finishes
        b = bytearray(HEADER.pack(0x7F, frame[1] << 8 | frame[2], 300) + bytes(300))
    else:                                              # random bytes
        b = bytearray(r.randbytes(r.randrange(1, 64)))
    return bytes(b)


def _frames(r: random.Random, v3: bool, n: int) -> list[bytes]:
    out: list[bytes] = []
    if v3:
        codec = Connection(Role.CLIENT)
        out.append(codec.send(MsgType.HELLO, {"id": 0, "proto": 3, "client": "fuzz/1"}))
        for i in range(1, n):
            t, body = r.choice(V3_REQUESTS)
            frame = codec.send(t, {"id": i, **body(r)})
            out.append(_mutate(r, frame) if r.random() < 0.5 else frame)
    else:
        seq = 0
        for _ in range(n):
            t = r.choice(V2_TYPES[:13]) if r.random() < 0.7 else r.choice(V2_TYPES)
            p = r.choice([b"hello", b"/history", b"", r.randbytes(r.randrange(80)), "你好".encode()])
            frame = HEADER.pack(t, seq, len(p)) + p
            seq = (seq + 1) & 0xFFFF
            out.append(_mutate(r, frame) if r.random() < 0.5 else frame)
    return out


async def _one(port: int, frames: list[bytes], read_s: float) -> int:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
    except (OSError, asyncio.TimeoutError):
        return 0
    sent = 0
    try:
        for f in frames:
            if writer.is_closing():
                break
            writer.write(f)
            sent += 1
        await asyncio.wait_for(writer.drain(), read_s)
        if writer.can_write_eof():
            writer.write_eof()
        end = time.monotonic() + read_s
        while time.monotonic() < end:
            data = await asyncio.wait_for(reader.read(1 << 16), max(0.01, end - time.monotonic()))
            if not data:
                break
    except (OSError, asyncio.TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()
    return sent


async def run(server: SoakServer, row: Row, *, frames: int, per_conn: int, workers: int,
              budget_s: float, seed: int = 15) -> None:
    r = random.Random(seed)
    deadline = time.monotonic() + budget_s
    sent = conns = v3 = 0
    queue: asyncio.Queue[list[bytes] | None] = asyncio.Queue(maxsize=workers * 2)

    async def worker() -> None:
        nonlocal sent, conns
        while (batch := await queue.get()) is not None:
            n = await _one(server.port, batch, 2.0)
            sent += n
            conns += 1

    tasks = [asyncio.create_task(worker()) for _ in range(workers)]
    planned = 0
    while planned < frames and time.monotonic() < deadline and server.alive():
        is_v3 = r.random() < 0.6
        v3 += is_v3
        batch = _frames(r, is_v3, per_conn)
        planned += len(batch)
        await queue.put(batch)
    for _ in tasks:
        await queue.put(None)
    await asyncio.gather(*tasks)
    row.tried = f"{sent} frames on {conns} connections ({v3} v3, {conns - v3} v2)"
    row.extra.update(frames=sent, connections=conns)
    if planned < frames:
        row.failures.append(f"only {planned} of {frames} frames planned in the time budget")
    try:   # the server still serves a clean client
        c = await V3Client.connect(("127.0.0.1", server.port))
        await c.call(MsgType.STATS)
        await c.close()
    except Exception as exc:  # noqa: BLE001 - any failure is the finding
        row.failures.append(f"clean client after the fuzz failed: {exc!r}")
