"""The [tools] config section: what the read-only tools may touch, and their limits."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from server.config_base import ConfigError, check_keys, get_float, get_int, get_str_list

_KEYS = {"allowed_hosts", "log_roots", "max_log_lines", "max_log_bytes", "timeout_s", "network_timeout_s",
         "max_network_timeout_s", "cpu_sample_s", "max_processes", "max_filesystems", "max_result_chars"}


@dataclass(slots=True)
class ToolsConfig:
    """Limits of the tools. ``allowed_hosts`` entries are host names, IP addresses or CIDR networks."""
    allowed_hosts: list[str] = field(default_factory=lambda: ["127.0.0.1", "::1", "localhost"])
    log_roots: list[str] = field(default_factory=list)
    max_log_lines: int = 200
    max_log_bytes: int = 256 * 1024
    timeout_s: float = 10.0
    network_timeout_s: float = 3.0
    max_network_timeout_s: float = 10.0
    cpu_sample_s: float = 0.2
    max_processes: int = 50
    max_filesystems: int = 40
    max_result_chars: int = 16000

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolsConfig:
        check_keys("tools", d, _KEYS)
        hosts = [h.strip().lower() for h in get_str_list("tools", d, "allowed_hosts",
                                                         ["127.0.0.1", "::1", "localhost"])]
        for h in hosts:
            if not h:
                raise ConfigError("tools.allowed_hosts", "expected non-empty host names")
            if "/" in h:
                try:
                    ipaddress.ip_network(h, strict=False)
                except ValueError:
                    raise ConfigError("tools.allowed_hosts", f"expected a CIDR network, got {h!r}") from None
        roots = get_str_list("tools", d, "log_roots", [])
        for r in roots:
            if not r.startswith("/"):
                raise ConfigError("tools.log_roots", f"expected absolute directory paths, got {r!r}")
        max_net = get_float("tools", d, "max_network_timeout_s", 10.0, 0.05, 600.0)
        cfg = cls(
            allowed_hosts=hosts, log_roots=roots,
            max_log_lines=get_int("tools", d, "max_log_lines", 200, 1, 100_000),
            max_log_bytes=get_int("tools", d, "max_log_bytes", 256 * 1024, 1024, 64 << 20),
            timeout_s=get_float("tools", d, "timeout_s", 10.0, 0.1, 600.0),
            network_timeout_s=get_float("tools", d, "network_timeout_s", min(3.0, max_net), 0.05, 120.0),
            max_network_timeout_s=max_net,
            cpu_sample_s=get_float("tools", d, "cpu_sample_s", 0.2, 0.01, 5.0),
            max_processes=get_int("tools", d, "max_processes", 50, 1, 1000),
            max_filesystems=get_int("tools", d, "max_filesystems", 40, 1, 1000),
            max_result_chars=get_int("tools", d, "max_result_chars", 16000, 512, 10_000_000),
        )
        if cfg.network_timeout_s > cfg.max_network_timeout_s:
            raise ConfigError("tools.network_timeout_s", "expected a value <= tools.max_network_timeout_s")
        return cfg
