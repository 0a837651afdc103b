"""``make soak``: the project's own bounded attack campaign, on loopback only (issue 15).

Phases, each against a fresh ``nplt-server`` subprocess with its own history directory:
a protocol fuzzer over TCP (v2 and v3 mutations), SIGKILL restarts under chat load (every
acknowledged message checked in the store afterwards), overload (many connections, a pipelined
flood, non-readers, abandoned fragmented messages, slowloris) and provider faults through the
scripted OpenAI-compatible server. Around each attack a side client in its own process times PING
and STATS, the server's RSS is sampled and its event-loop lag read from /metrics. Every loop is
bounded in count and time. Prints one table (Markdown); ``--json`` also writes the rows.

    python bench/soak.py [--profile full|tiny] [--only fuzz,kills,overload,faults] [--json out.json] [--strict]
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import soak_faults  # noqa: E402
import soak_fuzz  # noqa: E402
import soak_kills  # noqa: E402
import soak_overload  # noqa: E402
from soak_common import Measured, Row, SoakServer, table  # noqa: E402

PROFILES = {
    "full": dict(fuzz_frames=120_000, fuzz_per_conn=50, fuzz_workers=32, fuzz_budget_s=300,
                 restarts=32, kill_clients=4, kill_budget_s=400,
                 connections=1000, hold_s=5.0, settle_s=1.0, flood_conns=4, flood_requests=20_000, non_readers=50,
                 nr_requests=20_000, frag_rounds=4, frag_conns=30, slowloris=200, slow_s=12.0, budget_s=120,
                 huge=2_000_000, fault_rounds=2),
    "tiny": dict(fuzz_frames=1_500, fuzz_per_conn=30, fuzz_workers=8, fuzz_budget_s=30,
                 restarts=2, kill_clients=2, kill_budget_s=60,
                 connections=40, hold_s=0.5, settle_s=0.25, flood_conns=2, flood_requests=300, non_readers=3,
                 nr_requests=500, frag_rounds=1, frag_conns=2, slowloris=5, slow_s=1.0, budget_s=20,
                 huge=300_000, fault_rounds=1),
}
# One loopback address runs every attack: max_clients_per_ip (default 64) would refuse most of them before
# the defences under test (message_timeout_s, input budget, back-pressure) are reached.
LIMITS = {"max_clients": 1200, "max_clients_per_ip": 0, "shutdown_grace_s": 2.0}


async def _phase(work: Path, name: str, body, *, limits=None, extra_toml: str = "") -> list[Row]:
    server = SoakServer(work, name, limits={**LIMITS, **(limits or {})}, extra_toml=extra_toml)
    rows: list[Row] = []
    try:
        rows = await body(server)
    finally:
        await server.stop()
    for r in rows:   # the server's crashes and tracebacks belong to every row of its phase: report once
        r.crashes, r.tracebacks = (server.crashes, server.tracebacks()) if r is rows[-1] else (0, 0)
    if server.tracebacks():
        rows[-1].extra["log"] = str(server.log)
    return rows


async def main_async(p: dict, only: set[str], work: Path) -> list[Row]:
    rows: list[Row] = []
    # the attackers' own client tasks fail by design (refused, cut, taken for v2): not the server's tracebacks
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: None)

    async def fuzz(server: SoakServer) -> list[Row]:
        row = Row("fuzz (v2+v3 over TCP)")
        await server.start()
        async with Measured(server, row, budget_s=p["fuzz_budget_s"]):
            await soak_fuzz.run(server, row, frames=p["fuzz_frames"], per_conn=p["fuzz_per_conn"],
                                workers=p["fuzz_workers"], budget_s=p["fuzz_budget_s"])
        return [row]

    async def kills(server: SoakServer) -> list[Row]:
        row = Row("SIGKILL restarts")
        await soak_kills.run(server, row, restarts=p["restarts"], clients=p["kill_clients"],
                             budget_s=p["kill_budget_s"])
        return [row]

    async def overload(server: SoakServer) -> list[Row]:
        return await soak_overload.run(server, p)

    async def faults(server: SoakServer) -> list[Row]:
        row = Row("provider faults")
        await soak_faults.phase(server, row, huge=p["huge"], rounds=p["fault_rounds"])
        return [row]

    phases = [("fuzz", fuzz, ""), ("kills", kills, soak_faults.LLM_TOML), ("overload", overload, ""),
              ("faults", faults, soak_faults.LLM_TOML)]
    for name, body, toml in phases:
        if name in only:
            t0 = time.monotonic()
            limits = {"message_timeout_s": soak_overload.MESSAGE_TIMEOUT_S} if name == "overload" else None
            got = await _phase(work, name, body, limits=limits, extra_toml=toml)
            got[-1].extra["seconds"] = round(time.monotonic() - t0, 1)
            rows += got
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", choices=sorted(PROFILES), default="full")
    ap.add_argument("--only", default="fuzz,kills,overload,faults")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--work", metavar="DIR", help="keep the servers' data and logs here (default: a temp dir)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when any check failed")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 20_000) if hard > 0 else soft, hard))
    logging.getLogger("asyncio").setLevel(logging.ERROR)   # our own writes to sockets the server closed
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="nplt-soak-") as tmp:
        work = Path(a.work) if a.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        rows = asyncio.run(main_async(PROFILES[a.profile], set(a.only.split(",")), work))
    print(table(rows))
    print(f"\n{a.profile} soak: {time.monotonic() - t0:.0f} s, "
          f"{sum(r.crashes for r in rows)} crashes, {sum(r.lost or 0 for r in rows)} lost acknowledged messages, "
          f"{sum(r.tracebacks for r in rows)} tracebacks, {sum(not r.ok for r in rows)} rows with findings")
    if a.json:
        Path(a.json).write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
    if a.strict and not all(r.ok for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
