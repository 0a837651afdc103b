"""Session locks across nodes: a PostgreSQL advisory lock per session, held on a pooled connection
for as long as the holder runs (one turn per session at a time, whichever node runs it).

Waiters are granted the lock in arrival order (PostgreSQL's lock queue). If the holding node dies,
its connection drops and PostgreSQL releases the lock, so a waiter on another node goes on. The
wait is not bounded by ``pg_statement_timeout_ms`` (a turn may take minutes); cancel the waiting
task to give up.
"""
from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ..ids import validate_session_id
from .link import CONNECTION_ERRORS, PgLink, _discard, is_connection_error


def lock_key(session_id: str) -> int:
    """The signed 64-bit advisory lock key of a session."""
    digest = hashlib.blake2b(b"nplt-session:" + session_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@asynccontextmanager
async def session_lock(link: PgLink, session_id: str) -> AsyncIterator[int]:
    """Hold the session's lock inside the ``async with``; yields the backend pid holding it.
    Raises StorageUnavailable if PostgreSQL cannot be reached (the lock was then not taken)."""
    validate_session_id(session_id)
    key = lock_key(session_id)

    async def take(con):
        await con.execute("SET statement_timeout = 0")
        await con.execute("SELECT pg_advisory_lock($1)", key)
        return con

    con = await link.run_holding(take, bounded=False)      # (the wait is not bounded)
    try:
        yield con.get_server_pid()
    finally:
        try:
            await con.execute("SELECT pg_advisory_unlock($1)", key)
            await con.execute("RESET statement_timeout")
        except CONNECTION_ERRORS as exc:
            if not is_connection_error(exc):
                raise
            _discard(con)               # the lock went with the connection
        await link.release(con)

