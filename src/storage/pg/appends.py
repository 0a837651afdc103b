"""Group commit of appends on PostgreSQL: the appends that arrive while earlier ones are in flight
wait, and go together in the next statement (``nplt_append_many``, migration 0010): one round trip,
one transaction, one commit for all of them, instead of one each.

A node under load spends most of its PostgreSQL cost per statement (the round trip's system calls
and wake-ups on both sides, and the commit's WAL flush), not per row. Nothing waits for company: an
append with nothing in flight before it is sent at once.

Each caller gets its own outcome. A batch is one transaction, so a failed batch wrote nothing: a
batch that PostgreSQL refused (a bad value, a statement timeout) is sent again one append at a time,
so only the append at fault fails; a lost connection fails every append of its batch, none of them
acknowledged (``PgLink``'s rule for writes).

A fenced append (``fence``: the id of the user message the appending turn answers) is made only if
the session is still as that turn left it, checked in the same statement (``FENCED_SQL``), under
the session row's lock: not deleted, not cleared past the fence, and no message after the fence but
the ones a regenerate or an edit superseded (``metadata.superseded``). Otherwise it fails with
``SessionMoved``, nothing written: a node whose turn lost its session lock without noticing it yet
(stalled while PostgreSQL dropped its connections, and another node took the session over) does not
store its answer after the other node's messages, or in a session cleared meanwhile. The batch's
session rows are locked first, in the order of their ids (as ``nplt_append_many`` takes them), and
the check reads the messages as of the statement's start: a session row that another transaction
changed meanwhile (an append committed while this statement waited for the row) shows a last id
whose message the statement does not see, which fails the fence too. Batches with no fenced append
use ``SQL`` as before. (A body's ``\\u0000`` escapes are read as U+FFFD by the check: PostgreSQL's
JSON functions refuse them, and the check only looks at ``metadata.superseded``.)
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

import asyncpg

from protocol import ErrorCode

from ..errors import InvalidArgument, StorageError
from .link import PgLink

#: Batches of one node in flight at once (the rest wait for one of them to return).
IN_FLIGHT = 2
SQL = ("SELECT * FROM nplt_append_many($1::text[], $2::text[], $3::bytea[], $4::bytea[], $5::text[], "
       "$6::bigint[])")
#: ``SQL`` with the fence of each entry ($7: the fence, NULL for none; module doc). One row per entry
#: at least: ``fk`` its index, ``why`` why a fenced entry was not made ('deleted', 'cleared',
#: 'written'; NULL when it was, or had no fence), then ``nplt_append_many``'s columns (NULL when
#: nothing was appended).
FENCED_SQL = """
WITH l AS MATERIALIZED (
    SELECT n.session_id, n.next_id, n.cleared_through, n.deleted FROM nplt_sessions n
    WHERE n.session_id = ANY($1::text[]) ORDER BY n.session_id FOR UPDATE),
f AS MATERIALIZED (
    SELECT u.o, u.sid, CASE
        WHEN u.fence IS NULL OR l.session_id IS NULL THEN NULL
        WHEN l.deleted THEN 'deleted'
        WHEN l.cleared_through >= u.fence THEN 'cleared'
        WHEN EXISTS (SELECT 1 FROM unnest($1::text[]) WITH ORDINALITY AS v(sid, o) WHERE v.sid = u.sid AND v.o < u.o)
          OR NOT EXISTS (SELECT 1 FROM nplt_messages m WHERE m.session_id = u.sid AND m.id = l.next_id - 1)
          OR EXISTS (SELECT 1 FROM nplt_messages m WHERE m.session_id = u.sid AND m.id > u.fence
                     AND (replace(convert_from(m.body, 'UTF8'), '\\u0000', '\\ufffd')::json
                          #>> '{metadata,superseded}') IS DISTINCT FROM 'true')
        THEN 'written' END AS why
    FROM unnest($1::text[], $7::bigint[]) WITH ORDINALITY AS u(sid, fence, o)
    LEFT JOIN l ON l.session_id = u.sid),
a AS (SELECT * FROM nplt_append_many(ARRAY(SELECT CASE WHEN f.why IS NULL THEN f.sid END FROM f ORDER BY f.o),
                                     $2::text[], $3::bytea[], $4::bytea[], $5::text[], $6::bigint[]))
SELECT f.o::integer AS fk, f.why, a.* FROM f LEFT JOIN a ON a.k = f.o ORDER BY f.o, a.id"""

_WHY = {"deleted": "it was deleted", "cleared": "it was cleared",
        "written": "another message was stored after the one this answers"}


class SessionMoved(StorageError):
    """A fenced append not made: the session changed since the appending turn's message (deleted,
    cleared, or written after it: another node took the session over). Nothing was written."""

    code = ErrorCode.STORAGE_UNAVAILABLE

    def __init__(self, session_id: str, fence: int, why: str) -> None:
        super().__init__(f"session {session_id} changed since message {fence} ({_WHY.get(why, why)}): "
                         "another node took it over; not stored")
        self.why = why


@dataclass(slots=True, eq=False)
class _Append:
    session_id: str
    stamp: str
    preview: bytes
    body: bytes
    text: str
    after: int | None
    fence: int | None
    done: asyncio.Future


class AppendBatcher:
    """Appends to ``nplt_messages`` through ``link``, at most ``max_batch`` to a statement."""

    def __init__(self, link: PgLink, max_batch: int) -> None:
        self.link = link
        self.max_batch = max_batch
        self._waiting: list[_Append] = []
        self._senders = 0          # batches in flight
        self._tasks: set[asyncio.Task] = set()
        self.statements = 0        # statements sent (a figure for tests and benchmarks)

    async def append(self, session_id: str, stamp: str, preview: bytes, body: bytes, text: str,
                     after: int | None, fence: int | None = None) -> list[asyncpg.Record]:
        """The rows ``nplt_append_many`` returned for this append (empty: no such session), once
        committed. Cancelled before its batch was sent, the append is not made. ``fence``: made only
        if the session is still as the turn answering message ``fence`` left it, else SessionMoved
        (module doc)."""
        item = _Append(session_id, stamp, preview, body, text, after, fence,
                       asyncio.get_running_loop().create_future())
        self._waiting.append(item)
        if self._senders < IN_FLIGHT:
            self._senders += 1
            task = asyncio.get_running_loop().create_task(self._send())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            return await item.done
        except asyncio.CancelledError:
            if item in self._waiting:
                self._waiting.remove(item)
            raise

    async def _send(self) -> None:
        try:
            while self._waiting:
                batch = [a for a in self._waiting[:self.max_batch] if not a.done.done()]   # (cancelled)
                del self._waiting[:self.max_batch]
                if batch:
                    await self._run(batch, split=len(batch) > 1)
        except asyncio.CancelledError:        # the loop is going away: nobody sends the rest
            waiting, self._waiting = self._waiting, []
            _fail(waiting, StorageError("the store was closed before the append was sent"))
            raise
        finally:
            self._senders -= 1

    async def _run(self, batch: list[_Append], *, split: bool) -> None:
        self.statements += 1
        args = ([a.session_id for a in batch], [a.stamp for a in batch], [a.preview for a in batch],
                [a.body for a in batch], [a.text for a in batch], [a.after for a in batch])
        fenced = any(a.fence is not None for a in batch)
        try:
            if fenced:
                rows = await self.link.run(lambda con: con.fetch(FENCED_SQL, *args, [a.fence for a in batch]),
                                           write=True)
            else:
                rows = await self.link.run(lambda con: con.fetch(SQL, *args), write=True)
        except (InvalidArgument, StorageError) as exc:
            if split and type(exc) in (InvalidArgument, StorageError):   # refused, nothing written
                for item in batch:
                    if not item.done.done():
                        await self._run([item], split=False)
                return
            _fail(batch, exc)
            return
        except BaseException as exc:
            _fail(batch, exc)
            raise
        out: list[list[asyncpg.Record]] = [[] for _ in batch]
        moved: dict[int, str] = {}
        for row in rows:
            if not fenced:
                out[row["k"] - 1].append(row)
            elif row["why"] is not None:
                moved[row["fk"] - 1] = row["why"]
            elif row["mid"] is not None:
                out[row["fk"] - 1].append(row)
        for i, (item, got) in enumerate(zip(batch, out)):
            if item.done.done():
                continue
            if i in moved:
                assert item.fence is not None
                item.done.set_exception(SessionMoved(item.session_id, item.fence, moved[i]))
            else:
                item.done.set_result(got)


def _fail(batch: list[_Append], exc: BaseException) -> None:
    for item in batch:
        if not item.done.done():
            item.done.set_exception(exc if not isinstance(exc, asyncio.CancelledError) else
                                    StorageError("the append's batch was cancelled"))

