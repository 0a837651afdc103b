"""PING round trips per second: the NPLT server beside a bare asyncio echo server of the same framing.

Both servers run in subprocesses with the same event loop (uvloop when installed, like
``nplt-server``); one load generator (this process, same loop) drives both the same way. For 1 and 50
connections with 1 and 16 requests in flight, each connection sends PING frames (``{"id": n}``) and
counts replies: the NPLT server answers each with a JSON PONG after decoding and validating the
request; the bare server parses the same ``>BHH`` frames and echoes the payload back in a reply frame,
doing nothing else. Each configuration runs ``--rounds`` times, alternating which server goes first,
each run after a warm-up; the median is printed, with the CPU time per round trip spent by each
server process and by the load generator (from the OS process accounting), which shows where the
difference comes from. Target: NPLT >= 0.9x bare at 50 connections.

    python bench/roundtrip.py [--seconds 1] [--rounds 5] [--only 50x1,50x16]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import struct
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

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


async def measure(port: int, conns: int, inflight: int, seconds: float, hello: bool,
                  server: psutil.Process) -> tuple[float, float, float]:
    """(round trips/s, server CPU us per round trip, load generator CPU us per round trip)."""
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
    srv0, cli0 = sum(server.cpu_times()[:2]), time.process_time()
    await asyncio.sleep(seconds)
    done, elapsed = sum(c.count for c in clients) - start_count, time.perf_counter() - t0
    srv_cpu, cli_cpu = sum(server.cpu_times()[:2]) - srv0, time.process_time() - cli0
    for c in clients:
        c.running = False
        c.t.close()
    done = max(done, 1)
    return done / elapsed, srv_cpu / done * 1e6, cli_cpu / done * 1e6


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
    ap.add_argument("--rounds", type=int, default=5, help="alternating runs per configuration (median kept)")
    ap.add_argument("--only", metavar="CxF,...", help="configurations to run, e.g. 50x1,50x16 (default: all)")
    ap.add_argument("--echo-server", metavar="PORT_FILE", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.echo_server:
        with asyncio.Runner(loop_factory=new_loop) as r:
            r.run(run_echo(args.echo_server))
        return
    configs = [(1, 1), (1, 16), (50, 1), (50, 16)]
    if args.only:
        try:
            configs = [tuple(int(x) for x in c.split("x")) for c in args.only.split(",")]
        except ValueError:
            ap.error(f"--only: expected CONNSxINFLIGHT[,...], got {args.only!r}")
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        bare, bare_port = start([sys.executable, __file__, "--echo-server", str(tmpd / "bare.port")],
                                tmpd / "bare.port")
        nplt, nplt_port = start([sys.executable, "-m", "server.main", "--port", "0", "--port-file",
                                 str(tmpd / "nplt.port"), "--data-dir", str(tmpd / "data"), "--log-level",
                                 "error", "--max-clients", "1000"], tmpd / "nplt.port")
        servers = {"bare": (bare_port, False, psutil.Process(bare.pid)),
                   "nplt": (nplt_port, True, psutil.Process(nplt.pid))}
        loop_name = type(new_loop()).__module__.split(".")[0]
        print(f"PING round trips, {loop_name} loop, medians of {args.rounds} runs x {args.seconds:g} s; ratio ="
              f" median of the paired nplt/bare ratios (range in brackets); CPU = microseconds of CPU per round"
              f" trip of the server process (srv) and of the load generator (gen)")
        print(f"{'conns':>5} {'in flight':>9} {'bare rt/s':>10} {'nplt rt/s':>10} {'ratio':>6} {'(range)':>11} "
              f"{'srv CPU bare':>12} {'srv CPU nplt':>12} {'gen CPU bare':>12} {'gen CPU nplt':>12}")
        try:
            with asyncio.Runner(loop_factory=new_loop) as r:
                for port, hello, proc in servers.values():  # warm both servers up, untimed
                    r.run(measure(port, 50, 16, 0.5, hello, proc))
                for conns, inflight in configs:
                    res: dict[str, list[tuple[float, float, float]]] = {"bare": [], "nplt": []}
                    for i in range(args.rounds):  # alternate which server goes first
                        for name in (("bare", "nplt") if i % 2 == 0 else ("nplt", "bare")):
                            port, hello, proc = servers[name]
                            res[name].append(r.run(measure(port, conns, inflight, args.seconds, hello, proc)))
                    b, n = ([statistics.median(col) for col in zip(*res[k])] for k in ("bare", "nplt"))
                    paired = sorted(rn[0] / rb[0] for rb, rn in zip(res["bare"], res["nplt"]))
                    span = f"({paired[0]:.2f}-{paired[-1]:.2f})"
                    print(f"{conns:>5} {inflight:>9} {b[0]:>10,.0f} {n[0]:>10,.0f} {statistics.median(paired):>5.2f}x "
                          f"{span:>11} {b[1]:>12.2f} {n[1]:>12.2f} {b[2]:>12.2f} {n[2]:>12.2f}", flush=True)
        finally:
            for p in (bare, nplt):
                p.terminate()
                p.wait(10)


if __name__ == "__main__":
    main()
