"""PostgreSQL-only tests: the session's embedded server (shared with tests/storage_port) and a
fresh database per test."""
from __future__ import annotations

import pytest

from pg.dbs import fresh_database
from pg.pgserver import shared_server, stop_shared


@pytest.fixture(scope="session")
def pg_server():
    try:
        yield shared_server()
    finally:
        stop_shared()


@pytest.fixture
async def pg_url(pg_server) -> str:
    return await fresh_database(pg_server)
