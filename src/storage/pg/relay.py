"""The storage side of relaying events between nodes: several notifications sent in one round trip
(in order), and the spill table for an event too large for a notification (migrations 0003, 0012)."""
from __future__ import annotations

from collections.abc import Collection

import asyncpg

from .link import PgLink
from .notify import _check_channel

#: spilled events older than this are deleted (a listener reads them within milliseconds)
SPILL_KEEP_S = 300


async def notify_many(con: asyncpg.Connection, channel: str, payloads: list[str]) -> None:
    """NOTIFY each payload on ``channel``, in list order, in one statement (one transaction).
    PostgreSQL drops a duplicate of a payload within one transaction: make them unique.

    The transaction commits with ``synchronous_commit = off`` (``set_config(..., true)``: this
    transaction only): a NOTIFY takes a transaction id, so with synchronous_commit on every batch of
    events would wait for a WAL flush. Notifications are not durable anyway (a listener that is not
    connected misses them; the rows are the truth), and the rows they name were committed, durably,
    by their own statements before."""
    await con.execute("SELECT set_config('synchronous_commit', 'off', true), count(pg_notify($1, p)) "
                      "FROM unnest($2::text[]) AS p", _check_channel(channel), payloads)


async def spill(con: asyncpg.Connection, bodies: list[bytes], sessions: list[str | None]) -> list[int]:
    """Store event bodies too large for a notification, each with the session it belongs to (or
    None); their ids, in order."""
    rows = await con.fetch("INSERT INTO nplt_cluster_events (body, session_id) SELECT b, s "
                           "FROM unnest($1::bytea[], $2::text[]) WITH ORDINALITY AS u(b, s, i) ORDER BY i "
                           "RETURNING id", bodies, sessions)
    return sorted(r["id"] for r in rows)


async def read_spilled(link: PgLink, event_id: int) -> bytes | None:
    """A spilled event's body (None once it was deleted)."""
    return await link.run(lambda con: con.fetchval("SELECT body FROM nplt_cluster_events WHERE id = $1",
                                                   event_id), write=False)


async def forget_spilled(con: asyncpg.Connection, sessions: Collection[str] = ()) -> None:
    """Delete the spilled events older than ``SPILL_KEEP_S``, and those of ``sessions`` (purged,
    deleted or cleared: what they said is not kept here either)."""
    await con.execute("DELETE FROM nplt_cluster_events WHERE created_at < now() - make_interval(secs => $1) "
                      "OR session_id = ANY($2::text[])", float(SPILL_KEEP_S), list(sessions))
