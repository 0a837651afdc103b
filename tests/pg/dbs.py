"""Fresh databases on the test session's embedded PostgreSQL, one per test."""
from __future__ import annotations

import itertools
import os

import asyncpg

from pg.pgserver import EmbeddedPostgres

_names = itertools.count(1)


async def fresh_database(server: EmbeddedPostgres) -> str:
    """Create an empty database and return its URL."""
    name = f"t{os.getpid()}_{next(_names)}"
    con = await asyncpg.connect(server.url())
    try:
        await con.execute(f'CREATE DATABASE "{name}"')
    finally:
        await con.close()
    return server.url(name)
