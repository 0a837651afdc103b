"""The server's Prometheus metrics (prometheus-client), one registry per Server.

Instruments fed by one-line hooks in the server: ``timed_turn`` (turn latency), ``timed_append``
(storage append latency), ``provider_error`` (agent/provider errors that ended a turn, by code).
Gauges of the server's state (connections, turns running and queued, refused connections, unsent output) are read
at scrape time on the event loop (``snapshot``); the process RSS is read by the collector while the
exposition is generated in a worker thread. ``LoopLagSampler`` measures how late the event loop
wakes a sleeping task (sampled every ``interval_s``).
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Iterator, TypeVar

import psutil
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from server.output import total_unsent

T = TypeVar("T")

TURN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
APPEND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


def server_state(server: Any) -> dict[str, float]:
    """The gauges read from a running Server (on the event loop; cheap)."""
    runner = server.runner
    return {"connections": len(server.connections), "turns_running": runner.turns_running,
            "turns_queued": sum(len(lane.waiting) for lane in runner.lanes.values()),
            "turns_total": runner.turns_total, "refused_total": server.refusals.total,
            "slow_consumers_total": server.slow_consumers,
            "output_unsent_bytes": total_unsent(server.connections)}


class _StateCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.process = psutil.Process()

    def collect(self) -> Iterator[Any]:
        s = self.metrics.state
        gauges = (("nplt_connections", "Open client connections (NPLT v2 and v3).", "connections"),
                  ("nplt_turns_running", "Turns being answered now.", "turns_running"),
                  ("nplt_turns_queued", "Turns waiting behind a running turn of their session.", "turns_queued"),
                  ("nplt_output_unsent_bytes", "Output not yet taken by the clients, all connections together "
                   "(counted against max_total_output_buffer).", "output_unsent_bytes"))
        for name, doc, key in gauges:
            yield GaugeMetricFamily(name, doc, value=s.get(key, 0))
        counters = (("nplt_turns", "Turns finished since start.", "turns_total"),
                    ("nplt_refused_connections", "Connections refused (max_clients, shutting down).", "refused_total"),
                    ("nplt_slow_consumers", "Connections dropped as SLOW_CONSUMER.", "slow_consumers_total"))
        for name, doc, key in counters:
            yield CounterMetricFamily(name, doc, value=s.get(key, 0))
        try:
            rss = self.process.memory_info().rss
        except psutil.Error:   # pragma: no cover - our own process
            rss = 0
        yield GaugeMetricFamily("nplt_process_resident_memory_bytes", "Resident set size of the server.", value=rss)


class Metrics:
    """Every metric of one server. Hooks are cheap enough to call on every turn and append."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.turn_seconds = Histogram("nplt_turn_duration_seconds", "Turn latency, start to end (stored).",
                                      buckets=TURN_BUCKETS, registry=self.registry)
        self.append_seconds = Histogram("nplt_storage_append_duration_seconds",
                                        "Latency of a message append to storage (durable when it returns).",
                                        buckets=APPEND_BUCKETS, registry=self.registry)
        self.loop_lag_seconds = Histogram("nplt_event_loop_lag_seconds",
                                          "How late the event loop woke a sleeping task (sampled).",
                                          buckets=LAG_BUCKETS, registry=self.registry)
        self.provider_errors = Counter("nplt_provider_errors", "Turns ended by an agent/provider error, by code.",
                                       ["code"], registry=self.registry)
        self.state: dict[str, float] = {}
        self.registry.register(_StateCollector(self))

    # -- hooks (one line each at the call sites) ------------------------------------------------
    async def timed_turn(self, aw: Awaitable[T]) -> T:
        start = time.perf_counter()
        try:
            return await aw
        finally:
            self.turn_seconds.observe(time.perf_counter() - start)

    async def timed_append(self, aw: Awaitable[T]) -> T:
        start = time.perf_counter()
        try:
            return await aw
        finally:
            self.append_seconds.observe(time.perf_counter() - start)

    def provider_error(self, code: str) -> None:
        self.provider_errors.labels(code=str(code)[:64]).inc()

    # -- exposition -----------------------------------------------------------------------------
    def snapshot(self, server: Any) -> None:
        """Read the server's gauges (call on the event loop)."""
        self.state = server_state(server)

    async def render(self, server: Any) -> bytes:
        """The Prometheus text exposition; the formatting and the RSS read run in a worker thread."""
        self.snapshot(server)
        return await asyncio.to_thread(generate_latest, self.registry)


class LoopLagSampler:
    """Sleeps ``interval_s`` again and again and records how much later than asked it woke up."""

    def __init__(self, metrics: Metrics, interval_s: float) -> None:
        self.metrics, self.interval_s = metrics, interval_s
        self.last = 0.0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="nplt-loop-lag")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(self.interval_s)
            self.last = max(0.0, loop.time() - before - self.interval_s)
            self.metrics.loop_lag_seconds.observe(self.last)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
