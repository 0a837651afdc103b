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
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

import asyncpg

from ..errors import InvalidArgument, StorageError
from .link import PgLink

#: Batches of one node in flight at once (the rest wait for one of them to return).
IN_FLIGHT = 2
SQL = ("SELECT * FROM nplt_append_many($1::text[], $2::text[], $3::bytea[], $4::bytea[], $5::text[], "
       "$6::bigint[])")


@dataclass(slots=True, eq=False)
class _Append:
    session_id: str
    stamp: str
    preview: bytes
    body: bytes
    text: str
    after: int | None
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
                     after: int | None) -> list[asyncpg.Record]:
        """The rows ``nplt_append_many`` returned for this append (empty: no such session), once
        committed. Cancelled before its batch was sent, the append is not made."""
        item = _Append(session_id, stamp, preview, body, text, after, asyncio.get_running_loop().create_future())
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
        try:
            rows = await self.link.run(lambda con: con.fetch(
                SQL, [a.session_id for a in batch], [a.stamp for a in batch], [a.preview for a in batch],
                [a.body for a in batch], [a.text for a in batch], [a.after for a in batch]), write=True)
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
        for row in rows:
            out[row["k"] - 1].append(row)
        for item, got in zip(batch, out):
            if not item.done.done():
                item.done.set_result(got)


def _fail(batch: list[_Append], exc: BaseException) -> None:
    for item in batch:
        if not item.done.done():
            item.done.set_exception(exc if not isinstance(exc, asyncio.CancelledError) else
                                    StorageError("the append's batch was cancelled"))

