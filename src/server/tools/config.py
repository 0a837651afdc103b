"""The [tools] config section: what the read-only tools may touch, and their limits.

A ``log_roots`` / ``file_roots`` entry that does not exist, is not a directory or cannot be read
by the server is accepted (it may appear later: a mount, a package installed afterwards), but each
one is logged at WARNING when the tool registry is built at start-up (``unusable_roots``), so that a
typo such as ``/var/lgo`` does not go unnoticed.
"""
from __future__ import annotations

import ipaddress
import os
from typing import ClassVar

from pydantic import Field, field_validator, model_validator

from protocol.settings import Invalid
from server.config_base import Section

PSEUDO_FILESYSTEMS = ("/proc", "/sys", "/dev")
ROOT_SETTINGS = ("log_roots", "file_roots")


def root_problem(path: str) -> str | None:
    """Why the tools could read nothing under the directory ``path`` (None: it is a readable directory)."""
    try:
        if not os.path.exists(path):
            return "does not exist"
        if not os.path.isdir(path):
            return "is not a directory"
        if not os.access(path, os.R_OK | os.X_OK):
            return "is not readable by the server (it needs read and search permission)"
    except OSError as e:   # (e.g. a name too long)
        return f"cannot be checked ({e.strerror or type(e).__name__})"
    return None


class ToolsConfig(Section):
    """Limits of the tools. ``allowed_hosts`` entries are host names, IP addresses or CIDR networks."""
    section: ClassVar[str] = "tools"
    allowed_hosts: list[str] = Field(default_factory=lambda: ["127.0.0.1", "::1", "localhost"])
    log_roots: list[str] = Field(default_factory=list)
    max_log_lines: int = Field(200, ge=1, le=100_000)
    max_log_bytes: int = Field(256 * 1024, ge=1024, le=64 << 20)
    timeout_s: float = Field(10.0, ge=0.1, le=600.0)
    network_timeout_s: float = Field(3.0, ge=0.05, le=120.0)   # capped at max_network_timeout_s unless set
    max_network_timeout_s: float = Field(10.0, ge=0.05, le=600.0)
    cpu_sample_s: float = Field(0.2, ge=0.01, le=5.0)
    max_processes: int = Field(50, ge=1, le=1000)
    max_filesystems: int = Field(40, ge=1, le=1000)
    max_result_chars: int = Field(16000, ge=512, le=10_000_000)
    file_roots: list[str] = Field(default_factory=list)   # list_dir / read_file / search_files
    max_file_bytes: int = Field(1 << 20, ge=4096, le=1 << 30)   # read_file: bytes read from the start of a file at most
    max_read_lines: int = Field(500, ge=1, le=100_000)          # read_file: upper bound of ``lines``
    max_list_entries: int = Field(500, ge=1, le=100_000)        # list_dir: upper bound of ``limit``
    max_dir_scan: int = Field(10000, ge=1, le=10_000_000)       # list_dir: directory entries examined at most
    max_search_files: int = Field(2000, ge=1, le=10_000_000)    # search_files: files opened at most
    max_search_bytes: int = Field(32 << 20, ge=4096, le=1 << 40)   # search_files: bytes read at most
    max_search_matches: int = Field(200, ge=1, le=100_000)      # search_files: upper bound of ``limit``
    search_timeout_s: float = Field(5.0, ge=0.05, le=600.0)     # search_files: stops (partial result) after this long
    max_line_chars: int = Field(500, ge=40, le=100_000)         # search_files: longer matching lines are cut
    max_calls_per_step: int = Field(16, ge=1, le=1000)          # tool calls of one step that run; the rest get an error
    max_parallel_calls: int = Field(4, ge=1, le=64)             # tool calls of one step running at once
    worker_threads: int = Field(8, ge=1, le=256)                # threads running the tools' blocking work, all users

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        hosts = [h.strip().lower() for h in v]
        for h in hosts:
            if not h:
                raise Invalid("expected non-empty host names")
            if "/" in h:
                try:
                    ipaddress.ip_network(h, strict=False)
                except ValueError:
                    raise Invalid(f"expected a CIDR network, got {h!r}") from None
        return hosts

    @field_validator("log_roots", "file_roots")
    @classmethod
    def _roots(cls, v: list[str]) -> list[str]:
        """Absolute directories, none of them a pseudo filesystem (or /, which holds them). Checked
        as resolved (symlinks, ``//``, ``..``), as ``server.tools.paths`` resolves roots when reading:
        ``//`` or a symlink to ``/`` is ``/``."""
        for r in v:
            if not r.startswith("/"):
                raise Invalid(f"expected absolute directory paths, got {r!r}")
            real = os.path.realpath(r)
            if real == "/" or any(real == p or real.startswith(p + "/") for p in PSEUDO_FILESYSTEMS):
                shown = repr(r) if real == os.path.normpath(r) else f"{r!r} (resolved: {real!r})"
                raise Invalid(f"{shown} is or holds a pseudo filesystem (/proc, /sys, /dev); "
                              "name the directories to expose instead")
        return v

    def unusable_roots(self) -> list[str]:
        """One phrase per ``log_roots`` / ``file_roots`` entry the tools cannot read under, e.g.
        ``tools.log_roots entry '/var/lgo' does not exist``."""
        out = []
        for setting in ROOT_SETTINGS:
            for r in getattr(self, setting):
                problem = root_problem(r)
                if problem is not None:
                    out.append(f"tools.{setting} entry {r!r} {problem}")
        return out

    @model_validator(mode="after")
    def _timeouts_nest(self) -> ToolsConfig:
        if "network_timeout_s" not in self.model_fields_set:
            self.network_timeout_s = min(self.network_timeout_s, self.max_network_timeout_s)
        if self.search_timeout_s >= self.timeout_s:
            raise Invalid("expected a value < tools.timeout_s (the search must stop and report before the "
                          "tool call times out)", "search_timeout_s")
        if self.network_timeout_s > self.max_network_timeout_s:
            raise Invalid("expected a value <= tools.max_network_timeout_s", "network_timeout_s")
        return self
