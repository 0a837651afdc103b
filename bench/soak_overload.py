"""Soak phase: overload, one attack at a time on one server, each measured on its own row:
many connections held open, a pipelined flood, clients that never read, abandoned fragmented
messages (HELLO, then 8 MiB of FRAGMENT frames, then close), and slowloris (a frame trickled one
byte at a time after HELLO)."""
from __future__ import annotations

import asyncio
import struct
import time

from protocol import Connection, MsgType, Role
from soak_common import Measured, Row, SoakServer
from testkit.server import V3Client

HEADER = struct.Struct(">BHH")


def hello_bytes(codec: Connection) -> bytes:
    return codec.send(MsgType.HELLO, {"id": 0, "proto": 3, "client": "soak/1"})


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    try:
        return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
    except (OSError, asyncio.TimeoutError):
        return None


def _close(writer: asyncio.StreamWriter) -> None:
    try:
        writer.close()
    except Exception:  # noqa: BLE001
        pass


async def many_connections(server: SoakServer, row: Row, *, n: int, hold_s: float) -> None:
    sem = asyncio.Semaphore(100)
    clients: list[V3Client] = []
    failed = 0

    async def one() -> None:
        nonlocal failed
        async with sem:
            try:
                clients.append(await asyncio.wait_for(V3Client.connect(("127.0.0.1", server.port)), 30))
            except Exception:  # noqa: BLE001 - a refused or failed handshake is counted
                failed += 1
    t0 = time.monotonic()
    await asyncio.gather(*(one() for _ in range(n)))
    opened = time.monotonic() - t0
    end = time.monotonic() + hold_s
    i = 0
    while time.monotonic() < end and clients:   # a light PING from the crowd while it is held
        c = clients[i % len(clients)]
        c.send(MsgType.PING, {"id": f"h{i}"})
        i += 1
        await asyncio.sleep(hold_s / max(1, n))
    await asyncio.gather(*(c.close() for c in clients))
    row.tried = f"{len(clients)} of {n} connections with HELLO in {opened:.1f} s, held {hold_s:g} s"
    if failed:
        row.failures.append(f"{failed} connections failed")


async def flood(server: SoakServer, row: Row, *, conns: int, requests: int, budget_s: float) -> None:
    """Each connection pipelines ``requests`` requests (STATS, PING, SESSION_INFO, SESSION_LIST) while
    reading; TOO_MANY_PENDING answers are expected, silence is not."""
    kinds = [MsgType.STATS, MsgType.PING, MsgType.SESSION_INFO, MsgType.SESSION_LIST]
    answered = 0
    busy = 0

    async def one(k: int) -> None:
        nonlocal answered
        pair = await _open(server.port)
        if pair is None:
            return
        reader, writer = pair
        codec = Connection(Role.CLIENT, max_message_size=64 << 20)
        writer.write(hello_bytes(codec))
        got = 0
        done = asyncio.Event()

        async def read() -> None:
            nonlocal got, busy
            try:
                while got < requests + 1:
                    data = await reader.read(1 << 16)
                    if not data:
                        break
                    for ev in codec.receive_data(data):
                        if getattr(ev, "type", None) in (MsgType.RESPONSE, MsgType.PONG, MsgType.ERROR):
                            got += 1
                            if ev.type == MsgType.ERROR and ev.body.get("code") == "TOO_MANY_PENDING":
                                busy += 1
            except Exception:  # noqa: BLE001
                pass
            done.set()
        rt = asyncio.create_task(read())
        try:
            chunk = []
            for i in range(1, requests + 1):
                chunk.append(codec.send(kinds[i % len(kinds)], {"id": i}))
                if len(chunk) == 200:
                    writer.write(b"".join(chunk))
                    chunk.clear()
                    await writer.drain()
            writer.write(b"".join(chunk))
            await writer.drain()
            await asyncio.wait_for(done.wait(), budget_s)
        except (OSError, asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            rt.cancel()
            _close(writer)
            answered += got
    await asyncio.gather(*(one(k) for k in range(conns)))
    row.tried = f"{conns}x{requests} pipelined requests: {answered} answered ({busy} TOO_MANY_PENDING)"
    if answered < conns * requests:
        row.failures.append(f"{conns * requests - answered} requests unanswered")


async def non_readers(server: SoakServer, row: Row, *, conns: int, requests: int, budget_s: float,
                      settle_s: float = 1.0) -> None:
    """HELLO, then requests pipelined without ever reading, until the socket stops taking them."""
    pairs = [p for p in await asyncio.gather(*(_open(server.port) for _ in range(conns))) if p]
    written = 0

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal written
        codec = Connection(Role.CLIENT)
        writer.write(hello_bytes(codec))
        try:
            for i in range(1, requests + 1, 100):
                writer.write(b"".join(codec.send(MsgType.SESSION_LIST if j % 2 else MsgType.STATS, {"id": j})
                                      for j in range(i, i + 100)))
                await asyncio.wait_for(writer.drain(), 2.0)
                written += 100
        except (OSError, asyncio.TimeoutError, ConnectionError):
            pass
    await asyncio.wait_for(asyncio.gather(*(one(*p) for p in pairs)), budget_s)
    await asyncio.sleep(settle_s)   # let the output back-pressure settle before closing (a measured pause)
    for _, w in pairs:
        _close(w)
    row.tried = f"{len(pairs)} non-reading connections, {written} requests written"


async def abandoned_fragments(server: SoakServer, row: Row, *, rounds: int, conns: int,
                              fragments: int = 127) -> None:
    piece = bytes(65535)
    done = 0
    for _ in range(rounds):
        async def one() -> None:
            nonlocal done
            pair = await _open(server.port)
            if pair is None:
                return
            reader, writer = pair
            codec = Connection(Role.CLIENT)
            data = [hello_bytes(codec)]
            seq = codec.tx_seq
            for k in range(fragments):
                data.append(HEADER.pack(0x7F, (seq + k) & 0xFFFF, len(piece)) + piece)
            try:
                writer.writelines(data)
                await asyncio.wait_for(writer.drain(), 30)
                done += 1
            except (OSError, asyncio.TimeoutError, ConnectionError):
                pass
            finally:
                _close(writer)
        await asyncio.gather(*(one() for _ in range(conns)))
    row.tried = f"{done} abandoned {fragments * 65535 / (1 << 20):.1f} MiB fragmented messages ({rounds} rounds)"


async def slowloris(server: SoakServer, row: Row, *, conns: int, duration_s: float,
                    message_timeout_s: float | None) -> None:
    """HELLO, then a CHAT_TEXT frame one byte per second; counts how many the server closed."""
    pairs = [p for p in await asyncio.gather(*(_open(server.port) for _ in range(conns))) if p]
    frames = []
    for reader, writer in pairs:
        codec = Connection(Role.CLIENT)
        writer.write(hello_bytes(codec))
        frames.append(codec.send(MsgType.CHAT_TEXT, {"id": 1, "text": "x" * 200}))
    end = time.monotonic() + duration_s
    k = 0
    while time.monotonic() < end:
        for (reader, writer), f in zip(pairs, frames):
            if k < len(f) and not writer.is_closing():
                try:
                    writer.write(f[k:k + 1])
                except (OSError, ConnectionError):
                    pass
        k += 1
        await asyncio.sleep(1.0)   # the trickle's own pace
    closed = 0
    for reader, writer in pairs:
        try:   # EOF, or a reset / broken pipe because the server closed while we kept trickling
            while (await asyncio.wait_for(reader.read(1 << 16), 0.05)):
                pass
            closed += 1
        except (OSError, ConnectionError):
            closed += 1
        except asyncio.TimeoutError:
            pass   # still open
        _close(writer)
    row.tried = f"{len(pairs)} slowloris connections after HELLO for {duration_s:g} s: {closed} closed by the server"
    if message_timeout_s is not None and duration_s > message_timeout_s + 2 and closed < len(pairs):
        row.failures.append(f"{len(pairs) - closed} still open after {duration_s:g} s "
                            f"(message_timeout_s = {message_timeout_s:g})")
    elif message_timeout_s is None:
        row.failures.append(f"{len(pairs) - closed} held a slot for {duration_s:g} s (no message_timeout_s)")


MESSAGE_TIMEOUT_S = 5.0   # the overload server's message_timeout_s: slowloris must be closed past it


def has_limit(name: str) -> bool:
    from server.config import LimitsConfig
    return name in LimitsConfig.model_fields


async def run(server: SoakServer, p: dict) -> list[Row]:
    rows = []
    await server.start()
    mto = MESSAGE_TIMEOUT_S if has_limit("message_timeout_s") else None
    attacks = [
        ("connections", lambda row: many_connections(server, row, n=p["connections"], hold_s=p["hold_s"])),
        ("flood", lambda row: flood(server, row, conns=p["flood_conns"], requests=p["flood_requests"],
                                    budget_s=p["budget_s"])),
        ("non-readers", lambda row: non_readers(server, row, conns=p["non_readers"], requests=p["nr_requests"],
                                                budget_s=p["budget_s"], settle_s=p["settle_s"])),
        ("fragments", lambda row: abandoned_fragments(server, row, rounds=p["frag_rounds"], conns=p["frag_conns"])),
        ("slowloris", lambda row: slowloris(server, row, conns=p["slowloris"], duration_s=p["slow_s"],
                                            message_timeout_s=mto)),
    ]
    for name, attack in attacks:
        row = Row(f"overload: {name}")
        rows.append(row)
        if not server.alive():
            row.failures.append("server not running")
            continue
        async with Measured(server, row, budget_s=p["budget_s"]):
            try:
                await asyncio.wait_for(attack(row), p["budget_s"] + p["slow_s"] + 30)
            except asyncio.TimeoutError:
                row.failures.append("attack over its time budget")
            await asyncio.sleep(p["settle_s"])   # "after": RSS this long after the attackers left
    if rows and rows[3].rss_mb:
        before, peak, after = rows[3].rss_mb
        if after > before + 64:
            rows[3].failures.append(f"RSS after {after:.0f} MB > before + 64 MB")
    return rows
