"""Long-term user memory on PostgreSQL: ``PgUserDocs``, the ``DocBackend`` of
``server.memory.user_store.DocUserMemoryStore`` when the history is on PostgreSQL.

One row per user (``nplt_user_memory``, migration 0007) holds the document a ``UserFiles`` file
holds, so every node on the database sees the same memory, and what a user forgets on one node is
gone on all. A write is a compare and set on the row's version; an update that lost that race to
another node is done again in one transaction holding the row (``update``), which cannot lose. A
write notifies the other nodes in the same statement (channel ``nplt_user_memory``, payload: the
user id and the writing process), whose caches drop that user.
Their listener starts before their first read; after it reconnects (notifications may have been
missed) they drop every cached user. ``cleared_upto`` reads how far a clear, delete or purge of a
session took its messages back from the session's row (the history is on the same database), the
floor ``DocUserMemoryStore.forget_session`` records. ``copy_user_files`` brings JSON user memory
files over (``nplt-server migrate-json-to-pg``).
"""
from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

import orjson

from server.memory.user_store import ALL_MESSAGES, UserDoc
from storage.pg.notify import Listener, encode_payload

log = logging.getLogger("nplt.memory")

CHANNEL = "nplt_user_memory"
T = TypeVar("T")


class PgUserDocs:
    """``DocBackend`` over the ``nplt_user_memory`` table of ``link`` (a ``storage.pg.link.PgLink``)."""

    def __init__(self, link: Any) -> None:
        self.link = link
        self.on_change: Callable[[str | None], None] | None = None
        self.origin = secrets.token_hex(8)        # this process: its own notifications are not news
        self._listener: Listener | None = None
        self._starting = asyncio.Lock()

    async def _listen(self) -> None:
        """LISTEN before the first read, so no change after that read goes unnoticed."""
        if self._listener is not None:
            return
        async with self._starting:
            if self._listener is None:
                listener = Listener(self.link, [CHANNEL], self._event, self._gap)
                await listener.start()
                self._listener = listener

    def _event(self, _channel: str, payload: dict[str, Any]) -> None:
        user = payload.get("user")
        if payload.get("origin") != self.origin and isinstance(user, str) and self.on_change is not None:
            self.on_change(user)

    def _gap(self) -> None:
        if self.on_change is not None:
            self.on_change(None)

    async def load(self, user_id: str) -> tuple[UserDoc, Any]:
        await self._listen()
        row = await self.link.run(lambda con: con.fetchrow(
            "SELECT doc, version FROM nplt_user_memory WHERE user_id = $1", user_id), write=False)
        return _parsed(row, user_id)

    async def save(self, user_id: str, doc: UserDoc, version: Any) -> bool:
        sql, args = self._write(user_id, doc, version)
        rows = await self.link.run(lambda con: con.fetch(sql, *args), write=True)
        return len(rows) == 1

    async def update(self, user_id: str, change: Callable[[UserDoc], tuple[UserDoc | None, T]]
                     ) -> tuple[UserDoc, Any, T] | None:
        """``change`` in one transaction holding the user's row (SELECT ... FOR UPDATE): another
        node's compare-and-set waits for the commit and then fails its check. None: there was no
        row and another node inserted the first one meanwhile."""
        await self._listen()

        async def work(con: Any) -> tuple[UserDoc, Any, T] | None:
            async with con.transaction():
                row = await con.fetchrow(
                    "SELECT doc, version FROM nplt_user_memory WHERE user_id = $1 FOR UPDATE", user_id)
                doc, version = _parsed(row, user_id)
                new, result = change(doc)
                if new is None:
                    return doc, version, result
                sql, args = self._write(user_id, new, version)
                if len(await con.fetch(sql, *args)) != 1:
                    return None
                return new, (version or 0) + 1, result
        return await self.link.run(work, write=True)

    async def cleared_upto(self, session_id: str) -> int:
        """The highest message id of ``session_id`` a clear, delete or purge that has changed the
        history took back: every message stored so far (``next_id - 1``: a clear hides them all, a
        delete or a failed clear forgets them all the same); ``ALL_MESSAGES`` when the session is
        gone (purged)."""
        got = await self.link.run(lambda con: con.fetchval(
            "SELECT next_id - 1 FROM nplt_sessions WHERE session_id = $1", session_id), write=False)
        return ALL_MESSAGES if got is None else int(got)

    def _write(self, user_id: str, doc: UserDoc, version: Any) -> tuple[str, tuple]:
        """The statement that stores ``doc`` if the row is still at ``version`` (None: no row) and
        notifies the other nodes; it returns one row when it wrote."""
        body = orjson.dumps(doc.to_json(user_id)).decode()
        note = encode_payload({"user": user_id, "origin": self.origin})
        if version is None:
            return ("WITH w AS (INSERT INTO nplt_user_memory (user_id, doc, version) VALUES ($1, $2::jsonb, 1) "
                    "ON CONFLICT (user_id) DO NOTHING RETURNING 1) SELECT pg_notify($3, $4) FROM w",
                    (user_id, body, CHANNEL, note))
        return ("WITH w AS (UPDATE nplt_user_memory SET doc = $2::jsonb, version = version + 1 "
                "WHERE user_id = $1 AND version = $5 RETURNING 1) SELECT pg_notify($3, $4) FROM w",
                (user_id, body, CHANNEL, note, version))

    async def close(self) -> None:
        if self._listener is not None:
            await self._listener.close()
            self._listener = None


def _parsed(row: Any, user_id: str) -> tuple[UserDoc, Any]:
    """(document, version) of a row of ``nplt_user_memory`` (None: no row, an empty document)."""
    if row is None:
        return UserDoc(), None
    try:
        return UserDoc.read(orjson.loads(row["doc"]), user_id)[1], row["version"]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("user memory of one user unreadable (%s): starting empty (the next write replaces it)", exc)
        return UserDoc(), row["version"]


@dataclass
class UserMemoryCopy:
    """What ``copy_user_files`` did: users found in the files, copied now, in PostgreSQL already, and
    what did not match (an unreadable file, a row that does not hold the file's items)."""
    users: int = 0
    copied: int = 0
    already: int = 0
    mismatches: list[str] = field(default_factory=list)


def _read_files(root: Path) -> tuple[dict[str, UserDoc], list[str]]:
    docs: dict[str, UserDoc] = {}
    bad: list[str] = []
    for path in sorted(root.glob("*.json")) if root.is_dir() else []:
        try:
            user, doc = UserDoc.read(orjson.loads(path.read_bytes()))
            docs[user] = doc
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            bad.append(f"{path.name}: unreadable user memory file ({exc})")
    return docs, bad


async def copy_user_files(root: str | Path, link: Any) -> UserMemoryCopy:
    """Copy the JSON user memory files under ``root`` (``UserFiles``) into ``nplt_user_memory`` and
    verify that each user's row holds the file's items (``nplt-server migrate-json-to-pg``). A user
    who has a row already keeps it (a rerun copies nothing)."""
    docs, bad = await asyncio.to_thread(_read_files, Path(root))
    report = UserMemoryCopy(users=len(docs), mismatches=bad)
    for user, doc in docs.items():
        body = orjson.dumps(doc.to_json(user)).decode()
        done = await link.run(lambda con: con.fetchval(
            "INSERT INTO nplt_user_memory (user_id, doc, version) VALUES ($1, $2::jsonb, 1) "
            "ON CONFLICT (user_id) DO NOTHING RETURNING 1", user, body), write=True)
        if done is None:
            report.already += 1
        else:
            report.copied += 1
    rows = await link.run(lambda con: con.fetch(
        "SELECT user_id, doc FROM nplt_user_memory WHERE user_id = ANY($1)", list(docs)), write=False)
    stored = {r["user_id"]: [i["id"] for i in orjson.loads(r["doc"]).get("items", [])] for r in rows}
    for user, doc in docs.items():
        want = [i.id for i in doc.items]
        if stored.get(user) != want:
            report.mismatches.append(f"user memory of {user!r}: the file has {len(want)} items, "
                                     f"PostgreSQL {len(stored.get(user) or [])}")
    return report
