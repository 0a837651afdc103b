"""What every soak phase shares: a server process with its HTTP metrics endpoint, the measurements
taken around an attack (RSS sampled, the side client in its own process, event-loop lag from
/metrics, tracebacks in the log) and the one row each phase reports."""
from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from testkit.process import ServerProcess  # noqa: E402

TRACEBACK = "Traceback (most recent call last)"
_BUCKET = re.compile(r'^nplt_event_loop_lag_seconds_bucket\{le="([^"]+)"\} ([0-9.e+]+)$', re.M)


@dataclass
class Row:
    """One line of the soak table."""
    phase: str
    tried: str = ""
    crashes: int = 0
    lost: int | None = None            # acknowledged messages missing afterwards (None: not applicable)
    rss_mb: tuple[float, float, float] | None = None     # before, peak, after
    ping_ms: tuple[float, float, float] | None = None    # side client p50, p99, max
    stats_p99_ms: float | None = None
    lag_p99_ms: str = "-"
    tracebacks: int = 0
    failures: list[str] = field(default_factory=list)   # checks that did not hold
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.crashes and not self.lost and not self.tracebacks and not self.failures


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lag_buckets(text: str) -> dict[str, float]:
    return {le: float(n) for le, n in _BUCKET.findall(text)}


def lag_p99(before: dict[str, float], after: dict[str, float]) -> str:
    """The p99 of the loop-lag samples taken between two /metrics reads, as a bucket bound."""
    diff = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in after}
    total = diff.get("+Inf", 0.0)
    if total <= 0:
        return "-"
    over = int(total - diff.get("0.1", 0.0))   # samples later than 100 ms
    for le, n in sorted(((le, n) for le, n in diff.items() if le != "+Inf"), key=lambda x: float(x[0])):
        if n >= 0.99 * total:
            return f"<={float(le) * 1000:g} ({over}/{int(total)} >100)"
    return f">{max(float(le) for le in diff if le != '+Inf') * 1000:g} ({over}/{int(total)} >100)"


async def http_get(port: int, path: str, timeout: float = 10.0) -> str:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    return data.decode(errors="replace")


class SoakServer:
    """``nplt-server`` in a subprocess for one phase, with /metrics on a loopback port."""

    def __init__(self, work: Path, name: str, *, limits: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None, extra_toml: str = "") -> None:
        self.work, self.name = work, name
        self.data = work / f"{name}-data"
        self.log = work / f"{name}.log"
        self.http_port = free_port()
        lim = "".join(f"{k} = {v!r}\n" for k, v in (limits or {}).items())
        self.config = work / f"{name}.toml"
        self.config.write_text(f"[limits]\n{lim}\n[http]\nlisten = \"127.0.0.1:{self.http_port}\"\n"
                               f"loop_lag_interval_s = 0.05\n{extra_toml}")
        self.env = env or {}
        self.proc: ServerProcess | None = None
        self.crashes = 0

    async def start(self) -> ServerProcess:
        self.proc = await ServerProcess.start(self.data, "--config", str(self.config), env=self.env,
                                              log_path=self.log)
        return self.proc

    @property
    def port(self) -> int:
        assert self.proc is not None
        return self.proc.port

    def kill(self) -> None:
        """SIGKILL (on purpose: not a crash)."""
        if self.proc is not None:
            if not self.alive():
                self.crashes += 1
            self.proc.kill()
            self.proc = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.proc.poll() is None

    def rss_mb(self) -> float:
        try:
            return psutil.Process(self.proc.proc.pid).memory_info().rss / (1 << 20)
        except (psutil.Error, AttributeError):
            return 0.0

    async def lag(self) -> dict[str, float]:
        try:
            return lag_buckets(await http_get(self.http_port, "/metrics"))
        except (OSError, asyncio.TimeoutError):
            return {}

    async def stop(self) -> None:
        """SIGTERM; a server that was already gone, or does not exit 0, counts as a crash."""
        if self.proc is None:
            return
        if not self.alive():
            self.crashes += 1
        elif await self.proc.stop() != 0:
            self.crashes += 1
        self.proc = None

    def tracebacks(self) -> int:
        try:
            return self.log.read_text(errors="replace").count(TRACEBACK)
        except FileNotFoundError:
            return 0


class Measured:
    """Around one attack: RSS before/peak/after, the side client, loop lag, crashes, tracebacks."""

    def __init__(self, server: SoakServer, row: Row, *, budget_s: float) -> None:
        self.server, self.row, self.budget_s = server, row, budget_s
        self.peak = 0.0
        self._sampler: asyncio.Task | None = None
        self._side: subprocess.Popen | None = None

    async def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, self.server.rss_mb())
            await asyncio.sleep(0.1)   # a sampling period, not synchronisation

    async def __aenter__(self) -> Measured:
        self.before_rss = self.server.rss_mb()
        self.peak = self.before_rss
        self.before_lag = await self.server.lag()
        self._sampler = asyncio.get_running_loop().create_task(self._sample())
        self._side = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "soak_side.py"), str(self.server.port), str(self.budget_s + 60)],
            stdout=subprocess.PIPE, text=True)
        try:   # the attack starts once the side client has said HELLO
            await asyncio.wait_for(asyncio.to_thread(self._side.stdout.readline), 30)
        except asyncio.TimeoutError:
            self.row.failures.append("side client did not start")
        return self

    async def __aexit__(self, *exc: object) -> None:
        side: dict[str, Any] = {}
        if self._side is not None:
            self._side.send_signal(signal.SIGTERM)
            out, _ = await asyncio.to_thread(self._side.communicate, None, 30)
            side = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        after_lag = await self.server.lag()
        if self._sampler is not None:
            self._sampler.cancel()
        row = self.row
        pings = side.get("ping", [])
        if pings:
            row.ping_ms = (pct(pings, 0.5), pct(pings, 0.99), max(pings))
            row.stats_p99_ms = pct(side.get("stats", []), 0.99)
            row.extra["side_samples"] = len(pings)
        if side.get("errors"):
            row.failures.append(f"side client: {side['errors']} errors/timeouts")
        row.lag_p99_ms = lag_p99(self.before_lag, after_lag)
        row.rss_mb = (self.before_rss, self.peak, self.server.rss_mb())
        if not self.server.alive():
            row.failures.append("server died during the attack")


def fmt_row(r: Row) -> list[str]:
    rss = "/".join(f"{x:.0f}" for x in r.rss_mb) if r.rss_mb else "-"
    ping = "/".join(f"{x:.1f}" for x in r.ping_ms) if r.ping_ms else "-"
    return [r.phase, r.tried, str(r.crashes), "-" if r.lost is None else str(r.lost), rss, ping,
            "-" if r.stats_p99_ms is None else f"{r.stats_p99_ms:.1f}", r.lag_p99_ms, str(r.tracebacks),
            "ok" if r.ok else "; ".join(r.failures) or "FAIL"]


HEADERS = ["phase", "tried", "crashes", "lost acked", "RSS MB before/peak/after", "PING ms p50/p99/max",
           "STATS p99 ms", "loop lag p99 ms", "tracebacks", "result"]


def table(rows: list[Row]) -> str:
    cells = [HEADERS] + [fmt_row(r) for r in rows]
    out = ["| " + " | ".join(c) + " |" for c in cells]
    out.insert(1, "|" + "|".join("---" for _ in HEADERS) + "|")
    return "\n".join(out)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


async def timed(deadline: float) -> bool:
    """True while the phase's time budget lasts."""
    return time.monotonic() < deadline
