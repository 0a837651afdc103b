"""Round trips per second and server CPU per round trip: the NPLT server beside a bare asyncio echo server.

The bare server (a subprocess of this script, same event loop as ``nplt-server``: uvloop when
installed) is an ``asyncio.Protocol`` that parses the same ``>BHH`` frames and answers each with a
frame of the same type: the request's own payload, or for HISTORY_REQUEST a canned page of the size
the NPLT server's real page has. It does nothing else, so it is the floor for any server in Python.

The load comes from bench/loadgen.c, a closed-loop epoll program compiled here with the system
``cc`` (one C process spends a fraction of the server's CPU per round trip, so the server is the
bottleneck; the old Python generator was not). Without ``cc``, several Python generator processes
(bench/loadgen.py) share the connections instead, and the figures say so. The servers are pinned to
the first core this process may use and the generator(s) to the others (``os.sched_setaffinity``)
when there are at least two.

Rows (50 connections; 1 or 16 requests in flight per connection, each reply answered by the next
request): v3 PING after HELLO, v2 ``CHAT_TEXT "HEARTBEAT"``, and v3 HISTORY_REQUEST reading 50-message
pages at varying offsets of one 10,000-message session. Each row runs ``--rounds`` times per server,
alternating which goes first; the ratio is the median of the paired nplt/bare ratios (their range in
brackets). CPU columns are microseconds of CPU per round trip, from the OS process accounting, of
each server process (srv) and of the load generator (gen); "cpu ratio" is srv bare / srv nplt, the
throughput ratio a saturated server would reach (steadier than rt/s on a shared machine). Targets (docs/server.md, Benchmarks):
v3 and v2 >= 0.9x at 50x1 and >= 0.6x at 50x16.

    python bench/roundtrip.py [--seconds 2] [--rounds 7] [--only v3:50x1,history:50x1] [--python-gen]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from benchclient import BenchClient, new_loop  # noqa: E402
from protocol import MsgType as T  # noqa: E402

HEADER = struct.Struct(">BHH")
HELLO_JSON = '{"id":0,"proto":3,"client":"bench"}'
HISTORY_MESSAGES = 10_000
WORDS = ("cpu", "memory", "disk", "usage", "process", "network", "load", "average", "内存", "磁盘",
         "the", "server", "is", "at", "percent", "check", "latency", "service", "restart", "log")


# ---------------------------------------------------------------- the bare echo server (subprocess)
class BareEcho(asyncio.Protocol):
    """Parses >BHH frames; answers each with a frame of its type: the same payload, or the canned page."""

    page = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        self.buf = b""
        self.seq = 0

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        pos, n, out = 0, len(buf), []
        while n - pos >= 5:
            t, _, ln = HEADER.unpack_from(buf, pos)
            end = pos + 5 + ln
            if end > n:
                break
            body = self.page if t == T.HISTORY_REQUEST else buf[pos + 5:end]
            out.append(HEADER.pack(t, self.seq, len(body)) + body)
            self.seq = (self.seq + 1) & 0xFFFF
            pos = end
        self.buf = buf[pos:]
        if out:
            self.t.write(b"".join(out))  # type: ignore[attr-defined]


async def run_echo(port_file: str, page_file: str | None) -> None:
    if page_file:
        BareEcho.page = Path(page_file).read_bytes()
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(BareEcho, "127.0.0.1", 0, backlog=1024)
    Path(port_file).write_text(str(srv.sockets[0].getsockname()[1]))
    await asyncio.Event().wait()


# ---------------------------------------------------------------- rows, generator, servers
class Row(NamedTuple):
    name: str          # v3 | v2 | history
    label: str
    conns: int
    inflight: int


class Workload(NamedTuple):
    hello: str         # HELLO payload, or "-"
    skip: int          # frames before the first reply (HELLO reply, v2 greeting)
    req_type: int
    template: str      # printf template: %u = request id, %u = "before"
    reply_type: int
    before_max: int


ROWS = [Row("v3", "v3 PING", 50, 1), Row("v3", "v3 PING", 50, 16),
        Row("v2", "v2 HEARTBEAT", 50, 1), Row("v2", "v2 HEARTBEAT", 50, 16),
        Row("history", "v3 HISTORY page", 50, 1)]


def workloads(session_id: str) -> dict[str, dict[str, Workload]]:
    """name -> {"bare": ..., "nplt": ...}: the same requests, each server's reply type and preamble."""
    ping = '{"id":%u}'
    page = '{"id":%u,"session_id":"' + session_id + '","before":%u,"limit":50}'
    return {
        "v3": {"bare": Workload(HELLO_JSON, 1, T.PING, ping, T.PING, 0),
               "nplt": Workload(HELLO_JSON, 1, T.PING, ping, T.PONG, 0)},
        "v2": {"bare": Workload("-", 0, T.CHAT_TEXT, "HEARTBEAT", T.CHAT_TEXT, 0),
               "nplt": Workload("-", 1, T.CHAT_TEXT, "HEARTBEAT", T.CHAT_TEXT, 0)},  # skip the greeting
        "history": {"bare": Workload(HELLO_JSON, 1, T.HISTORY_REQUEST, page, T.HISTORY_REQUEST, HISTORY_MESSAGES),
                    "nplt": Workload(HELLO_JSON, 1, T.HISTORY_REQUEST, page, T.RESPONSE, HISTORY_MESSAGES)},
    }


class Generator:
    """The compiled loadgen.c, or ``procs`` Python loadgen.py processes sharing the connections."""

    def __init__(self, tmp: Path, force_python: bool, cpus: set[int] | None) -> None:
        self.cpus = cpus
        cc = None if force_python else shutil.which("cc")
        self.cmd: list[str] | None = None
        if cc:
            exe = tmp / "loadgen"
            res = subprocess.run([cc, "-O2", "-o", str(exe), str(ROOT / "bench" / "loadgen.c")],
                                 capture_output=True, text=True)
            if res.returncode == 0:
                self.cmd = [str(exe)]
            else:
                print(f"cc failed, falling back to Python generators:\n{res.stderr}", file=sys.stderr)
        self.procs = 1 if self.cmd else max(2, len(cpus or ()) * 2)
        if self.cmd is None:
            self.cmd = [sys.executable, str(ROOT / "bench" / "loadgen.py")]
        self.kind = "C epoll generator (bench/loadgen.c)" if self.procs == 1 else \
            f"{self.procs} Python generator processes (no cc)"

    def run(self, port: int, row: Row, w: Workload, warmup: float, seconds: float,
            server: psutil.Process) -> tuple[float, float, float]:
        """(round trips/s, server CPU us per round trip, generator CPU us per round trip)."""
        shares = [row.conns // self.procs + (i < row.conns % self.procs) for i in range(self.procs)]
        procs = []
        for n in shares:
            args = ["127.0.0.1", port, n, row.inflight, warmup, seconds, w.hello, w.skip, w.req_type,
                    w.template, w.reply_type, w.before_max]
            p = subprocess.Popen(self.cmd + [str(a) for a in args], stdout=subprocess.PIPE, text=True)
            if self.cpus:
                os.sched_setaffinity(p.pid, self.cpus)
            procs.append(p)
        try:
            for p in procs:
                if p.stdout.readline().strip() != "start":  # type: ignore[union-attr]
                    raise SystemExit(f"load generator failed (exit {p.wait()})")
            srv0, t0 = sum(server.cpu_times()[:2]), time.perf_counter()
            ends = [p.stdout.readline().split() for p in procs]  # type: ignore[union-attr]
            srv_cpu, window = sum(server.cpu_times()[:2]) - srv0, time.perf_counter() - t0
        finally:
            for p in procs:
                if p.wait(30) != 0:
                    raise SystemExit(f"load generator exited with {p.returncode}")
        if any(len(e) != 5 for e in ends):
            raise SystemExit(f"load generator: unexpected output {ends}")
        count = sum(int(e[1]) for e in ends)
        errors = sum(int(e[4]) for e in ends)
        if errors:
            raise SystemExit(f"{errors} unexpected replies from the server ({row.label})")
        rate = sum(int(e[1]) / float(e[2]) for e in ends)
        if not count:
            raise SystemExit(f"no round trips in {window:.1f} s ({row.label}, {row.conns}x{row.inflight})")
        gen_cpu = sum(float(e[3]) for e in ends)
        done = max(count, 1)
        return rate, srv_cpu / max(rate * window, 1) * 1e6, gen_cpu / done * 1e6


def start(cmd: list[str], port_file: Path, cpus: set[int] | None) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env = {k: v for k, v in env.items() if not k.startswith("NPLT_")}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)
    deadline = time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"could not start: {' '.join(cmd)}")
        time.sleep(0.05)
    return proc, int(port_file.read_text())


def build_history(data_dir: Path) -> str:
    """A 10,000-message session of the local user (what a HELLO without a token gets); its id."""
    from storage import HistoryStore, StorageConfig, ToolCall
    rng = random.Random(7)

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    with HistoryStore(StorageConfig(root=str(data_dir), durability="batched", compact_threshold=10_000_000)) as st:
        sid = st.create("local", "history bench").session_id
        for i in range(HISTORY_MESSAGES):
            if i % 2 == 0:
                st.append(sid, "user", text(25))
            else:
                calls = [ToolCall(f"call_{i}", "sys_monitor", {"metric": "cpu"}, text(30), duration=0.01)] \
                    if i % 10 == 1 else []
                st.append(sid, "assistant", text(70), tool_calls=calls, metadata={"model": "offline"})
    return sid


async def real_page(port: int, session_id: str) -> bytes:
    """The JSON of one real page reply (the bare server's canned HISTORY_REQUEST answer)."""
    import orjson
    c = await BenchClient.connect(port)
    try:
        await c.call(T.HELLO, proto=3, client="bench")
        body = await c.call(T.HISTORY_REQUEST, session_id=session_id, before=HISTORY_MESSAGES // 2, limit=50)
    finally:
        c.close()
    assert len(body["messages"]) == 50, body
    return orjson.dumps(body)


def pick_cpus() -> tuple[set[int] | None, set[int] | None]:
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:      # not Linux
        return None, None
    if len(cpus) < 2:
        return None, None
    return {cpus[0]}, set(cpus[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=0.5, help="seconds of load before each measurement")
    ap.add_argument("--rounds", type=int, default=7,
                    help="runs per row and server (median kept; paired 2 s runs vary by up to 1.4x on a shared machine)")
    ap.add_argument("--only", metavar="NAME:CxP,...",
                    help="rows to run, e.g. v3:50x16,history:50x1 (names: v3, v2, history; default: all)")
    ap.add_argument("--python-gen", action="store_true", help="use the Python generator processes even if cc works")
    ap.add_argument("--echo-server", metavar="PORT_FILE", help=argparse.SUPPRESS)
    ap.add_argument("--page-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.echo_server:
        with asyncio.Runner(loop_factory=new_loop) as r:
            r.run(run_echo(args.echo_server, args.page_file))
        return
    rows = ROWS
    if args.only:
        try:
            rows = []
            for spec in args.only.split(","):
                name, _, cp = spec.partition(":")
                conns, inflight = (int(x) for x in cp.split("x"))
                label = next(r.label for r in ROWS if r.name == name)
                rows.append(Row(name, label, conns, inflight))
        except (ValueError, StopIteration):
            ap.error(f"--only: expected NAME:CONNSxINFLIGHT[,...] with NAME in v3, v2, history; got {args.only!r}")
    srv_cpus, gen_cpus = pick_cpus()
    tmp = Path(tempfile.mkdtemp(prefix="nplt-bench-rt-"))
    procs: list[subprocess.Popen] = []
    try:
        gen = Generator(tmp, args.python_gen, gen_cpus)
        t0 = time.perf_counter()
        sid = build_history(tmp / "data")  # (also: every HELLO attaches to it, no session is created)
        built = time.perf_counter() - t0
        nplt, nplt_port = start([sys.executable, "-m", "server.main", "--port", "0", "--port-file",
                                 str(tmp / "nplt.port"), "--data-dir", str(tmp / "data"), "--log-level",
                                 "error", "--max-clients", "1000", "--max-clients-per-ip", "0"], tmp / "nplt.port", srv_cpus)
        procs.append(nplt)
        (tmp / "page.json").write_bytes(asyncio.run(real_page(nplt_port, sid)))
        echo_cmd = [sys.executable, __file__, "--echo-server", str(tmp / "bare.port"), "--page-file",
                    str(tmp / "page.json")]
        bare, bare_port = start(echo_cmd, tmp / "bare.port", srv_cpus)
        procs.append(bare)
        servers = {"bare": (bare_port, psutil.Process(bare.pid)), "nplt": (nplt_port, psutil.Process(nplt.pid))}
        work = workloads(sid)
        loop_name = type(new_loop()).__module__.split(".")[0]
        pin = f"servers pinned to CPU {sorted(srv_cpus)}, generator to {sorted(gen_cpus)}" if srv_cpus else \
            "not pinned (fewer than 2 CPUs available)"
        print(f"Round trips: {gen.kind}; {loop_name} loop; {pin}; medians of {args.rounds} runs x "
              f"{args.seconds:g} s per server; history session of {HISTORY_MESSAGES} messages built in {built:.1f} s")
        print("ratio = median of the paired nplt/bare ratios of round trips/s (range); srv, gen = us of CPU per round "
              "trip of the server process and of the generator; cpu ratio = srv bare / srv nplt")
        print(f"{'row':<16} {'conns':>5} {'P':>3} {'bare rt/s':>10} {'nplt rt/s':>10} {'ratio':>6} {'(range)':>11} "
              f"{'srv bare':>9} {'srv nplt':>9} {'cpu ratio':>9} {'gen bare':>9} {'gen nplt':>9}")
        for name in dict.fromkeys(r.name for r in rows):  # warm both servers up, untimed
            for srv in ("bare", "nplt"):
                port, proc = servers[srv]
                gen.run(port, Row(name, name, 50, 16), work[name][srv], 0.3, 0.5, proc)
        for row in rows:
            res: dict[str, list[tuple[float, float, float]]] = {"bare": [], "nplt": []}
            for i in range(args.rounds):  # alternate which server goes first
                for srv in (("bare", "nplt") if i % 2 == 0 else ("nplt", "bare")):
                    port, proc = servers[srv]
                    res[srv].append(gen.run(port, row, work[row.name][srv], args.warmup, args.seconds, proc))
            b, n = ([statistics.median(col) for col in zip(*res[k])] for k in ("bare", "nplt"))
            paired = sorted(rn[0] / rb[0] for rb, rn in zip(res["bare"], res["nplt"]))
            span = f"({paired[0]:.2f}-{paired[-1]:.2f})"
            print(f"{row.label:<16} {row.conns:>5} {row.inflight:>3} {b[0]:>10,.0f} {n[0]:>10,.0f} "
                  f"{statistics.median(paired):>5.2f}x {span:>11} {b[1]:>9.1f} {n[1]:>9.1f} {b[1] / n[1]:>8.2f}x "
                  f"{b[2]:>9.2f} {n[2]:>9.2f}", flush=True)
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
