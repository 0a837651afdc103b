"""The shared storage suite runs every test on both backends: ``store`` is an open StoragePort,
JSON files in a temporary directory or a fresh database on the session's embedded PostgreSQL."""
from __future__ import annotations

import pytest

from pg.dbs import drop_database, fresh_database
from pg.pgserver import shared_server, stop_shared
from storage import StorageConfig
from storage.port import open_store


@pytest.fixture(scope="session")
def pg_server():
    try:
        yield shared_server()
    finally:
        stop_shared()


@pytest.fixture(params=["json", "pg"])
def backend(request) -> str:
    return request.param


@pytest.fixture
async def make_config(backend, tmp_path, request):
    """``make_config(**overrides)`` -> a StorageConfig for this test's backend (same root / database
    every call, so a second open sees the first one's data)."""
    server = request.getfixturevalue("pg_server") if backend == "pg" else None
    url = await fresh_database(server) if server is not None else None

    def make(**over) -> StorageConfig:
        return StorageConfig(root=str(tmp_path / "history"), url=url, **over)
    try:
        yield make
    finally:
        if url is not None:
            await drop_database(server, url)      # (hundreds left made the session's end take minutes)


@pytest.fixture
async def store(make_config):
    st = await open_store(make_config())
    try:
        yield st
    finally:
        await st.close()
