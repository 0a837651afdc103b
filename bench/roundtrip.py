"""PING round trips per second: the NPLT server beside a bare asyncio echo server of the same framing.

Both servers run in subprocesses (uvloop when installed, like ``nplt-server``); the load generator
runs here. For 1 and 50 connections with 1 and 16 requests in flight, each connection sends PING
frames (``{"id": n}``) and counts replies: the NPLT server answers each with a JSON PONG after
decoding and validating the request; the bare server parses the same ``>BHH`` frames and echoes
the payload back in a reply frame, doing nothing else. Target: NPLT >= 0.9x bare at 50 connections.

    python bench/roundtrip.py [--seconds 1] [--rounds 3]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADER = struct.Struct(">BHH")
HELLO, PING, PONG = 0x20, 0x23, 0x24


def new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


# ---------------------------------------------------------------- the bare echo server (subprocess)
class BareEcho(asyncio.Protocol):
    """Parses >BHH frames and answers each with a PONG frame carrying the same payload."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        self.buf = b""
        self.seq = 0

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        pos, n, out = 0, len(buf), []
        while n - pos >= 5:
            _, _, ln = HEADER.unpack_from(buf, pos)
            end = pos + 5 + ln
            if end > n:
                break
            out.append(HEADER.pack(PONG, self.seq, ln) + buf[pos + 5:end])
            self.seq = (self.seq + 1) & 0xFFFF
            pos = end
        self.buf = buf[pos:]
        if out:
            self.t.write(b"".join(out))


async def run_echo(port_file: str) -> None:
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(BareEcho, "127.0.0.1", 0, backlog=1024)
    Path(port_file).write_text(str(srv.sockets[0].getsockname()[1]))
    await asyncio.Event().wait()


# ---------------------------------------------------------------- the load generator
class PingClient(asyncio.Protocol):
    def __init__(self, inflight: int, hello: bool) -> None:
        self.inflight, self.hello = inflight, hello
        self.buf = b""
        self.seq = 0
        self.next_id = 0
        self.count = 0
        self.running = False
        self.ready = asyncio.get_running_loop().create_future()

    def frame(self, t: int, payload: bytes) -> bytes:
        f = HEADER.pack(t, self.seq, len(payload)) + payload
        self.seq = (self.seq + 1) & 0xFFFF
        return f

    def ping(self) -> bytes:
        self.next_id += 1
        return self.frame(PING, b'{"id":%d}' % self.next_id)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        if self.hello:
            self.t.write(self.frame(HELLO, b'{"id":0,"proto":3,"client":"bench"}'))
        else:
            self.ready.set_result(None)

    def start(self) -> None:
        self.running = True
        self.t.write(b"".join(self.ping() for _ in range(self.inflight)))

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        pos, n, replies = 0, len(buf), 0
        while n - pos >= 5:
            t, _, ln = HEADER.unpack_from(buf, pos)
            end = pos + 5 + ln
            if end > n:
                break
            if t == PONG:
                replies += 1
            elif not self.ready.done():
                self.ready.set_result(None)  # the HELLO reply
            pos = end
        self.buf = buf[pos:]
        if replies and self.running:
            self.count += replies
            self.t.write(b"".join(self.ping() for _ in range(replies)))


async def measure(port: int, conns: int, inflight: int, seconds: float, hello: bool) -> float:
    loop = asyncio.get_running_loop()
    clients = []
    for _ in range(conns):
        _, c = await loop.create_connection(lambda: PingClient(inflight, hello), "127.0.0.1", port)
        clients.append(c)
    await asyncio.gather(*(c.ready for c in clients))
    for c in clients:
        c.start()
    await asyncio.sleep(seconds * 0.2)  # warm-up
    start_count, t0 = sum(c.count for c in clients), time.perf_counter()
    await asyncio.sleep(seconds)
    done, elapsed = sum(c.count for c in clients) - start_count, time.perf_counter() - t0
    for c in clients:
        c.running = False
        c.t.close()
    return done / elapsed


def start(cmd: list[str], port_file: Path) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env = {k: v for k, v in env.items() if not k.startswith("NPLT_")}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"could not start: {' '.join(cmd)}")
        time.sleep(0.05)
    return proc, int(port_file.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=1.0, help="measured seconds per round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per configuration (best kept)")
    ap.add_argument("--echo-server", metavar="PORT_FILE", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.echo_server:
        with asyncio.Runner(loop_factory=new_loop) as r:
            r.run(run_echo(args.echo_server))
        return
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        bare, bare_port = start([sys.executable, __file__, "--echo-server", str(tmpd / "bare.port")],
                                tmpd / "bare.port")
        nplt, nplt_port = start([sys.executable, "-m", "server.main", "--port", "0", "--port-file",
                                 str(tmpd / "nplt.port"), "--data-dir", str(tmpd / "data"), "--log-level",
                                 "error", "--max-clients", "1000"], tmpd / "nplt.port")
        try:
            print(f"{'conns':>5} {'in flight':>9} {'bare echo rt/s':>15} {'nplt rt/s':>12} {'ratio':>6}")
            for conns, inflight in ((1, 1), (1, 16), (50, 1), (50, 16)):
                b = n = 0.0
                with asyncio.Runner(loop_factory=new_loop) as r:
                    for _ in range(args.rounds):  # alternate, keep the best of each: less noise
                        b = max(b, r.run(measure(bare_port, conns, inflight, args.seconds, hello=False)))
                        n = max(n, r.run(measure(nplt_port, conns, inflight, args.seconds, hello=True)))
                print(f"{conns:>5} {inflight:>9} {b:>15,.0f} {n:>12,.0f} {n / b:>6.2f}x", flush=True)
        finally:
            for p in (bare, nplt):
                p.terminate()
                p.wait(10)


if __name__ == "__main__":
    main()
