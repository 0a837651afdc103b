"""Python fallback for bench/loadgen.c (same arguments, same output), used when there is no C compiler.

One process of this spends more CPU per round trip than the server does, so bench/roundtrip.py runs
several of them (each with a share of the connections) on the cores the server is not pinned to.

    python bench/loadgen.py HOST PORT CONNS INFLIGHT WARMUP_S SECONDS HELLO_JSON|- SKIP REQ_TYPE
                            REQ_TEMPLATE REPLY_TYPE BEFORE_MAX
"""
from __future__ import annotations

import asyncio
import struct
import sys
import time

HEADER = struct.Struct(">BHH")
FRAGMENT = 0x7F


class Gen(asyncio.Protocol):
    count = 0
    errors = 0

    def __init__(self, idx: int, args: Args) -> None:
        self.idx, self.a = idx, args
        self.seq = self.id = 0
        self.skip = args.skip
        self.buf = b""

    def frame(self, t: int, payload: bytes) -> bytes:
        f = HEADER.pack(t, self.seq, len(payload)) + payload
        self.seq = (self.seq + 1) & 0xFFFF
        return f

    def request(self) -> bytes:
        self.id += 1
        a = self.a
        before = 51 + (self.idx * 7919 + self.id) * 50 % (a.before_max - 100) if a.before_max > 100 else 0
        return self.frame(a.req_type, (a.template % (self.id, before)[:a.holes]).encode())

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        first = [] if self.a.hello == "-" else [self.frame(0x20, self.a.hello.encode())]
        self.t.write(b"".join(first + [self.request() for _ in range(self.a.inflight)]))  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        pos, n, out = 0, len(buf), []
        while n - pos >= 5:
            t, _, ln = HEADER.unpack_from(buf, pos)
            if pos + 5 + ln > n:
                break
            pos += 5 + ln
            if t == FRAGMENT or 0x30 <= t <= 0x38:  # fragments; v3 events (not replies)
                continue
            if self.skip:
                self.skip -= 1
            elif t == self.a.reply_type:
                Gen.count += 1
                out.append(self.request())
            else:
                Gen.errors += 1
        self.buf = buf[pos:]
        if out:
            self.t.write(b"".join(out))  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        print("loadgen: the server closed a connection", file=sys.stderr)
        raise SystemExit(3)


class Args:
    def __init__(self, argv: list[str]) -> None:
        (self.host, port, conns, inflight, warmup, seconds, self.hello, skip, req_type, template, reply_type,
         before_max) = argv
        self.port, self.conns, self.inflight, self.skip = int(port), int(conns), int(inflight), int(skip)
        self.warmup, self.seconds = float(warmup), float(seconds)
        self.req_type, self.reply_type = int(req_type, 0), int(reply_type, 0)
        self.template = template.replace("%u", "%d")
        self.holes = self.template.count("%d")   # (printf ignores extra arguments, % does not)
        self.before_max = int(before_max)


async def run(a: Args) -> None:
    loop = asyncio.get_running_loop()
    for i in range(a.conns):
        await loop.create_connection(lambda i=i: Gen(i, a), a.host, a.port)
    await asyncio.sleep(a.warmup)
    c0, t0, cpu0 = Gen.count, time.perf_counter(), time.process_time()
    print("start", flush=True)
    await asyncio.sleep(a.seconds)
    print(f"end {Gen.count - c0} {time.perf_counter() - t0:.6f} {time.process_time() - cpu0:.6f} {Gen.errors}",
          flush=True)


def main() -> None:
    if len(sys.argv) != 13:
        raise SystemExit(__doc__)
    a = Args(sys.argv[1:])
    try:
        import uvloop
        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = asyncio.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as r:
        r.run(run(a))


if __name__ == "__main__":
    main()
