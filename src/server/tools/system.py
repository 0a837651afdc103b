"""Machine state tools (psutil, read-only): sys_monitor, processes, clock.

The collectors are synchronous and may block (CPU sampling sleeps for ``cpu_sample_s``); the
registry runs them with ``asyncio.to_thread``.
"""
from __future__ import annotations

import re
import socket
import time
from datetime import datetime, timezone
from typing import Any

import psutil

from server.tools.config import ToolsConfig
from server.tools.units import fmt_bytes, fmt_duration, pct

METRICS = ("cpu", "memory", "disk", "network", "load", "uptime", "all")
# Linux keeps a process's name (comm) to 15 characters; psutil completes a name that long from argv[0]
KERNEL_COMM_CHARS = 15

SYS_MONITOR_SCHEMA = {
    "type": "object",
    "properties": {
        "metric": {"type": "string", "enum": list(METRICS), "default": "all",
                   "description": "What to report: cpu, memory, disk, network, load, uptime or all."},
    },
    "additionalProperties": False,
}

PROCESSES_SCHEMA = {
    "type": "object",
    "properties": {
        "sort_by": {"type": "string", "enum": ["cpu", "memory"], "default": "cpu",
                    "description": "Order by CPU percent or resident memory."},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10,
                  "description": "How many processes to return."},
        "name": {"type": "string", "minLength": 1, "maxLength": 100,
                 "description": "Only processes whose name contains this text (case-insensitive)."},
    },
    "additionalProperties": False,
}

CLOCK_SCHEMA = {"type": "object", "properties": {}, "additionalProperties": False}


def cpu(cfg: ToolsConfig) -> dict[str, Any]:
    """Total and per-core CPU percent over a short sampling interval."""
    per_core = psutil.cpu_percent(interval=cfg.cpu_sample_s, percpu=True)
    total = sum(per_core) / len(per_core) if per_core else 0.0
    out: dict[str, Any] = {"percent": pct(total), "per_core": [pct(c) for c in per_core],
                           "cores_logical": psutil.cpu_count() or len(per_core),
                           "cores_physical": psutil.cpu_count(logical=False),
                           "sample_s": cfg.cpu_sample_s}
    try:
        freq = psutil.cpu_freq()
        if freq and freq.current:
            out["freq_mhz"] = round(freq.current)
    except (OSError, NotImplementedError, AttributeError):
        pass
    return out


def load() -> dict[str, Any]:
    one, five, fifteen = psutil.getloadavg()
    return {"load_1m": round(one, 2), "load_5m": round(five, 2), "load_15m": round(fifteen, 2),
            "cores_logical": psutil.cpu_count() or 1}


def memory() -> dict[str, Any]:
    vm, sw = psutil.virtual_memory(), psutil.swap_memory()
    return {"total": fmt_bytes(vm.total), "available": fmt_bytes(vm.available), "used": fmt_bytes(vm.used),
            "percent": pct(vm.percent),
            "swap": {"total": fmt_bytes(sw.total), "used": fmt_bytes(sw.used), "percent": pct(sw.percent)}}


def disk(cfg: ToolsConfig) -> dict[str, Any]:
    """Usage of every mounted (physical) filesystem, capped at ``max_filesystems``."""
    filesystems, seen = [], set()
    for part in psutil.disk_partitions(all=False):
        if part.mountpoint in seen:
            continue
        seen.add(part.mountpoint)
        try:
            u = psutil.disk_usage(part.mountpoint)
        except OSError:
            continue
        if u.total == 0:
            continue
        filesystems.append({"mount": part.mountpoint, "device": part.device, "fstype": part.fstype,
                            "total": fmt_bytes(u.total), "used": fmt_bytes(u.used), "free": fmt_bytes(u.free),
                            "percent": pct(u.percent)})
        if len(filesystems) >= cfg.max_filesystems:
            break
    return {"filesystems": filesystems}


_FAMILIES = {socket.AF_INET: "ipv4", socket.AF_INET6: "ipv6"}


def network() -> dict[str, Any]:
    io = psutil.net_io_counters()
    per_nic = psutil.net_io_counters(pernic=True)
    stats = psutil.net_if_stats()
    interfaces = []
    for name, addrs in sorted(psutil.net_if_addrs().items()):
        st, nic = stats.get(name), per_nic.get(name)
        entry: dict[str, Any] = {
            "name": name, "up": bool(st.isup) if st else None,
            "addresses": [{"family": _FAMILIES[a.family], "address": a.address, "netmask": a.netmask}
                          for a in addrs if a.family in _FAMILIES],
        }
        if st and st.speed:
            entry["speed_mbps"] = st.speed
        if nic:
            entry["sent"], entry["received"] = fmt_bytes(nic.bytes_sent), fmt_bytes(nic.bytes_recv)
        interfaces.append(entry)
    return {"io": {"sent": fmt_bytes(io.bytes_sent), "received": fmt_bytes(io.bytes_recv),
                   "packets_sent": io.packets_sent, "packets_received": io.packets_recv,
                   "errors_in": io.errin, "errors_out": io.errout, "drops_in": io.dropin, "drops_out": io.dropout},
            "interfaces": interfaces}


def uptime() -> dict[str, Any]:
    boot = psutil.boot_time()
    up = max(0.0, time.time() - boot)
    return {"boot_time": datetime.fromtimestamp(boot).astimezone().isoformat(timespec="seconds"),
            "uptime": fmt_duration(up), "uptime_s": int(up)}


def sys_monitor(cfg: ToolsConfig, metric: str) -> dict[str, Any]:
    """The ``sys_monitor`` tool (blocking)."""
    collectors = {"cpu": lambda: cpu(cfg), "memory": memory, "disk": lambda: disk(cfg), "network": network,
                  "load": load, "uptime": uptime}
    if metric == "all":
        return {"metric": "all", **{name: fn() for name, fn in collectors.items()}}
    return {"metric": metric, metric: collectors[metric]()}


def process_name(p: psutil.Process) -> str:
    """The name of ``p``, never its arguments. psutil completes a kernel name cut to
    ``KERNEL_COMM_CHARS`` with the basename of argv[0], which a program sets as it likes, arguments
    included (exec -a "dbbackup_runner_tool --pw S3cret"): the completion stops at the first whitespace."""
    name = p.name()
    return name[:KERNEL_COMM_CHARS] + re.match(r"\S*", name[KERNEL_COMM_CHARS:]).group(0)


def _proc_info(p: psutil.Process) -> dict[str, Any] | None:
    try:
        with p.oneshot():
            mem = p.memory_info()
            return {"pid": p.pid, "name": process_name(p), "user": _username(p),
                    "cpu_percent": p.cpu_percent(None), "rss_bytes": mem.rss,
                    "memory_percent": pct(p.memory_percent())}
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def _username(p: psutil.Process) -> str | None:
    try:
        return p.username()
    except (psutil.AccessDenied, KeyError, OSError):
        return None


def processes(cfg: ToolsConfig, sort_by: str, limit: int, name: str | None) -> dict[str, Any]:
    """The ``processes`` tool (blocking): CPU percent measured over ``cpu_sample_s``."""
    needle = name.lower() if name else None
    procs, total = [], 0
    for p in psutil.process_iter():
        total += 1
        try:
            if needle and needle not in process_name(p).lower():
                continue
            p.cpu_percent(None)   # prime: the second call below measures the sampling interval
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
        procs.append(p)
    time.sleep(cfg.cpu_sample_s)
    rows = [r for r in (_proc_info(p) for p in procs) if r is not None]
    key = "cpu_percent" if sort_by == "cpu" else "rss_bytes"
    rows.sort(key=lambda r: (r[key], r["rss_bytes"]), reverse=True)
    limit = min(limit, cfg.max_processes)
    top = [{"pid": r["pid"], "name": r["name"], "user": r["user"], "cpu_percent": pct(r["cpu_percent"]),
            "rss": fmt_bytes(r["rss_bytes"]), "memory_percent": r["memory_percent"]} for r in rows[:limit]]
    out: dict[str, Any] = {"sort_by": sort_by, "total_processes": total, "matched": len(rows), "processes": top}
    if needle:
        out["name_filter"] = name
    return out


def clock() -> dict[str, Any]:
    """Current local and UTC time with the server's timezone."""
    now = datetime.now(timezone.utc)
    local = now.astimezone()
    offset = local.utcoffset()
    minutes = int(offset.total_seconds() // 60) if offset is not None else 0
    sign = "+" if minutes >= 0 else "-"
    return {"local": local.isoformat(timespec="seconds"), "utc": now.isoformat(timespec="seconds"),
            "timezone": local.tzname() or "UTC", "utc_offset": f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}",
            "weekday": local.strftime("%A"), "unix": int(now.timestamp())}

