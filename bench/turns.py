"""Turn benchmark with an instant scripted LLM: deltas relayed per second end to end, and server overhead per turn.

The server runs in a SUBPROCESS (this script with ``--serve``; uvloop when installed, like
``nplt-server``) with the production wiring: the factory builds the OpenAIAgent from the ``[llm]``
section, the memory layer is the real MemoryManager, storage is the real store (``--durability``,
default ``fsync`` as in production). Summarization is off so that no background summary takes a
scripted reply. The scripted OpenAI-compatible server (tests/testkit/scripted_llm.py) and the v3
client run in this process, on loopback.

The load generator is this process: the scripted model, the openai client of the baselines and the
v3 client. Every phase prints its CPU seconds and those of the server subprocess (psutil, as
bench/load.py), each split into the server's turns and the direct baselines, so a reader sees which
side is the busier one: the turns run one at a time, so a latency or rate measured while this
process is near 100 % of one core is bounded by the generator, not by the server.

Measured, in the same run:
- **overhead per turn**: a no-op turn (the scripted model streams "ok" at once) timed by the client from
  CHAT_TEXT to TURN_END, minus the model's own time, measured two ways: (a) the baseline, the same
  request replayed straight to the scripted endpoint with the openai client (interleaved with the
  turns so drift hits both), (b) the scripted server's own time per request (request read to last byte
  written). (a) is the target figure: it charges the openai client's own cost to the LLM, (b) to the server.
- **deltas relayed per second per stream**: one answer of ``--deltas`` small deltas, counted by the
  client from the first ANSWER_DELTA to the last, beside the openai client's typed stream reading the
  same stream directly (the ceiling before the agent read raw SSE, docs/agent.md), and beside a second
  server subprocess whose agent is the test kit's EchoAgent (``!tokens N``: the server's own relay rate,
  no openai client involved).

    .venv/bin/python bench/turns.py [--turns 300] [--deltas 20000] [--durability fsync|batched]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from benchclient import BenchClient as Client  # noqa: E402
from benchclient import new_loop  # noqa: E402
from protocol import MsgType  # noqa: E402
from testkit.scripted_llm import Recorded, Reply, ScriptedLLM  # noqa: E402

T = MsgType
TARGET_RATE = 20_000      # deltas/s per stream
TARGET_OVERHEAD_MS = 2.0  # per turn
MODEL = "scripted-model"
WORDS = ("cpu", "memory", "disk", "nginx", "postgres", "backup", "cron", "latency", "swap", "port", "tls", "cert",
         "deploy", "docker", "kernel", "upgrade", "log", "error", "timeout", "dns", "load", "inode", "raid", "mount",
         "redis", "queue", "worker", "restart", "firewall", "ssh", "user", "quota", "journal", "uptime", "alert")


def question(i: int) -> str:
    """A short ops question; the words vary like a real conversation's (recall indexes every turn)."""
    n = len(WORDS)
    return f"turn {i}: what about {WORDS[i % n]} and {WORDS[(i * 7 + 3) % n]} on {WORDS[(i * 13 + 5) % n]}?"



# ---------------------------------------------------------------- server side (subprocess)
async def serve(port_file: str, data_dir: str, llm_url: str, agent_kind: str, durability: str) -> None:
    """The production wiring (agent from [llm], real memory); ``echo`` swaps in the test kit's EchoAgent."""
    import signal

    from server.app import Server
    from server.config import ServerConfig
    cfg = ServerConfig.from_dict({
        "server": {"host": "127.0.0.1", "port": 0, "log_level": "warning"},
        "storage": {"root": data_dir, "durability": durability},
        "llm": {"base_url": llm_url, "api_key": "bench-key", "model": MODEL, "retries": 0},
        "summarization": {"enabled": False}}, env={})
    agent = None
    if agent_kind == "echo":
        from testkit.echo_agent import EchoAgent
        agent = EchoAgent()
    srv = Server(cfg, agent=agent)
    _, port = await srv.start()
    Path(port_file).write_text(f"{port} {type(srv.agent).__name__} {type(srv.memory).__name__}")
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await srv.stop()


@asynccontextmanager
async def server_process(args: argparse.Namespace, llm_url: str,
                         agent_kind: str) -> AsyncIterator[tuple[Client, str, int]]:
    """Start the server subprocess; yields a connected v3 client (HELLO done), a description and its pid."""
    with tempfile.TemporaryDirectory(prefix="nplt-bench-turns-") as tmp:
        port_file = Path(tmp) / "port"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NPLT_", "OPENAI_"))}
        proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file), str(Path(tmp) / "data"),
                                 llm_url, agent_kind, "--durability", args.durability], env=env)
        try:
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text()):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the server subprocess did not start")
                await asyncio.sleep(0.02)
            port, agent_name, memory_name = port_file.read_text().split()
            reader, writer = await asyncio.open_connection("127.0.0.1", int(port))
            client = Client(reader, writer)
            await client.call(T.HELLO, proto=3, client="bench-turns")
            try:
                yield client, f"{agent_name} + {memory_name}", proc.pid
            finally:
                writer.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)


# ---------------------------------------------------------------- the scripted model, timed
class TimedLLM(ScriptedLLM):
    """The scripted server, recording how long it spent answering each request (its own time)."""

    def __init__(self) -> None:
        super().__init__(model=MODEL)
        self.served: list[float] = []

    async def _respond(self, req: Recorded, writer: asyncio.StreamWriter) -> bool:
        keep = await super()._respond(req, writer)
        self.served.append(time.monotonic() - req.at)
        return keep


# ---------------------------------------------------------------- CPU of both sides
class CpuMeter:
    """CPU seconds (user + system) of this process (the load generator) and of the server
    subprocess, and wall seconds, summed per phase over the spans measured with ``span(phase)``."""

    def __init__(self) -> None:
        self.phases: dict[str, list[float]] = {}     # phase -> [wall, generator CPU, server CPU]
        self.server: Any = None

    def attach(self, pid: int) -> None:
        import psutil
        self.server = psutil.Process(pid)

    def _server_cpu(self) -> float:
        t = self.server.cpu_times()
        return t.user + t.system

    @asynccontextmanager
    async def span(self, phase: str) -> AsyncIterator[None]:
        w0, g0, s0 = time.perf_counter(), time.process_time(), self._server_cpu()
        yield
        s1, g1, w1 = self._server_cpu(), time.process_time(), time.perf_counter()
        acc = self.phases.setdefault(phase, [0.0, 0.0, 0.0])
        acc[0] += w1 - w0
        acc[1] += g1 - g0
        acc[2] += s1 - s0


# ---------------------------------------------------------------- measurements
async def direct(oai: Any, body: dict[str, Any]) -> tuple[float, int, float]:
    """The same request straight to the scripted endpoint: (seconds, text deltas, first -> last delta).

    Sent as the agent sends it (messages and tools in ``extra_body``, docs/agent.md), so the SDK's
    own cost is the same on both sides."""
    body = dict(body)
    extra = {k: body.pop(k) for k in ("messages", "tools", "tool_choice") if k in body}
    t0 = time.perf_counter()
    stream = await oai.chat.completions.create(**body, messages=[], extra_body=extra)
    deltas, first, last = 0, 0.0, 0.0
    async for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                last = time.perf_counter()
                if not deltas:
                    first = last
                deltas += 1
    return time.perf_counter() - t0, deltas, last - first


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


async def run(args: argparse.Namespace) -> None:
    import openai
    cpu = CpuMeter()
    async with TimedLLM() as llm:
        oai = openai.AsyncOpenAI(base_url=llm.base_url, api_key="bench-key", max_retries=0)
        try:
            async with server_process(args, llm.base_url, "llm") as (client, wiring, pid):
                print(f"server: subprocess ({wiring}), storage durability={args.durability}; "
                      f"scripted LLM and v3 client in this process; loopback TCP")
                cpu.attach(pid)
                results = await measure(args, llm, client, oai, cpu)
        finally:
            await oai.close()
        async with server_process(args, llm.base_url, "echo") as (client, _, pid):
            cpu.attach(pid)
            rates = []
            for _ in range(args.streams):
                async with cpu.span("long streams, EchoAgent server"):
                    _, deltas, span, _ = await client.turn(f"!tokens {args.deltas}")
                assert deltas == args.deltas
                rates.append(deltas / span)
            results["echo_rate"] = statistics.median(rates)
    report(args, results)
    report_cpu(cpu)


async def measure(args: argparse.Namespace, llm: TimedLLM, client: Client, oai: Any,
                  cpu: CpuMeter) -> dict[str, Any]:
    for i in range(args.warmup):            # imports, connection pools, caches on both sides
        llm.push(Reply.text("ok"), Reply.text("ok"))
        await client.turn(question(args.turns + i))
        await direct(oai, llm.requests[-1].body)

    turn_s, base_s, served_s, gap_s = [], [], [], []
    for i in range(args.turns):             # a no-op turn, then the very request it made, sent directly
        llm.push(Reply.text("ok"))
        served_before = len(llm.served)
        async with cpu.span("no-op turns through the server"):
            dt, deltas, _, _ = await client.turn(question(i))
        assert deltas == 1 and len(llm.served) == served_before + 1
        served = llm.served[-1]
        llm.push(Reply.text("ok"))
        async with cpu.span("  the same requests, openai client direct"):
            base, _, _ = await direct(oai, llm.requests[-1].body)
        turn_s.append(dt)
        base_s.append(base)
        served_s.append(served)
        gap_s.append(dt - served)

    pieces = [f"t{i % 10} " for i in range(args.deltas)]
    e2e_rates, direct_rates = [], []
    for i in range(args.streams):
        llm.push(Reply.text(*pieces))
        async with cpu.span("long streams through the server"):
            _, deltas, span, _ = await client.turn(f"long answer {i}")
        assert deltas == args.deltas, (deltas, args.deltas)
        e2e_rates.append(deltas / span)
        llm.push(Reply.text(*pieces))
        async with cpu.span("  the same streams, openai client direct"):
            _, deltas, span = await direct(oai, llm.requests[-1].body)
        assert deltas == args.deltas
        direct_rates.append(deltas / span)
    return {"turn": turn_s, "base": base_s, "served": served_s, "gap": gap_s,
            "rate": statistics.median(e2e_rates), "direct_rate": statistics.median(direct_rates)}


def report(args: argparse.Namespace, r: dict[str, Any]) -> None:
    ms = 1000.0
    med = statistics.median
    over_a = med(r["turn"]) - med(r["base"])
    rate = r["rate"]
    rows = [
        ("no-op turn latency, client CHAT_TEXT -> TURN_END", f"p50 {med(r['turn']) * ms:.2f} ms",
         f"p95 {pct(r['turn'], 95) * ms:.2f} ms", ""),
        ("  baseline: same request, openai client -> scripted", f"p50 {med(r['base']) * ms:.2f} ms",
         f"p95 {pct(r['base'], 95) * ms:.2f} ms", ""),
        ("  scripted server's own time per request", f"p50 {med(r['served']) * ms:.3f} ms",
         f"p95 {pct(r['served'], 95) * ms:.3f} ms", ""),
        ("server overhead per turn (a): turn - baseline", f"{over_a * ms:.2f} ms",
         f"target < {TARGET_OVERHEAD_MS:g} ms", "PASS" if over_a * ms < TARGET_OVERHEAD_MS else "MISS"),
        ("server overhead per turn (b): turn - scripted time", f"p50 {med(r['gap']) * ms:.2f} ms",
         f"p95 {pct(r['gap'], 95) * ms:.2f} ms", "(incl. openai client)"),
        (f"deltas/s per stream, end to end ({args.deltas:,} deltas)", f"{rate:,.0f}/s",
         f"target >= {TARGET_RATE:,}/s", "PASS" if rate >= TARGET_RATE else "MISS"),
        ("  baseline: openai client reading the same stream", f"{r['direct_rate']:,.0f}/s",
         f"e2e/baseline {rate / r['direct_rate']:.2f}", ""),
        ("  server relay without the openai client (EchoAgent)", f"{r['echo_rate']:,.0f}/s",
         f"vs target {r['echo_rate'] / TARGET_RATE:.1f}x", ""),
    ]
    print(f"\n{args.turns} no-op turns (after {args.warmup} warm-up), {args.streams} long streams each; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    width = max(len(row[0]) for row in rows)
    for name, a, b, verdict in rows:
        print(f"{name:<{width}}  {a:>16}  {b:>22}  {verdict}")


def report_cpu(cpu: CpuMeter) -> None:
    """Per phase: wall, CPU of this process (scripted LLM + openai client + v3 client) and of the server."""
    print("\nCPU per phase (% of one core over the phase's wall time); the load generator is this process "
          "(scripted LLM, openai client, v3 client)")
    width = max(len(name) for name in cpu.phases)
    print(f"{'phase':<{width}}  {'wall s':>7}  {'generator CPU':>20}  {'server CPU':>20}  busier")
    for name, (wall, gen, srv) in cpu.phases.items():
        busier = "generator" if gen > srv else "server"
        sat = " (generator near one core: it bounds this figure)" if gen >= 0.8 * wall else ""
        print(f"{name:<{width}}  {wall:7.2f}  {gen:7.2f} s ({gen / wall:5.0%})  {srv:7.2f} s ({srv / wall:5.0%})  "
              f"{busier}{sat}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=300, help="no-op turns measured")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--deltas", type=int, default=20_000, help="deltas in each long answer")
    ap.add_argument("--streams", type=int, default=2, help="long answers measured (per path)")
    ap.add_argument("--durability", choices=("fsync", "batched"), default="fsync")
    ap.add_argument("--serve", nargs=4, metavar=("PORT_FILE", "DATA_DIR", "LLM_URL", "AGENT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        with asyncio.Runner(loop_factory=new_loop) as r:
            r.run(serve(*args.serve, args.durability))
        return
    with asyncio.Runner(loop_factory=new_loop) as r:
        r.run(run(args))


if __name__ == "__main__":
    main()
