"""The side client of the soak, in its own process (so the attackers' event loop cannot slow it):
HELLO, then every ``interval`` one PING and one STATS, each timed from send to reply; at the end
(after ``duration`` seconds, or SIGTERM) one JSON line on stdout: {"ping": [ms...], "stats": [ms...],
"errors": n}. A reply that does not come within ``timeout`` counts as ``timeout`` ms and an error.

    python bench/soak_side.py PORT DURATION [--interval 0.05] [--timeout 10]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from protocol import MsgType  # noqa: E402
from testkit.server import V3Client  # noqa: E402


async def run(port: int, duration: float, interval: float, timeout: float) -> dict:
    out: dict = {"ping": [], "stats": [], "errors": 0}
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    try:
        c = await asyncio.wait_for(V3Client.connect(("127.0.0.1", port)), timeout)
    except Exception as exc:  # noqa: BLE001 - refused, timed out, or taken for a v2 client: reported
        out["errors"] += 1
        out["connect_error"] = repr(exc)
        print("ready", flush=True)
        return out
    print("ready", flush=True)   # the attack may start
    end = time.monotonic() + duration
    try:
        while not stop.is_set() and time.monotonic() < end:
            for kind, t in (("ping", MsgType.PING), ("stats", MsgType.STATS)):
                t0 = time.perf_counter()
                try:
                    await c.request(t, timeout)
                    out[kind].append((time.perf_counter() - t0) * 1000)
                except (asyncio.TimeoutError, ConnectionError):
                    out[kind].append(timeout * 1000)
                    out["errors"] += 1
                    if c.closed.is_set():
                        return out
            c.inbox.clear()
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except asyncio.TimeoutError:
                pass
    finally:
        await c.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("port", type=int)
    p.add_argument("duration", type=float)
    p.add_argument("--interval", type=float, default=0.05)
    p.add_argument("--timeout", type=float, default=10.0)
    a = p.parse_args()
    print(json.dumps(asyncio.run(run(a.port, a.duration, a.interval, a.timeout))), flush=True)


if __name__ == "__main__":
    main()
