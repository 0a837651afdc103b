"""GET /readyz on a server whose store is PostgreSQL: it asks PostgreSQL (the store's
``check_ready``), so it is 200 while PostgreSQL is up, 503 while it is stopped, and 200 again once it
is back. A real server, a real HTTP client (httpx2), a real PostgreSQL stopped and started."""
from __future__ import annotations

import httpx2 as httpx
import pytest

from pg.dbs import fresh_database
from server.app import Server
from storage import StorageClosed, StorageConfig
from storage.port import open_store
from testkit.echo_agent import EchoAgent
from testkit.server import make_config, poll


async def test_readyz_follows_postgres(tmp_path, own_server):
    url = await fresh_database(own_server)
    store = await open_store(StorageConfig(url=url, pg_retry_attempts=1, pg_retry_backoff_ms=10,
                                           pg_connect_timeout_s=1))
    srv = Server(make_config(tmp_path, sections={"http": {"listen": "127.0.0.1:0", "readiness_timeout_s": 5}}),
                 agent=EchoAgent(), store=store, memory="basic")
    await srv.start()
    readyz = f"http://127.0.0.1:{srv.http.port}/readyz"
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            r = await client.get(readyz)
            assert (r.status_code, r.text) == (200, "ready\n")
            own_server.stop()
            r = await client.get(readyz)
            assert (r.status_code, r.text) == (503, "not ready: storage: StorageUnavailable\n")
            assert (await client.get(f"http://127.0.0.1:{srv.http.port}/healthz")).status_code == 200
            own_server.start()

            async def ready() -> bool:
                return (await client.get(readyz)).status_code == 200
            await poll(ready, timeout=30)
    finally:
        await srv.stop()
        await store.close()


async def test_check_ready_of_a_closed_store_fails(pg_url):
    store = await open_store(StorageConfig(url=pg_url))
    await store.check_ready()
    await store.close()
    with pytest.raises(StorageClosed):
        await store.check_ready()
