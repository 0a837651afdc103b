"""StorageConfig: the ``[storage]`` config section, each setting declared once with its default and range."""
from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field, field_validator

from protocol.settings import Invalid, Settings

from .errors import StorageConfigError

URL_SCHEMES = ("postgresql://", "postgres://")


class StorageConfig(Settings):
    """Where and how conversation history is stored (see docs/storage.md). A bad value raises
    StorageConfigError, whether built from a table (``from_dict``) or directly."""

    root: str = Field("storage/history", min_length=1)
    durability: Literal["fsync", "batched"] = "fsync"   # "fsync": every append is fsynced; "batched": every batch_ms
    batch_ms: int = Field(50, ge=1, le=10_000)          # batched mode: longest time an acknowledged append stays unsynced
    compact_threshold: int = Field(2000, ge=2, le=10_000_000)   # journal lines that trigger a background compaction
    lru_size: int = Field(512, ge=1, le=1_000_000)      # sessions kept loaded in memory (each holds its journal open)
    lru_mib: int = Field(256, ge=1, le=1_048_576)       # ... and at most this many MiB of their files (JSON bytes) loaded
    idle_evict_s: float = Field(600.0, ge=0.001, le=31_536_000)   # a loaded session unused this long is evicted
    max_message_bytes: int = Field(1 << 20, ge=1024, le=256 << 20)   # largest JSON-encoded message accepted
    max_title_chars: int = Field(200, ge=1, le=100_000)            # longest session title
    max_system_prompt_chars: int = Field(20_000, ge=1, le=1_000_000)   # longest per-session system prompt
    index_flush_ms: int = Field(1000, ge=10, le=3_600_000)  # index.json is rewritten at most this often (and on close)
    io_threads: int = Field(4, ge=1, le=256)            # AsyncHistoryStore worker threads
    url: str | None = None            # postgresql://... selects the PostgreSQL backend (root is then unused)
    pg_pool_size: int = Field(10, ge=1, le=1000)        # PostgreSQL connections per node (the pool's maximum)
    pg_lock_connections: int = Field(4, ge=1, le=64)    # connections per node holding its session locks (cluster)
    pg_max_lock_waiters: int = Field(16, ge=1, le=10_000)   # connections per node for turns waiting for (or holding) a contended session lock; past it QUEUE_FULL
    pg_append_batch: int = Field(64, ge=1, le=10_000)   # appends sent together at most (group commit; 1 = one statement each)
    pg_statement_timeout_ms: int = Field(30_000, ge=0, le=86_400_000)   # statement_timeout per connection (0 = none)
    pg_connect_timeout_s: float = Field(5.0, ge=0.1, le=600)   # one connection attempt gives up after this long
    pg_retry_attempts: int = Field(3, ge=0, le=100)     # extra tries when no connection can be had (PostgreSQL restarting)
    pg_retry_backoff_ms: int = Field(200, ge=1, le=60_000)   # wait before the first retry, doubled each time (capped at 5 s)
    fsync_threads: int = Field(8, ge=1, le=256)         # journals of one checkpoint (new files of one round) fsynced side by side
    wal_checkpoint_mib: int = Field(64, ge=1, le=4096)  # fsync mode: a WAL file this big is checkpointed (bounds replay at start)
    wal_checkpoint_s: float = Field(30.0, ge=0.01, le=3600)   # ... and one this old (bounds how long journals stay unsynced)

    @classmethod
    def error(cls, key: str, message: str) -> Exception:
        return StorageConfigError(key, message)

    @field_validator("root", mode="before")
    @classmethod
    def _path_as_text(cls, v: Any) -> Any:
        return os.fspath(v) if isinstance(v, os.PathLike) else v

    @field_validator("url")
    @classmethod
    def _postgres_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(URL_SCHEMES):
            raise Invalid(f"expected a {URL_SCHEMES[0]}... URL or nothing, got {_redact(v)!r}")
        return v


def _redact(v: str) -> str:
    """A URL with its password hidden, for error messages."""
    if "@" in v and "://" in v:
        scheme, _, rest = v.partition("://")
        cred, _, host = rest.rpartition("@")
        return f"{scheme}://{cred.split(':', 1)[0]}:***@{host}" if ":" in cred else v
    return v
