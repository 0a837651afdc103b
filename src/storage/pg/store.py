"""PgHistoryStore: the storage port on PostgreSQL (tables of migrations/0001_*.sql).

Every change is one SQL statement (or one transaction), committed before the call returns, so
what a call acknowledged survives a crash of the node, and a call that failed left nothing behind.
Concurrent appends to one session serialize on the session row, which hands out message ids.
Semantics follow the JSON backend (docs/storage.md): soft delete, clear hides messages until
restore, rename / model / summary do not change ``updated_at``.
"""
from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

import asyncpg
import orjson

from ..config import StorageConfig
from ..errors import InvalidArgument, MessageTooLarge, NotFound
from ..export import FORMATS, ExportTooLarge, export
from ..ids import new_session_id, validate_session_id
from ..index import parse_cursor
from ..models import (DEFAULT_TITLE, ChatMessage, EncodedPage, Page, SearchHit, SessionRecord, SummaryRecord,
                      ToolCall, encode_page, now_iso)
from ..search import compile_query, searchable, snippet
from .. import validation as checks
from .appends import AppendBatcher
from .link import PgLink
from .search_sql import candidates_sql, search_text

PREVIEW_CHARS = 80
_REC = ("session_id, user_id, title, created_at, updated_at, message_count, deleted, model, preview, "
        "summaries, system_prompt, title_auto")
INT64_MAX = (1 << 63) - 1
FRESH_APPEND_S = 1.0     # get_loaded: what an append returned stands for the session this long at most
APPENDED_KEPT = 1024     # get_loaded: records of the sessions appended to last, at most
WRITTEN_KEPT = 4         # record_and_messages: messages appended by this node kept per session
_REC_S = ", ".join(f"s.{c.strip()}" for c in _REC.split(","))    # the same columns of nplt_sessions s


def _record(row: asyncpg.Record, *, summaries: bool = True) -> SessionRecord:
    sums = [SummaryRecord.from_dict(d) for d in orjson.loads(row["summaries"])] if summaries else []
    prompt = row["system_prompt"]
    return SessionRecord(row["session_id"], row["user_id"], row["title"].decode(), row["created_at"], row["updated_at"],
                         row["message_count"], row["deleted"], row["model"], row["preview"].decode(), sums,
                         prompt.decode() if prompt is not None else None, row["title_auto"])


def _record_lite(row: asyncpg.Record) -> SessionRecord:
    """A record from a row of the session's columns without summaries and system prompt."""
    return SessionRecord(row["session_id"], row["user_id"], row["title"].decode(), row["created_at"],
                         row["updated_at"], row["message_count"], row["deleted"], row["model"],
                         row["preview"].decode(), title_auto=row["title_auto"])


def message_of(mid: int, body: bytes) -> ChatMessage:
    """A message from its stored row (id, body)."""
    d = orjson.loads(body)
    d["id"] = mid
    return ChatMessage.from_dict(d)


_message = message_of


def _decoded(rows: list[tuple[int, bytes]], memo: dict[int, tuple[bytes, ChatMessage]],
             written: dict[int, tuple[bytes, ChatMessage]] | None = None) -> list[ChatMessage]:
    """``message_of`` of each row, reusing ``memo``'s message for a body unchanged since the last
    read (keyed by id), else ``written``'s (what this node appended) for a body unchanged since
    then; the memo keeps only this read's messages."""
    out: list[ChatMessage] = []
    fresh: dict[int, tuple[bytes, ChatMessage]] = {}
    for mid, body in rows:
        got = memo.get(mid)
        if got is None and written is not None:
            got = written.get(mid)
        m = got[1] if got is not None and got[0] == body else message_of(mid, body)
        fresh[mid] = (body, m)
        out.append(m)
    memo.clear()
    memo.update(fresh)
    return out


def _bigint(n: int) -> int:
    """A message id bound as a PostgreSQL bigint (any int: the ones out of range clamped)."""
    return max(min(n, INT64_MAX), -INT64_MAX)


def _rows(rows: list[asyncpg.Record]) -> list[tuple[int, bytes]]:
    """(id, body) of the rows that carry a message (a LEFT JOIN gives one row without when none)."""
    return [(r["id"], r["body"]) for r in rows if r["id"] is not None]


def _keep(cache: OrderedDict, key: str, value: Any) -> None:
    """``cache[key] = value`` as the newest entry; the oldest go past APPENDED_KEPT entries."""
    cache[key] = value
    cache.move_to_end(key)
    if len(cache) > APPENDED_KEPT:
        cache.popitem(last=False)


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what}: not valid Unicode text (lone surrogate)") from None


class PgHistoryStore:
    """The storage port on PostgreSQL. Open with ``await PgHistoryStore.open(config)``."""

    sync = None        # no synchronous twin (the server falls back to the async calls)
    reads_with_append = True   # append(read_after=...) (the turn runner asks the memory layer for it)

    def __init__(self, config: StorageConfig) -> None:
        self.config = config
        self.link = PgLink(config)
        self.appends = AppendBatcher(self.link, config.pg_append_batch)
        self._appended: OrderedDict[str, tuple[float, SessionRecord]] = OrderedDict()   # see get_loaded
        # the last WRITTEN_KEPT messages this node appended to each of the last APPENDED_KEPT sessions:
        # id -> (stored body, the message append returned), which record_and_messages gives back
        # instead of decoding the same bytes again (the memory layer's view holds that object)
        self._written: OrderedDict[str, dict[int, tuple[bytes, ChatMessage]]] = OrderedDict()
        # what an append with ``read_after`` read in its own statement, for the next
        # record_and_messages(session_id, read_after): session -> (when, read_after, the record, rows)
        self._prefetched: OrderedDict[str, tuple[float, int, asyncpg.Record, list[tuple[int, bytes]]]] = OrderedDict()

    @classmethod
    async def open(cls, config: StorageConfig) -> PgHistoryStore:
        """Connect, apply pending migrations (under an advisory lock), open the pool."""
        store = cls(config)
        await store.link.open()
        return store

    async def close(self) -> None:
        await self.link.close()

    async def check_ready(self) -> None:
        """The readiness probe (``/readyz``): a ``SELECT 1`` through the pool, not retried; raises
        StorageUnavailable when PostgreSQL is unreachable or slower than the statement timeout."""
        await self.link.ping()

    def get_loaded(self, session_id: str) -> SessionRecord | None:
        """The record as this node's last ``append`` to the session returned it (without summaries
        nor system prompt), once, if that was under ``FRESH_APPEND_S`` ago and no other write of this
        node touched the session since; else None. What the session list's "updated" event after a
        turn's append needs, without reading the row again (``SessionService.publish_updated_soon``)."""
        got = self._appended.pop(session_id, None)
        if got is None or time.monotonic() - got[0] > FRESH_APPEND_S:
            return None
        return got[1]

    def _touched(self, session_id: str) -> None:
        """A write other than append changed the session: what append returned is not its state (nor
        are the messages it wrote kept: a clear or purge leaves none of their text here)."""
        self._appended.pop(session_id, None)
        self._written.pop(session_id, None)
        self._prefetched.pop(session_id, None)

    async def _read(self, fn, *args: Any) -> Any:
        return await self.link.run(lambda con: fn(con, *args), write=False)

    async def _write(self, fn, *args: Any) -> Any:
        return await self.link.run(lambda con: fn(con, *args), write=True)

    # -- sessions --------------------------------------------------------------------------
    async def create(self, user_id: str, title: str | None = None, model: str | None = None) -> SessionRecord:
        checks.check_user(user_id)
        title = DEFAULT_TITLE if title is None else checks.check_title(title, self.config.max_title_chars)
        checks.check_opt_str("model", model)

        async def insert(con: asyncpg.Connection) -> asyncpg.Record:
            while True:
                dt = datetime.now(timezone.utc)
                now = dt.isoformat()
                row = await con.fetchrow(
                    f"INSERT INTO nplt_sessions (session_id, user_id, title, created_at, updated_at, model) "
                    f"VALUES ($1, $2, $3, $4, $4, $5) ON CONFLICT (session_id) DO NOTHING RETURNING {_REC}",
                    new_session_id(dt), user_id, _utf8(title, "title"), now, model)
                if row is not None:
                    return row
        return _record(await self._write(insert))

    async def get(self, session_id: str) -> SessionRecord:
        """The full record (with summaries); deleted sessions come back with ``deleted=True``."""
        validate_session_id(session_id)
        row = await self._read(lambda con: con.fetchrow(
            f"SELECT {_REC} FROM nplt_sessions WHERE session_id = $1", session_id))
        if row is None:
            raise NotFound(f"session {session_id} not found")
        return _record(row)

    async def records(self, session_ids: Iterable[str]) -> dict[str, SessionRecord]:
        """The records of those of ``session_ids`` that exist (deleted ones too, marked), in one
        statement, like ``list``'s (no summaries, no system prompt)."""
        ids = list(dict.fromkeys(sid for sid in session_ids if isinstance(sid, str)))
        if not ids:
            return {}
        rows = await self._read(lambda con: con.fetch(
            "SELECT session_id, user_id, title, created_at, updated_at, message_count, deleted, model, preview, "
            "title_auto FROM nplt_sessions WHERE session_id = ANY($1::text[])", ids))
        return {r["session_id"]: _record_lite(r) for r in rows}

    async def list(self, user_id: str, *, before: str | None = None, limit: int = 50,
                   deleted: bool = False) -> tuple[list[SessionRecord], str | None]:
        """The user's non-deleted sessions (``deleted``: the deleted ones), newest ``updated_at``
        first (records carry no summaries and, like the JSON backend's, no system prompt)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidArgument(f"limit: expected a positive integer, got {limit!r}")
        key = parse_cursor(before) if before is not None else None
        rows = await self._read(lambda con: con.fetch(
            f"SELECT {_REC} FROM nplt_sessions WHERE user_id = $1 AND deleted = $5 "
            f"AND ($2::text IS NULL OR (updated_at, session_id) < ($2::text, $3::text)) "
            f"ORDER BY updated_at DESC, session_id DESC LIMIT $4",
            user_id, key[0] if key else None, key[1] if key else None, min(limit, INT64_MAX - 1) + 1,
            bool(deleted)))
        page = [_record(r, summaries=False) for r in rows[:limit]]
        for rec in page:
            rec.system_prompt = None
        nxt = f"{page[-1].updated_at}|{page[-1].session_id}" if len(rows) > limit else None
        return page, nxt

    async def _change(self, session_id: str, sql: str, *args: Any) -> SessionRecord:
        validate_session_id(session_id)
        try:
            row = await self._write(lambda con: con.fetchrow(sql, session_id, *args))
        finally:
            self._touched(session_id)
        if row is None:
            raise NotFound(f"session {session_id} not found")
        return _record(row)

    async def rename(self, session_id: str, title: str, *, auto: bool = False) -> SessionRecord:
        """Set the title; ``auto``: made from the first message (a clear sets it back to DEFAULT_TITLE)."""
        title = checks.check_title(title, self.config.max_title_chars)
        return await self._change(session_id, f"UPDATE nplt_sessions SET title = $2, title_auto = $3 "
                                              f"WHERE session_id = $1 RETURNING {_REC}", _utf8(title, "title"), auto)

    async def set_model(self, session_id: str, model: str | None) -> SessionRecord:
        checks.check_opt_str("model", model)
        return await self._change(session_id, f"UPDATE nplt_sessions SET model = $2 WHERE session_id = $1 "
                                              f"RETURNING {_REC}", model)

    async def set_system_prompt(self, session_id: str, prompt: str | None) -> SessionRecord:
        """The session's own system prompt (None: back to the server's)."""
        checks.check_opt_str("system_prompt", prompt)
        if prompt is not None and len(prompt) > self.config.max_system_prompt_chars:
            raise InvalidArgument(f"system_prompt: longer than max_system_prompt_chars "
                                  f"({self.config.max_system_prompt_chars})")
        raw = _utf8(prompt, "system_prompt") if prompt is not None else None
        return await self._change(session_id, f"UPDATE nplt_sessions SET system_prompt = $2 WHERE session_id = $1 "
                                              f"RETURNING {_REC}", raw)

    async def add_summary(self, session_id: str, summary: SummaryRecord) -> SessionRecord:
        if not isinstance(summary, SummaryRecord):
            raise InvalidArgument("summary: expected a SummaryRecord")
        raw = orjson.dumps([summary.to_dict()])
        # Append to the JSON array: drop its closing "]" and the new array's opening "[".
        return await self._change(
            session_id,
            "UPDATE nplt_sessions SET summaries = CASE WHEN summaries = '\\x5b5d'::bytea THEN $2::bytea "
            "ELSE substring(summaries FROM 1 FOR length(summaries) - 1) || '\\x2c'::bytea "
            "|| substring($2::bytea FROM 2) END "
            f"WHERE session_id = $1 RETURNING {_REC}", raw)

    async def delete(self, session_id: str) -> SessionRecord:
        """Soft delete: hidden from list() and search() until restore() or purge()."""
        return await self._change(
            session_id, "UPDATE nplt_sessions SET deleted = true, "
            "updated_at = CASE WHEN deleted THEN updated_at ELSE $2 END "
            f"WHERE session_id = $1 RETURNING {_REC}", now_iso())

    async def restore(self, session_id: str) -> SessionRecord:
        """Undo delete() and every clear(): all stored messages become visible again."""
        validate_session_id(session_id)

        async def restore(con: asyncpg.Connection) -> asyncpg.Record | None:
            async with con.transaction():
                if await con.fetchval("SELECT 1 FROM nplt_sessions WHERE session_id = $1 FOR UPDATE",
                                      session_id) is None:
                    return None
                last = await con.fetchrow("SELECT body, (SELECT count(*) FROM nplt_messages WHERE session_id = $1) "
                                          "AS n FROM nplt_messages WHERE session_id = $1 ORDER BY id DESC LIMIT 1",
                                          session_id)
                preview = str(orjson.loads(last["body"]).get("content", ""))[:PREVIEW_CHARS] if last else ""
                preview = preview.encode()
                return await con.fetchrow(
                    "UPDATE nplt_sessions SET deleted = false, cleared_through = 0, updated_at = $2, "
                    f"message_count = $3, preview = $4 WHERE session_id = $1 RETURNING {_REC}",
                    session_id, now_iso(), last["n"] if last else 0, preview)
        try:
            row = await self._write(restore)
        finally:
            self._touched(session_id)
        if row is None:
            raise NotFound(f"session {session_id} not found")
        return _record(row)

    async def undelete(self, session_id: str) -> SessionRecord:
        """Undo delete() only (out of the trash); cleared messages stay hidden."""
        return await self._change(
            session_id, "UPDATE nplt_sessions SET deleted = false, "
            "updated_at = CASE WHEN deleted THEN $2 ELSE updated_at END "
            f"WHERE session_id = $1 RETURNING {_REC}", now_iso())

    async def purge(self, session_id: str) -> None:
        """Remove the session and its messages (irreversible)."""
        validate_session_id(session_id)
        try:
            done = await self._write(lambda con: con.fetchval(
                "DELETE FROM nplt_sessions WHERE session_id = $1 RETURNING 1", session_id))
        finally:
            self._touched(session_id)
        if done is None:
            raise NotFound(f"session {session_id} not found")

    async def clear(self, session_id: str, *, purge: bool = False) -> int:
        """Hide every current message and drop the summaries; returns how many messages were hidden.
        restore() brings hidden messages back, unless ``purge``: then every hidden message (of this
        clear and earlier ones) is deleted."""
        validate_session_id(session_id)

        async def clear(con: asyncpg.Connection) -> int | None:
            async with con.transaction():
                row = await con.fetchrow("SELECT message_count, next_id FROM nplt_sessions WHERE session_id = $1 "
                                         "FOR UPDATE", session_id)
                if row is None:
                    return None
                if row["message_count"]:
                    await con.execute("UPDATE nplt_sessions SET cleared_through = next_id - 1, message_count = 0, "
                                      "preview = ''::bytea, updated_at = $2 WHERE session_id = $1", session_id, now_iso())
                await con.execute("UPDATE nplt_sessions SET summaries = '\\x5b5d'::bytea WHERE session_id = $1 "
                                  "AND summaries <> '\\x5b5d'::bytea", session_id)
                await con.execute("UPDATE nplt_sessions SET title = $2, title_auto = false WHERE session_id = $1 "
                                  "AND title_auto", session_id, DEFAULT_TITLE.encode())
                if purge:
                    await con.execute("DELETE FROM nplt_messages m USING nplt_sessions s WHERE m.session_id = $1 "
                                      "AND s.session_id = $1 AND m.id <= s.cleared_through", session_id)
                return row["message_count"]
        try:
            n = await self._write(clear)
        finally:
            self._touched(session_id)
        if n is None:
            raise NotFound(f"session {session_id} not found")
        return n

    # -- messages --------------------------------------------------------------------------
    def _encode(self, msg: ChatMessage) -> tuple[bytes, str]:
        """(body without the id, search text); checks the size like the JSON backend."""
        d = msg.to_dict()
        try:
            size = len(orjson.dumps(d))
        except TypeError as exc:
            raise InvalidArgument(f"message is not JSON-serializable: {exc}") from None
        if size > self.config.max_message_bytes:
            raise MessageTooLarge(f"message is {size} bytes encoded, over max_message_bytes "
                                  f"({self.config.max_message_bytes})")
        del d["id"]
        return orjson.dumps(d), search_text(msg.content)

    async def append(self, session_id: str, role: str, content: str, *, tool_calls: Iterable[ToolCall | dict] = (),
                     metadata: dict[str, Any] | None = None, timestamp: str | None = None,
                     read_after: int | None = None, fence: int | None = None) -> ChatMessage:
        """Store one message with the next id; returns once it is committed.

        ``fence`` (a turn's answer: the id of the user message it answers): the message is stored
        only if the session is still as that turn left it, checked in the same statement: not
        deleted, not cleared, and no message stored after ``fence`` but superseded ones (a
        regenerate's). Otherwise ``appends.SessionMoved`` (STORAGE_UNAVAILABLE), nothing stored: another
        node took the session over (``appends`` module doc).

        ``read_after``: the same statement also reads what ``record_and_messages(session_id,
        read_after)`` would return right after it (the memory layer's read at the start of a turn,
        ``MemoryManager.read_hint``), and the next such call, under ``FRESH_APPEND_S`` later with no
        other write of this node to the session in between, is answered from it without a round trip."""
        calls = checks.tool_calls(tool_calls)
        checks.check_message(role, content, metadata, timestamp)
        validate_session_id(session_id)
        if read_after is not None:
            checks.check_int("read_after", read_after)
        if fence is not None:
            checks.check_int("fence", fence)
        msg = ChatMessage(0, role, content, timestamp or now_iso(), calls, dict(metadata or {}))
        body, text = self._encode(msg)
        rows = await self.appends.append(session_id, now_iso(), content[:PREVIEW_CHARS].encode(), body, text,
                                         None if read_after is None else _bigint(read_after),
                                         None if fence is None else _bigint(fence))
        row = rows[0] if rows else None
        if row is None:
            raise NotFound(f"session {session_id} not found")
        now = time.monotonic()
        _keep(self._appended, session_id, (now, _record_lite(row)))
        out = _message(row["mid"], body)
        written = self._written.pop(session_id, None) or {}
        written[out.id] = (body, out)
        if len(written) > WRITTEN_KEPT:
            del written[next(iter(written))]
        _keep(self._written, session_id, written)
        if read_after is None:
            self._prefetched.pop(session_id, None)      # what an earlier append read is older than this
        else:
            read = _rows(rows)
            if out.id > max(row["cleared_through"], read_after):
                read.append((out.id, body))
            _keep(self._prefetched, session_id, (now, read_after, row, read))
        return out

    async def update(self, session_id: str, message: ChatMessage) -> ChatMessage:
        """Replace the stored message with the same id (e.g. finalize a streamed answer)."""
        if not isinstance(message, ChatMessage):
            raise InvalidArgument("message: expected a ChatMessage")
        msg = ChatMessage(message.id, message.role, message.content, message.timestamp,
                          checks.tool_calls(message.tool_calls), message.metadata)
        checks.check_message(msg.role, msg.content, msg.metadata, msg.timestamp)
        validate_session_id(session_id)
        mid = msg.id
        if isinstance(mid, bool) or not isinstance(mid, int) or not 0 < mid <= INT64_MAX:
            raise NotFound(f"message {message.id!r} not found in session {session_id}")
        body, text = self._encode(msg)
        try:
            done = await self._write(lambda con: con.fetchval(
                "WITH m AS (UPDATE nplt_messages SET body = $3, search_text = $4 "
                "WHERE session_id = $1 AND id = $2 RETURNING id) "
                "UPDATE nplt_sessions s SET updated_at = $5, preview = CASE WHEN $2 > s.cleared_through AND $2 = "
                "(SELECT max(id) FROM nplt_messages WHERE session_id = $1) THEN $6 ELSE s.preview END "
                "FROM m WHERE s.session_id = $1 RETURNING m.id",
                session_id, mid, body, text, now_iso(), msg.content[:PREVIEW_CHARS].encode()))
        finally:
            self._touched(session_id)
        if done is None:
            raise NotFound(f"message {message.id!r} not found in session {session_id}")
        return _message(mid, body)

    async def page(self, session_id: str, before: int | None = None, limit: int = 50) -> Page:
        """The newest ``limit`` visible messages with id < before (ascending)."""
        if before is not None and (isinstance(before, bool) or not isinstance(before, int) or before < 1):
            raise InvalidArgument(f"before: expected a positive integer or None, got {before!r}")
        checks.check_positive("limit", limit)
        validate_session_id(session_id)
        rows = await self._read(lambda con: con.fetch(
            "SELECT s.message_count, m.id, m.body FROM nplt_sessions s LEFT JOIN LATERAL "
            "(SELECT id, body FROM nplt_messages WHERE session_id = s.session_id AND id > s.cleared_through "
            "AND ($2::bigint IS NULL OR id < $2) ORDER BY id DESC LIMIT $3) m ON true WHERE s.session_id = $1",
            session_id, min(before, INT64_MAX) if before is not None else None, min(limit, INT64_MAX - 1) + 1))
        if not rows:
            raise NotFound(f"session {session_id} not found")
        found = [r for r in rows if r["id"] is not None]
        has_more = len(found) > limit
        msgs = [_message(r["id"], r["body"]) for r in reversed(found[:limit])]
        return Page(msgs, has_more, msgs[0].id if has_more else None, rows[0]["message_count"])

    async def page_encoded(self, session_id: str, before: int | None = None, limit: int = 50) -> EncodedPage:
        """``page`` with each message as its JSON bytes (no cache here: encoded per call)."""
        return encode_page(await self.page(session_id, before, limit))

    async def messages(self, session_id: str, *, after_id: int = 0) -> list[ChatMessage]:
        """Visible messages with id > after_id, ascending."""
        checks.check_int("after_id", after_id)
        validate_session_id(session_id)
        after_id = _bigint(after_id)
        rows = await self._read(lambda con: con.fetch(
            "SELECT m.id, m.body FROM nplt_sessions s LEFT JOIN LATERAL "
            "(SELECT id, body FROM nplt_messages WHERE session_id = s.session_id "
            "AND id > greatest(s.cleared_through, $2) ORDER BY id) m ON true WHERE s.session_id = $1",
            session_id, after_id))
        if not rows:
            raise NotFound(f"session {session_id} not found")
        return [message_of(*r) for r in _rows(rows)]

    async def record_and_messages(self, session_id: str, after_id: int, memo: dict | None = None
                                  ) -> tuple[SessionRecord, list[ChatMessage]]:
        """``get`` and ``messages(after_id=after_id)`` in one round trip (what the memory layer reads
        at every turn). ``memo`` (a dict the caller keeps between reads of one session, as for
        ``HistoryStore.read_loaded``): a message whose stored body is byte for byte the one of the
        caller's last read comes back as the same ``ChatMessage`` object, not decoded again."""
        checks.check_int("after_id", after_id)
        validate_session_id(session_id)
        got = self._prefetched.pop(session_id, None)
        if got is not None and got[1] == after_id and time.monotonic() - got[0] <= FRESH_APPEND_S:
            _, _, row, read = got            # (what the append with read_after read)
        else:
            after_id = _bigint(after_id)
            rows = await self._read(lambda con: con.fetch(
                f"SELECT {_REC_S}, m.id, m.body FROM nplt_sessions s LEFT JOIN LATERAL "
                "(SELECT id, body FROM nplt_messages WHERE session_id = s.session_id "
                "AND id > greatest(s.cleared_through, $2) ORDER BY id) m ON true WHERE s.session_id = $1",
                session_id, after_id))
            if not rows:
                raise NotFound(f"session {session_id} not found")
            row, read = rows[0], _rows(rows)
        if memo is None:
            return _record(row), [message_of(*r) for r in read]
        return _record(row), _decoded(read, memo, self._written.get(session_id))

    async def search(self, user_id: str, query: str, *, session_id: str | None = None,
                     limit: int = 20) -> list[SearchHit]:
        """Best ``limit`` matches among visible messages of the user's non-deleted sessions, best
        score first, newest first among ties (the JSON backend's scoring, storage/search.py)."""
        q = compile_query(query)
        checks.check_positive("limit", limit)
        if session_id is not None:
            validate_session_id(session_id)
            owner = await self._read(lambda con: con.fetchval(
                "SELECT user_id FROM nplt_sessions WHERE session_id = $1 AND NOT deleted", session_id))
            if owner != user_id:
                raise NotFound(f"session {session_id} not found")
        sql, args = candidates_sql(q, user_id, session_id)
        rows = await self._read(lambda con: con.fetch(sql, *args))
        scored = []
        for n, r in enumerate(rows):
            d = orjson.loads(r["body"])
            hit = q.match(d.get("content")) if searchable(d) else None
            if hit is not None:
                scored.append(((hit[0], str(d.get("timestamp", "")), r["id"]), n, r, d, hit[1]))
        scored.sort(key=lambda t: (t[0], t[1]), reverse=True)
        return [SearchHit(r["session_id"], r["title"].decode(), r["id"], str(d.get("role", "")),
                          snippet(d.get("content", ""), pos), str(d.get("timestamp", "")), key[0])
                for key, _, r, d, pos in scored[:limit]]

    async def export(self, session_id: str, fmt: str, model: str | None = None, *,
                     max_bytes: int | None = None) -> str:
        """The session's visible messages as ``"json"`` or ``"markdown"`` (``model``: the model the
        header names instead of the stored one; ``max_bytes``: ExportTooLarge as soon as the part
        built is over it, see ``storage.export.export``). One round trip, one snapshot (the query of
        ``record_and_messages``); the bodies are decoded one by one while the export is built, in a
        worker thread (not on the event loop), so one refused for its size decodes only those before."""
        if fmt not in FORMATS:
            raise InvalidArgument(f"export format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
        validate_session_id(session_id)
        rows = await self._read(lambda con: con.fetch(
            f"SELECT {_REC_S}, m.id, m.body FROM nplt_sessions s LEFT JOIN LATERAL "
            "(SELECT id, body FROM nplt_messages WHERE session_id = s.session_id "
            "AND id > s.cleared_through ORDER BY id) m ON true WHERE s.session_id = $1", session_id))
        if not rows:
            raise NotFound(f"session {session_id} not found")
        record, read = _record(rows[0]), _rows(rows)
        rows.clear()
        try:
            return await asyncio.to_thread(export, record, (message_of(*r) for r in read), fmt, model,
                                           max_bytes=max_bytes, total=len(read))
        except ExportTooLarge:
            read.clear()       # (the error's traceback holds this frame: not the whole session with it)
            raise
