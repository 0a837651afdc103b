"""Schema migrations: the numbered plain-SQL files of ``migrations/`` applied in order at start.

Applied versions are recorded in ``nplt_schema_version``. The whole check-and-apply runs under a
PostgreSQL advisory lock, so nodes starting at the same time apply each migration exactly once;
each migration runs in its own transaction with its version row.

A database already migrated past the newest migration this build ships (a newer release ran on it)
is refused (``SchemaTooNew``; the node does not start): this build's statements may not fit that
schema, so an older node is upgraded rather than run against it. There is no rolling-upgrade rule
that lets nodes of two releases share a database.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources

from protocol import ErrorCode

from ..errors import StorageError

log = logging.getLogger("storage")

MIGRATION_RE = re.compile(r"(\d{4})_[a-z0-9_]+\.sql")
#: pg_advisory_lock key of the migration step ("nplt" + 1).
MIGRATION_LOCK_KEY = 0x6E706C74_00000001
VERSION_TABLE = """CREATE TABLE IF NOT EXISTS nplt_schema_version (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now())"""


class SchemaTooNew(StorageError):
    """The database was migrated by a newer release than this build (see the module docstring)."""

    code = ErrorCode.STORAGE_ERROR


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """The migrations shipped with the package, by version."""
    out = []
    for f in resources.files(__package__).joinpath("migrations").iterdir():
        m = MIGRATION_RE.fullmatch(f.name)
        if m:
            out.append(Migration(int(m.group(1)), f.name, f.read_text(encoding="utf-8")))
    out.sort(key=lambda m: m.version)
    if len({m.version for m in out}) != len(out):
        raise RuntimeError("two migrations share a version number")
    return out


async def migrate(con) -> list[str]:
    """Apply the pending migrations on asyncpg connection ``con``; returns the names applied.
    Raises ``SchemaTooNew`` (nothing applied) if the database has a version newer than any shipped."""
    applied = []
    await con.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        await con.execute(VERSION_TABLE)
        rows = await con.fetch("SELECT version, name FROM nplt_schema_version")
        done = {r["version"] for r in rows}
        shipped = migrations()
        known = shipped[-1].version if shipped else 0
        if rows and max(done) > known:
            newest = max(rows, key=lambda r: r["version"])
            raise SchemaTooNew(
                f"the PostgreSQL database has schema version {newest['version']} ({newest['name']}), but this "
                f"build knows schema versions up to {known}: a newer release migrated it; upgrade this node "
                "to that release (or newer) before starting it on this database")
        for m in shipped:
            if m.version in done:
                continue
            async with con.transaction():
                await con.execute(m.sql)
                await con.execute("INSERT INTO nplt_schema_version (version, name) VALUES ($1, $2)",
                                  m.version, m.name)
            log.info("storage: applied PostgreSQL migration %s", m.name)
            applied.append(m.name)
    finally:
        await con.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    return applied


async def schema_version(con) -> int:
    """The highest applied migration version (0 if none)."""
    return await con.fetchval("SELECT coalesce(max(version), 0) FROM nplt_schema_version")
