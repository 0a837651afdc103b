"""StorageConfig: the ``[storage]`` config section, validated with precise messages."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from .errors import StorageConfigError

DURABILITY_MODES = ("fsync", "batched")

# key -> (kind, lo, hi); kind is "int" | "float" | "str" | "choice"
_RULES: dict[str, tuple[str, float | None, float | None]] = {
    "root": ("str", None, None),
    "durability": ("choice", None, None),
    "batch_ms": ("int", 1, 10_000),
    "compact_threshold": ("int", 2, 10_000_000),
    "lru_size": ("int", 1, 1_000_000),
    "lru_mib": ("int", 1, 1_048_576),
    "idle_evict_s": ("float", 0.001, 31_536_000),
    "max_message_bytes": ("int", 1024, 256 << 20),
    "max_title_chars": ("int", 1, 100_000),
    "max_system_prompt_chars": ("int", 1, 1_000_000),
    "index_flush_ms": ("int", 10, 3_600_000),
    "io_threads": ("int", 1, 256),
    "url": ("url", None, None),
    "pg_pool_size": ("int", 1, 1000),
    "pg_statement_timeout_ms": ("int", 0, 86_400_000),
    "pg_connect_timeout_s": ("float", 0.1, 600),
    "pg_retry_attempts": ("int", 0, 100),
    "pg_retry_backoff_ms": ("int", 1, 60_000),
    "fsync_threads": ("int", 1, 256),
    "wal_checkpoint_mib": ("int", 1, 4096),
    "wal_checkpoint_s": ("float", 0.01, 3600),
}
URL_SCHEMES = ("postgresql://", "postgres://")


@dataclass
class StorageConfig:
    """Where and how conversation history is stored (see docs/storage.md)."""

    root: str = "storage/history"
    durability: str = "fsync"         # "fsync": every append is fsynced; "batched": every batch_ms
    batch_ms: int = 50                # batched mode: longest time an acknowledged append stays unsynced
    compact_threshold: int = 2000     # journal lines that trigger a background compaction
    lru_size: int = 512               # sessions kept loaded in memory (each holds its journal open)
    lru_mib: int = 256                # ... and at most this many MiB of their files (JSON bytes) loaded
    idle_evict_s: float = 600.0       # a loaded session unused this long is evicted
    max_message_bytes: int = 1 << 20  # largest JSON-encoded message accepted by append/update
    max_title_chars: int = 200        # longest session title
    max_system_prompt_chars: int = 20_000   # longest per-session system prompt
    index_flush_ms: int = 1000        # index.json is rewritten at most this often (and on close)
    io_threads: int = 4               # AsyncHistoryStore worker threads
    url: str | None = None            # postgresql://... selects the PostgreSQL backend (root is then unused)
    pg_pool_size: int = 10            # PostgreSQL connections per node (the pool's maximum)
    pg_statement_timeout_ms: int = 30_000  # PostgreSQL statement_timeout per connection (0 = none)
    pg_connect_timeout_s: float = 5.0      # one connection attempt gives up after this long
    pg_retry_attempts: int = 3        # extra tries when no connection can be had (PostgreSQL restarting)
    pg_retry_backoff_ms: int = 200    # wait before the first retry, doubled each time (capped at 5 s)
    fsync_threads: int = 8            # journals of one checkpoint (new files of one round) fsynced side by side
    wal_checkpoint_mib: int = 64      # fsync mode: a WAL file this big is checkpointed (bounds replay at start)
    wal_checkpoint_s: float = 30.0    # ... and one this old (bounds how long journals stay unsynced)

    def __post_init__(self) -> None:
        if isinstance(self.root, os.PathLike):
            self.root = os.fspath(self.root)
        for key, (kind, lo, hi) in _RULES.items():
            _check(key, kind, getattr(self, key), lo, hi)
        if isinstance(self.idle_evict_s, int):
            self.idle_evict_s = float(self.idle_evict_s)
        if isinstance(self.wal_checkpoint_s, int):
            self.wal_checkpoint_s = float(self.wal_checkpoint_s)
        if isinstance(self.pg_connect_timeout_s, int):
            self.pg_connect_timeout_s = float(self.pg_connect_timeout_s)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StorageConfig:
        """Build from a config table; unknown keys and bad values raise StorageConfigError."""
        if not isinstance(d, dict):
            raise StorageConfigError("(section)", f"expected a table, got {type(d).__name__}")
        allowed = {f.name for f in fields(cls)}
        for key in d:
            if key not in allowed:
                raise StorageConfigError(str(key), f"unknown key (allowed: {', '.join(sorted(allowed))})")
        return cls(**d)


def _check(key: str, kind: str, v: Any, lo: float | None, hi: float | None) -> None:
    if kind == "str":
        if not isinstance(v, str) or not v:
            raise StorageConfigError(key, f"expected a non-empty string, got {v!r}")
    elif kind == "url":
        if v is not None and (not isinstance(v, str) or not v.startswith(URL_SCHEMES)):
            raise StorageConfigError(key, f"expected a {URL_SCHEMES[0]}... URL or nothing, got {_redact(v)!r}")
    elif kind == "choice":
        if v not in DURABILITY_MODES:
            raise StorageConfigError(key, f"expected one of {', '.join(DURABILITY_MODES)}, got {v!r}")
    else:
        ok = isinstance(v, int) if kind == "int" else isinstance(v, (int, float))
        if isinstance(v, bool) or not ok:
            what = "an integer" if kind == "int" else "a number"
            raise StorageConfigError(key, f"expected {what} in {lo:g}..{hi:g}, got {v!r}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise StorageConfigError(key, f"expected a value in {lo:g}..{hi:g}, got {v!r}")


def _redact(v: object) -> object:
    """A URL with its password hidden, for error messages."""
    if isinstance(v, str) and "@" in v and "://" in v:
        scheme, _, rest = v.partition("://")
        cred, _, host = rest.rpartition("@")
        return f"{scheme}://{cred.split(':', 1)[0]}:***@{host}" if ":" in cred else v
    return v
