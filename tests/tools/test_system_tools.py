"""sys_monitor, processes and clock against the real machine."""
from __future__ import annotations

import os
import re
import time
from datetime import datetime, timezone

import orjson
import psutil
import pytest

from server.tools import ToolContext, ToolRegistry, ToolsConfig
from server.tools.units import fmt_bytes, fmt_duration

CTX = ToolContext("alice", "s_1")
_FACTORS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def size_of(text: str) -> float:
    number, unit = text.split()
    return float(number) * _FACTORS[unit]


@pytest.fixture
def tools() -> ToolRegistry:
    return ToolRegistry(ToolsConfig(cpu_sample_s=0.05))


async def run(tools: ToolRegistry, name: str, args) -> dict:
    call = await tools.run(name, args, CTX)
    assert call.status == "success", call.result
    return orjson.loads(call.result)


async def test_cpu_is_sane(tools):
    d = (await run(tools, "sys_monitor", {"metric": "cpu"}))["cpu"]
    assert 0.0 <= d["percent"] <= 100.0
    assert len(d["per_core"]) == psutil.cpu_count() == d["cores_logical"]
    assert all(0.0 <= c <= 100.0 for c in d["per_core"])


async def test_memory_matches_psutil(tools):
    d = (await run(tools, "sys_monitor", '{"metric": "memory"}'))["memory"]
    vm = psutil.virtual_memory()
    assert d["total"] == fmt_bytes(vm.total)
    assert abs(size_of(d["available"]) - vm.available) < 0.05 * vm.total
    assert 0.0 <= d["percent"] <= 100.0
    assert d["swap"]["total"] == fmt_bytes(psutil.swap_memory().total)


async def test_disk_lists_every_mounted_filesystem(tools):
    d = (await run(tools, "sys_monitor", {"metric": "disk"}))["disk"]
    mounts = {fs["mount"]: fs for fs in d["filesystems"]}
    expected = {p.mountpoint for p in psutil.disk_partitions(all=False) if psutil.disk_usage(p.mountpoint).total}
    assert set(mounts) == expected and "/" in mounts
    assert mounts["/"]["total"] == fmt_bytes(psutil.disk_usage("/").total)


async def test_network_interfaces_and_counters(tools):
    d = (await run(tools, "sys_monitor", {"metric": "network"}))["network"]
    names = {nic["name"] for nic in d["interfaces"]}
    assert names == set(psutil.net_if_addrs())
    lo = next(nic for nic in d["interfaces"] if any(a["address"] == "127.0.0.1" for a in nic["addresses"]))
    assert lo["up"] is True
    assert d["io"]["packets_received"] <= psutil.net_io_counters().packets_recv


async def test_load_and_uptime(tools):
    d = await run(tools, "sys_monitor", {"metric": "all"})
    assert set(d) == {"metric", "cpu", "memory", "disk", "network", "load", "uptime"}
    one = psutil.getloadavg()[0]
    assert abs(d["load"]["load_1m"] - one) < max(1.0, one)
    expected = time.time() - psutil.boot_time()
    assert abs(d["uptime"]["uptime_s"] - expected) < 5
    assert d["uptime"]["uptime"] == fmt_duration(d["uptime"]["uptime_s"])


async def test_default_metric_is_all(tools):
    assert (await run(tools, "sys_monitor", {}))["metric"] == "all"


async def test_processes_by_memory_sorted_and_limited(tools):
    d = await run(tools, "processes", {"sort_by": "memory", "limit": 5})
    assert len(d["processes"]) == 5 and d["total_processes"] >= d["matched"] >= 5
    rss = [size_of(p["rss"]) for p in d["processes"]]
    assert rss == sorted(rss, reverse=True)
    biggest = max(p.info["memory_info"].rss for p in psutil.process_iter(["memory_info"]) if p.info["memory_info"])
    assert abs(rss[0] - biggest) <= 0.2 * biggest


async def test_processes_name_filter_finds_this_python(tools):
    name = psutil.Process(os.getpid()).name()
    d = await run(tools, "processes", {"name": name.upper(), "limit": 50})
    assert d["name_filter"] == name.upper()
    assert os.getpid() in [p["pid"] for p in d["processes"]]
    assert all(name.lower() in p["name"].lower() for p in d["processes"])
    none = await run(tools, "processes", {"name": "no-such-process-xyz"})
    assert none["processes"] == [] and none["matched"] == 0


async def test_processes_cpu_values_are_percentages(tools):
    d = await run(tools, "processes", {})
    assert d["sort_by"] == "cpu" and len(d["processes"]) <= 10
    cpus = [p["cpu_percent"] for p in d["processes"]]
    assert cpus == sorted(cpus, reverse=True)
    assert all(0.0 <= c <= 100.0 * psutil.cpu_count() for c in cpus)


async def test_clock(tools):
    d = await run(tools, "clock", {})
    utc = datetime.fromisoformat(d["utc"])
    assert abs((datetime.now(timezone.utc) - utc).total_seconds()) < 5
    assert datetime.fromisoformat(d["local"]) == utc
    assert re.fullmatch(r"[+-]\d\d:\d\d", d["utc_offset"]) and d["timezone"]


def test_units():
    assert fmt_bytes(0) == "0 B" and fmt_bytes(1536) == "1.5 KiB" and fmt_bytes(5 << 30) == "5.0 GiB"
    assert fmt_duration(42) == "42s" and fmt_duration(93784) == "1d 2h 3m" and fmt_duration(3600) == "1h 0m"
