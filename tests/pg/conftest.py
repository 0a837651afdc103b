"""PostgreSQL-only tests: the session's embedded server (shared with tests/storage_port) and a
fresh database per test."""
from __future__ import annotations

import pytest

from pg.dbs import database
from pg.pgserver import shared_server, stop_shared


@pytest.fixture(scope="session")
def pg_server():
    try:
        yield shared_server()
    finally:
        stop_shared()


@pytest.fixture
async def pg_url(pg_server):
    async for url in database(pg_server):      # dropped after the test
        yield url


@pytest.fixture
def own_server(restartable_server):
    try:
        yield restartable_server
    finally:
        restartable_server.start()


@pytest.fixture
async def make_holders(pg_url):
    """``await make_holders(**storage_settings)``: a store on a fresh database and the session-lock
    holders of two nodes on it, ("mine", "other"), all closed after the test."""
    from storage import StorageConfig
    from storage.pg.lock_holder import LockHolder, key_of
    from storage.port import open_store
    opened: list = []

    async def make(**storage):
        store = await open_store(StorageConfig(url=pg_url, **storage))
        opened.append(store)
        holders = []
        for name in ("mine", "other"):
            holder = LockHolder(store.link, key_of("node", name), f"nplt-node:{name}")
            opened.append(holder)
            await holder.open()
            holders.append(holder)
        return store, *holders
    try:
        yield make
    finally:
        for thing in reversed(opened):     # the holders before their store
            await thing.close()
