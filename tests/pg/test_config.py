"""The [storage] url and PostgreSQL settings; JSON users pay nothing for the PostgreSQL backend."""
from __future__ import annotations

import subprocess
import sys

import pytest

from storage import StorageConfig, StorageConfigError


def test_url_and_pg_settings_are_validated():
    cfg = StorageConfig.from_dict({"url": "postgresql://u:secret@db.example/nplt", "pg_pool_size": 4,
                                   "pg_statement_timeout_ms": 0, "pg_connect_timeout_s": 2,
                                   "pg_retry_attempts": 0, "pg_retry_backoff_ms": 10, "pg_lock_connections": 2})
    assert cfg.pg_pool_size == 4 and cfg.pg_connect_timeout_s == 2.0 and cfg.pg_lock_connections == 2
    assert StorageConfig().pg_lock_connections == 4
    assert StorageConfig().url is None
    with pytest.raises(StorageConfigError, match="url") as err:
        StorageConfig.from_dict({"url": "mysql://u:hunter2@host/db"})
    assert "hunter2" not in str(err.value)
    for key, bad in (("pg_pool_size", 0), ("pg_statement_timeout_ms", -1), ("pg_retry_attempts", 1.5),
                     ("pg_connect_timeout_s", 0), ("pg_lock_connections", 0), ("pg_lock_connections", 65),
                     ("url", "")):
        with pytest.raises(StorageConfigError, match=key):
            StorageConfig.from_dict({key: bad})


def test_json_backend_does_not_import_asyncpg(tmp_path):
    code = f"""
import asyncio, sys
from storage import StorageConfig
from storage.port import open_store
async def main():
    st = await open_store(StorageConfig(root={str(tmp_path)!r}))
    await st.append((await st.create("u")).session_id, "user", "hi")
    await st.close()
asyncio.run(main())
assert "asyncpg" not in sys.modules and "storage.pg.store" not in sys.modules, "asyncpg was imported"
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
