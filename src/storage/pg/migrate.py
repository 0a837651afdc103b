"""Copy a JSON store into PostgreSQL (``nplt-server migrate-json-to-pg``, whose command line is
``server.migrate``).

Every session is copied whole (deleted sessions, cleared messages, summaries, ids and timestamps
included), one transaction per session, then the counts are compared: sessions, stored messages
and visible messages per session. The JSON store is opened normally, so its lock keeps a running
server off the directory while it is read; opening brings its files up to date as a server start
does (WAL replayed, journals compacted, index.json rewritten, damaged files quarantined), and the
copy itself writes nothing there. Sessions already in PostgreSQL
are left alone (the command can be run again after an interruption) but are still verified.
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..config import StorageConfig
from ..errors import StorageError
from ..models import ChatMessage
from ..store import HistoryStore
from .link import progress
from .search_sql import search_text
from .store import PREVIEW_CHARS, PgHistoryStore


@dataclass
class MigrationReport:
    sessions: int = 0             # sessions in the JSON store
    copied: int = 0               # of which copied now
    already: int = 0              # of which were in PostgreSQL already
    messages: int = 0             # stored messages (visible or cleared) copied now
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


@dataclass
class _Session:
    head: dict[str, Any]          # SessionRecord.to_dict()
    cleared: int
    next_id: int
    msgs: list[dict[str, Any]]


def _read(store: HistoryStore, sid: str) -> _Session:
    """One session as stored, hidden (cleared) messages included."""
    return _Session(*store.raw_state(sid))


def _row(sid: str, d: dict[str, Any]) -> tuple[str, int, bytes, str]:
    try:
        msg = ChatMessage.from_dict(d)
    except (KeyError, TypeError, ValueError, AttributeError):
        msg = ChatMessage(int(d["id"]), "system", "[unreadable message]", metadata={"unreadable": True})
    body = msg.to_dict()
    del body["id"]
    return sid, msg.id, orjson.dumps(body), search_text(msg.content)


async def _copy(pg: PgHistoryStore, sess: _Session) -> int | None:
    """Insert one session; None if it was there already, else the number of messages copied."""
    h = sess.head
    rows = [_row(h["session_id"], d) for d in sess.msgs]

    async def insert(con) -> int | None:
        async with con.transaction():
            done = await con.fetchval(
                "INSERT INTO nplt_sessions (session_id, user_id, title, created_at, updated_at, model, deleted, "
                "cleared_through, next_id, message_count, preview, summaries, system_prompt, title_auto) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) "
                "ON CONFLICT (session_id) DO NOTHING RETURNING 1",
                h["session_id"], h["user_id"], str(h["title"]).encode(), h["created_at"], h["updated_at"], h["model"],
                h["deleted"], sess.cleared, sess.next_id, h["message_count"],
                str(h["preview"])[:PREVIEW_CHARS].encode(), orjson.dumps(h["summaries"]),
                h["system_prompt"].encode() if isinstance(h.get("system_prompt"), str) else None,
                h.get("title_auto") is True)
            if done is None:
                return None
            if rows:
                progress()      # (a long session's messages: the call's bound starts again)
                await con.copy_records_to_table("nplt_messages", records=rows,
                                                columns=("session_id", "id", "body", "search_text"))
            return len(rows)
    return await pg.link.run(insert, write=True)


async def _verify(pg: PgHistoryStore, expected: dict[str, tuple[int, int]]) -> list[str]:
    async def counts(con) -> dict[str, tuple[int, int]]:
        rows = await con.fetch(
            "SELECT s.session_id, s.message_count, (SELECT count(*) FROM nplt_messages m "
            "WHERE m.session_id = s.session_id) AS stored FROM nplt_sessions s WHERE s.session_id = ANY($1)",
            list(expected))
        return {r["session_id"]: (r["stored"], r["message_count"]) for r in rows}
    found = await pg.link.run(counts, write=False)
    bad = []
    for sid, (stored, visible) in expected.items():
        got = found.get(sid)
        if got is None:
            bad.append(f"{sid}: missing in PostgreSQL")
        elif got != (stored, visible):
            bad.append(f"{sid}: JSON has {stored} messages ({visible} visible), PostgreSQL {got[0]} ({got[1]})")
    return bad


async def migrate_json_to_pg(data_dir: str, url: str, pg_config: StorageConfig | None = None) -> MigrationReport:
    """Copy the JSON store under ``data_dir`` into the PostgreSQL database at ``url`` and verify it."""
    if not os.path.isdir(data_dir):
        raise StorageError(f"no JSON store at {data_dir}: not a directory")
    json_store = await asyncio.to_thread(HistoryStore, StorageConfig(root=data_dir))
    report = MigrationReport()
    try:
        cfg = pg_config or StorageConfig()
        pg = await PgHistoryStore.open(StorageConfig(**{**cfg.model_dump(), "url": url}))
        try:
            expected: dict[str, tuple[int, int]] = {}
            for sid in sorted(json_store.index.entries):
                try:
                    sess = await asyncio.to_thread(_read, json_store, sid)
                except StorageError as exc:          # quarantined since the index was read
                    report.mismatches.append(f"{sid}: unreadable in the JSON store ({exc.message})")
                    continue
                report.sessions += 1
                expected[sid] = (len(sess.msgs), sess.head["message_count"])
                n = await _copy(pg, sess)
                if n is None:
                    report.already += 1
                else:
                    report.copied += 1
                    report.messages += n
            report.mismatches += await _verify(pg, expected)
        finally:
            await pg.close()
    finally:
        await asyncio.to_thread(json_store.close)
    return report
