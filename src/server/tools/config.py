"""The [tools] config section: what the read-only tools may touch, and their limits."""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from typing import Any

from server.config_base import ConfigError, check_keys, get_float, get_int, get_str_list

_KEYS = {"allowed_hosts", "log_roots", "max_log_lines", "max_log_bytes", "timeout_s", "network_timeout_s",
         "max_network_timeout_s", "cpu_sample_s", "max_processes", "max_filesystems", "max_result_chars",
         "file_roots", "max_file_bytes", "max_read_lines", "max_list_entries", "max_dir_scan",
         "max_search_files", "max_search_bytes", "max_search_matches", "search_timeout_s", "max_line_chars"}


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
    file_roots: list[str] = field(default_factory=list)   # list_dir / read_file / search_files
    max_file_bytes: int = 1 << 20        # read_file: bytes read from the start of a file at most
    max_read_lines: int = 500            # read_file: upper bound of ``lines``
    max_list_entries: int = 500          # list_dir: upper bound of ``limit``
    max_dir_scan: int = 10000            # list_dir: directory entries examined at most
    max_search_files: int = 2000         # search_files: files opened at most
    max_search_bytes: int = 32 << 20     # search_files: bytes read at most
    max_search_matches: int = 200        # search_files: upper bound of ``limit``
    search_timeout_s: float = 5.0        # search_files: stops (partial result) after this long
    max_line_chars: int = 500            # search_files: longer matching lines are cut

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
        roots = _roots(d, "log_roots")
        file_roots = _roots(d, "file_roots")
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
            file_roots=file_roots,
            max_file_bytes=get_int("tools", d, "max_file_bytes", 1 << 20, 4096, 1 << 30),
            max_read_lines=get_int("tools", d, "max_read_lines", 500, 1, 100_000),
            max_list_entries=get_int("tools", d, "max_list_entries", 500, 1, 100_000),
            max_dir_scan=get_int("tools", d, "max_dir_scan", 10000, 1, 10_000_000),
            max_search_files=get_int("tools", d, "max_search_files", 2000, 1, 10_000_000),
            max_search_bytes=get_int("tools", d, "max_search_bytes", 32 << 20, 4096, 1 << 40),
            max_search_matches=get_int("tools", d, "max_search_matches", 200, 1, 100_000),
            search_timeout_s=get_float("tools", d, "search_timeout_s", 5.0, 0.05, 600.0),
            max_line_chars=get_int("tools", d, "max_line_chars", 500, 40, 100_000),
        )
        if cfg.search_timeout_s >= cfg.timeout_s:
            raise ConfigError("tools.search_timeout_s", "expected a value < tools.timeout_s (the search must stop "
                              "and report before the tool call times out)")
        if cfg.network_timeout_s > cfg.max_network_timeout_s:
            raise ConfigError("tools.network_timeout_s", "expected a value <= tools.max_network_timeout_s")
        return cfg


PSEUDO_FILESYSTEMS = ("/proc", "/sys", "/dev")


def _roots(d: dict[str, Any], key: str) -> list[str]:
    """Absolute directories, none of them a pseudo filesystem (or /, which holds them)."""
    roots = get_str_list("tools", d, key, [])
    for r in roots:
        if not r.startswith("/"):
            raise ConfigError(f"tools.{key}", f"expected absolute directory paths, got {r!r}")
        norm = os.path.normpath(r)
        if norm == "/" or any(norm == p or norm.startswith(p + "/") for p in PSEUDO_FILESYSTEMS):
            raise ConfigError(f"tools.{key}", f"{r!r} is or holds a pseudo filesystem (/proc, /sys, /dev); "
                              "name the directories to expose instead")
    return roots
