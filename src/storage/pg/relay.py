"""The storage side of relaying events between nodes: several notifications sent in one round trip
(in order), and the spill table for an event too large for a notification (migration 0002)."""
from __future__ import annotations

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


async def spill(con: asyncpg.Connection, bodies: list[bytes]) -> list[int]:
    """Store event bodies too large for a notification; their ids, in order."""
    rows = await con.fetch("INSERT INTO nplt_cluster_events (body) SELECT b FROM unnest($1::bytea[]) "
                           "WITH ORDINALITY AS u(b, i) ORDER BY i RETURNING id", bodies)
    return sorted(r["id"] for r in rows)


async def read_spilled(link: PgLink, event_id: int) -> bytes | None:
    """A spilled event's body (None once it was deleted)."""
    return await link.run(lambda con: con.fetchval("SELECT body FROM nplt_cluster_events WHERE id = $1",
                                                   event_id), write=False)


async def forget_old(con: asyncpg.Connection) -> None:
    await con.execute("DELETE FROM nplt_cluster_events WHERE created_at < now() - make_interval(secs => $1)",
                      float(SPILL_KEEP_S))
