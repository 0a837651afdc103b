"""Migrations: applied once, recorded in nplt_schema_version, safe when nodes start together."""
from __future__ import annotations

import asyncio

import asyncpg

from storage import StorageConfig
from storage.pg.schema import migrations
from storage.port import open_store


async def test_migrations_apply_once_even_when_nodes_start_together(pg_url):
    shipped = migrations()
    assert shipped and shipped[0].version == 1 and shipped[0].name.startswith("0001_")
    stores = await asyncio.gather(*(open_store(StorageConfig(url=pg_url)) for _ in range(4)))
    try:
        rec = await stores[0].create("alice")
        assert (await stores[3].get(rec.session_id)).session_id == rec.session_id
    finally:
        for st in stores:
            await st.close()
    con = await asyncpg.connect(pg_url)
    try:
        rows = await con.fetch("SELECT version, name FROM nplt_schema_version ORDER BY version")
        assert [(r["version"], r["name"]) for r in rows] == [(m.version, m.name) for m in shipped]
        assert await con.fetchval("SELECT count(*) FROM pg_extension WHERE extname = 'pg_trgm'") == 1
    finally:
        await con.close()
    again = await open_store(StorageConfig(url=pg_url))          # nothing left to apply
    await again.close()


async def test_migration_files_ship_as_package_data():
    from importlib import resources
    names = [f.name for f in resources.files("storage.pg").joinpath("migrations").iterdir()]
    assert any(n.endswith(".sql") for n in names)
