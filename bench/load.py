"""Load test: N concurrent v3 clients each running turns; turns/s, turn latency, server RSS, integrity.

The server runs in a subprocess (this script with ``--serve``, uvloop when installed, the garbage
collector tuned as in ``nplt-server``: ``server.main.tune_gc``) with either the
echo agent of the test kit (default) or the real offline agent (``--agent offline``), storing with
the default durable fsync mode. Each client says HELLO, opens its own session and sends ``--turns``
chat messages one after another, timing each from the send to its TURN_END. Afterwards every session's
history is read back and checked: each user message exactly once, in order, each followed by its
answer (no message lost or duplicated).

Also printed: the CPU seconds the server process and this load generator spent while the clients ran
(psutil), so a generator that saturates its core is visible; the generator is one asyncio process
(uvloop when installed) and spends a small fraction of what the server does per turn.

    python bench/load.py [--clients 200] [--turns 5] [--agent echo|offline] [--durability fsync|batched]
                         [--memory manager|basic] [--io-threads N] [--lru-size N] [--fsync-threads N]
                         [--switch-ms MS] [--profile FILE]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from benchclient import BenchClient as Client  # noqa: E402
from benchclient import new_loop  # noqa: E402
from protocol import MsgType  # noqa: E402

T = MsgType



# ---------------------------------------------------------------- server side (subprocess)
async def serve(port_file: str, data_dir: str, agent_kind: str, max_clients: int, durability: str,
                users: int, io_threads: int, switch_ms: float, lru_size: int, fsync_threads: int,
                memory: str, profile: str | None = None) -> None:
    from server.app import Server
    from server.main import tune_gc
    from server.config import ServerConfig
    agent = None
    if agent_kind == "echo":
        from testkit.echo_agent import EchoAgent
        agent = EchoAgent(chunks=8)
    from server.auth import hash_token
    auth = {"users": [{"user_id": f"u{i}", "token_sha256": hash_token(f"token-{i}")} for i in range(users)]}
    cfg = ServerConfig.from_dict({"server": {"host": "127.0.0.1", "port": 0},
                                  "limits": {"max_clients": max_clients, "max_clients_per_ip": 0}, "auth": auth,
                                  "storage": {"root": data_dir, "durability": durability,
                                              **({"io_threads": io_threads} if io_threads else {}),
                                              **({"lru_size": lru_size} if lru_size else {}),
                                              **({"fsync_threads": fsync_threads} if fsync_threads else {})}})
    if switch_ms:
        sys.setswitchinterval(switch_ms / 1000)
    srv = Server(cfg, agent=agent, memory="basic" if memory == "basic" else None)
    _, port = await srv.start()
    tune_gc(cfg.server.gc_gen0_threshold)     # as nplt-server does once listening
    Path(port_file).write_text(str(port))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    fl = srv.store.sync.flusher
    before = (fl.batches, fl.fsyncs, fl.wal.checkpoint_fsyncs)
    prof = None
    if profile:     # the event-loop thread only (cProfile follows one thread), while the clients run
        import cProfile
        prof = cProfile.Profile(time.thread_time)   # CPU time: GIL waits and preemption excluded
        marks: list[dict[str, float]] = []

        def mark(on: bool) -> None:
            marks.append(thread_cpu())
            prof.enable() if on else prof.disable()
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, mark, True)
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, mark, False)
    await stop.wait()
    if profile and len(marks) == 2:      # CPU seconds of each thread (by name) while the clients ran
        names = sorted(set(marks[1]), key=lambda n: marks[0].get(n, 0) - marks[1][n])
        Path(profile + ".threads").write_text("".join(
            f"{marks[1][n] - marks[0].get(n, 0):8.3f} s  {n}\n" for n in names))
    if prof is not None:
        prof.disable()
        prof.dump_stats(profile)
    # group-commit figures for the parent (rounds with waiters, WAL fsyncs, journal fsyncs of the
    # checkpoints; verify reads none)
    Path(port_file + ".stats").write_text(f"{fl.batches - before[0]} {fl.fsyncs - before[1]} "
                                          f"{fl.wal.checkpoint_fsyncs - before[2]}")
    await srv.stop()


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of this process's threads, summed by thread name (/proc)."""
    import re
    import threading
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for t in threading.enumerate():
        try:
            fields = Path(f"/proc/self/task/{t.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        name = re.sub(r"_\d+$", "", t.name)         # pool threads share their prefix
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


# ---------------------------------------------------------------- clients
async def one_client(port: int, idx: int, turns: int, latencies: list[float], texts: dict, users: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    c = Client(reader, writer)
    await c.call(T.HELLO, proto=3, client="bench-load", **({"token": f"token-{idx}"} if users else {}))
    sid = (await c.call(T.SESSION_NEW, title=f"load {idx}"))["session"]["session_id"]
    sent: list[str] = []
    texts[sid] = (idx, sent)
    for k in range(turns):
        text = f"client {idx} turn {k}: how is the disk doing?"
        sent.append(text)
        dt, _, _, turn_sid = await c.turn(text)
        assert turn_sid == sid
        latencies.append(dt)
    writer.close()


async def verify(port: int, texts: dict[str, tuple[int, list[str]]], users: int) -> tuple[int, int]:
    """(sessions checked, problems found) by reading every history back as its owner."""
    problems = 0
    for sid, (idx, sent) in texts.items():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        c = Client(reader, writer)
        await c.call(T.HELLO, proto=3, client="bench-verify", **({"token": f"token-{idx}"} if users else {}))
        page = await c.call(T.HISTORY_REQUEST, session_id=sid, limit=200)
        writer.close()
        msgs = page["messages"]
        users = [m["content"] for m in msgs if m["role"] == "user"]
        roles = [m["role"] for m in msgs]
        if users != sent or roles != ["user", "assistant"] * len(sent) or page["total"] != 2 * len(sent):
            problems += 1
            print(f"  MISMATCH in {sid}: {len(users)} user messages, roles {roles[:6]}...")
    return len(texts), problems


async def stream_rate(port: int, tokens: int, users: int) -> float:
    """Deltas per second of one streamed answer (echo agent "!tokens N"), TURN_START to TURN_END."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    c = Client(reader, writer)
    await c.call(T.HELLO, proto=3, client="bench-stream", **({"token": "token-0"} if users else {}))
    r = await c.call(T.CHAT_TEXT, text=f"!tokens {tokens}")
    t0, deltas = None, 0
    while True:
        m = await c.next()
        if m.type == T.TURN_START:
            t0 = time.perf_counter()
        elif m.type == T.ANSWER_DELTA:
            deltas += 1
        elif m.type in (T.TURN_END, T.TURN_ERROR) and m.body["turn_id"] == r["turn_id"]:
            writer.close()
            assert deltas == tokens, (deltas, tokens)
            return deltas / (time.perf_counter() - t0)


async def run_clients(port: int, n: int, turns: int, users: int) -> tuple[float, list[float], dict]:
    latencies: list[float] = []
    texts: dict[str, list[str]] = {}
    t0 = time.perf_counter()
    results = await asyncio.gather(*(one_client(port, i, turns, latencies, texts, users) for i in range(n)),
                                   return_exceptions=True)
    elapsed = time.perf_counter() - t0
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        print(f"  {len(errors)} clients failed, first: {errors[0]!r}")
    return elapsed, latencies, texts


def main_thread_cpu(ps) -> float:
    """CPU seconds of the server's main (event loop) thread."""
    for t in ps.threads():
        if t.id == ps.pid:
            return t.user_time + t.system_time
    return 0.0


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--turns", type=int, default=5, help="turns per client")
    ap.add_argument("--agent", choices=("echo", "offline"), default="echo")
    ap.add_argument("--durability", choices=("fsync", "batched"), default="fsync")
    ap.add_argument("--memory", choices=("manager", "basic"), default="manager",
                    help="the server's memory layer: the real MemoryManager (default) or BasicMemory")
    ap.add_argument("--single-user", action="store_true",
                    help="all clients are the single user 'local' (every session event fans out to all)")
    ap.add_argument("--io-threads", type=int, default=0, help="[storage] io_threads (default: the config default)")
    ap.add_argument("--lru-size", type=int, default=0, help="[storage] lru_size (default: the config default)")
    ap.add_argument("--fsync-threads", type=int, default=0,
                    help="[storage] fsync_threads (default: the config default)")
    ap.add_argument("--switch-ms", type=float, default=0,
                    help="server sys.setswitchinterval in ms (default: Python's 5 ms)")
    ap.add_argument("--profile", metavar="FILE",
                    help="write a cProfile of the server's event-loop thread to FILE (pstats format)")
    ap.add_argument("--serve", nargs=2, metavar=("PORT_FILE", "DATA_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        with asyncio.Runner(loop_factory=new_loop) as r:
            r.run(serve(args.serve[0], args.serve[1], args.agent, args.clients + 16, args.durability,
                        0 if args.single_user else args.clients, args.io_threads, args.switch_ms,
                        args.lru_size, args.fsync_threads, args.memory, args.profile))
        return
    import psutil
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        env = {k: v for k, v in os.environ.items() if not k.startswith("NPLT_")}
        proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file), str(Path(tmp) / "data"),
                                 "--agent", args.agent, "--clients", str(args.clients),
                                 "--durability", args.durability, "--io-threads", str(args.io_threads),
                                 "--switch-ms", str(args.switch_ms), "--lru-size", str(args.lru_size),
                                 "--fsync-threads", str(args.fsync_threads), "--memory", args.memory] + (["--single-user"] if args.single_user else [])
                                + (["--profile", os.path.abspath(args.profile)] if args.profile else []),
                                env=env)
        try:
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text()):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("server did not start")
                time.sleep(0.05)
            port = int(port_file.read_text())
            users = 0 if args.single_user else args.clients
            ps = psutil.Process(proc.pid)
            rss_idle = ps.memory_info().rss
            peak = [rss_idle]

            async def sample() -> None:
                while True:
                    peak[0] = max(peak[0], ps.memory_info().rss)
                    await asyncio.sleep(0.1)

            cpu = [0.0, 0.0, 0.0, 0.0]

            async def run() -> tuple:
                sampler = asyncio.get_running_loop().create_task(sample())
                s0, g0, m0 = ps.cpu_times(), psutil.Process().cpu_times(), main_thread_cpu(ps)
                if args.profile:
                    proc.send_signal(signal.SIGUSR1)
                try:
                    res = await run_clients(port, args.clients, args.turns, users)
                finally:
                    sampler.cancel()
                    if args.profile:
                        proc.send_signal(signal.SIGUSR2)
                s1, g1 = ps.cpu_times(), psutil.Process().cpu_times()
                cpu[:] = [s1.user + s1.system - s0.user - s0.system, g1.user + g1.system - g0.user - g0.system,
                          main_thread_cpu(ps) - m0, s1.system - s0.system]
                checked = await verify(port, res[2], users)
                rate = await stream_rate(port, 50_000, users) if args.agent == "echo" else None
                return res, checked, rate

            with asyncio.Runner(loop_factory=new_loop) as r:
                (elapsed, lat, texts), (checked, problems), rate = r.run(run())
            n = len(lat)
            print(f"agent={args.agent} clients={args.clients} turns/client={args.turns} "
                  f"durability={args.durability} memory={args.memory} users={'1 (local)' if args.single_user else args.clients}")
            print(f"turns completed   {n} in {elapsed:.2f} s  ->  {n / elapsed:,.0f} turns/s")
            if lat:
                print(f"turn latency      p50 {pct(lat, 50) * 1000:.1f} ms   p99 {pct(lat, 99) * 1000:.1f} ms   "
                      f"mean {statistics.fmean(lat) * 1000:.1f} ms")
            print(f"CPU seconds       server {cpu[0]:.2f} ({cpu[0] / elapsed:.0%} of one core, "
                  f"{cpu[0] / max(n, 1) * 1e3:.2f} ms/turn, {cpu[3]:.2f} s in the kernel; event-loop thread "
                  f"{cpu[2]:.2f}, other threads {cpu[0] - cpu[2]:.2f})   load generator {cpu[1]:.2f} "
                  f"({cpu[1] / elapsed:.0%} of one core)")
            print(f"server RSS        idle {rss_idle / 2**20:.1f} MiB   peak {peak[0] / 2**20:.1f} MiB")
            if rate is not None:
                print(f"one stream        {rate:,.0f} deltas/s end to end (50,000 deltas, echo agent)")
            ok = problems == 0 and n == args.clients * args.turns
        finally:
            proc.terminate()
            proc.wait(30)
        stats = Path(str(port_file) + ".stats")
        if stats.exists():
            rounds, fsyncs, ckpt = map(int, stats.read_text().split())
            print(f"group commit      {2 * n} durable appends in {rounds} flush rounds, {fsyncs} WAL fsyncs "
                  f"({2 * n / max(rounds, 1):.1f} appends per round); {ckpt} journal fsyncs in checkpoints")
        print(f"integrity         {checked} sessions read back, {problems} with lost/duplicated messages "
              f"-> {'OK' if ok else 'FAILED'}")
        if not ok:
            sys.exit(1)


if __name__ == "__main__":
    main()
