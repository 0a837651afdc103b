"""HistoryStore: the synchronous, thread-safe conversation store the server uses.

Every method may do file I/O (load a session, fsync a journal); call them from a thread, or use
AsyncHistoryStore. See docs/storage.md for the on-disk format and the guarantees.
"""
from __future__ import annotations

import heapq
import os
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

import orjson

from .errors import InvalidArgument, MessageTooLarge, NotFound, StorageClosed
from .export import FORMATS, export_json, export_markdown
from .fsio import atomic_write, fsync_dir
from .ids import new_session_id, validate_session_id
from .journal import JournalWriter
from .models import ROLES, ChatMessage, Page, SearchHit, SessionRecord, SummaryRecord, ToolCall, now_iso
from .search import compile_query, snippet
from .textscan import SEP, session_text
from .session import READY, LoadedSession, SessionState, encode_snapshot, file_stat, to_message
from .store_core import StoreCore

DEFAULT_TITLE = "New chat"
MAX_USER_ID_CHARS = 256


class HistoryStore(StoreCore):
    """Sessions as JSON snapshot + journal files under ``config.root``."""

    # -- sessions --------------------------------------------------------------------------
    def create(self, user_id: str, title: str | None = None, model: str | None = None) -> SessionRecord:
        self._check_open()
        _check_user(user_id)
        title = DEFAULT_TITLE if title is None else self._check_title(title)
        _check_opt_str("model", model)
        dt = datetime.now(timezone.utc)
        sid = new_session_id(dt)
        while self.index.get(sid) is not None or os.path.exists(self._paths(sid)[0]):
            sid = new_session_id(dt)
        now = dt.isoformat()
        state = SessionState(SessionRecord(sid, user_id, title, now, now, 0, False, model), [])
        sess = LoadedSession(sid, *self._paths(sid))
        atomic_write(sess.snap_path, encode_snapshot(state.head(), []))
        sess.state, sess.writer, sess.snap_stat = state, JournalWriter(sess.journal_path, 0), file_stat(sess.snap_path)
        sess.status, sess.last_used = READY, time.monotonic()
        with self._cache_lock:
            if self._closed:
                raise StorageClosed("the history store is closed")
            self._cache[sid] = sess
        self.index.put(state.record, sess.files())
        self._trim()
        return self._copy(state.record)

    def get(self, session_id: str) -> SessionRecord:
        """The full record (with summaries); deleted sessions are returned with ``deleted=True``."""
        with self._locked(session_id) as s:
            return self._copy(s.state.record)

    def list(self, user_id: str, *, before: str | None = None, limit: int = 50) -> tuple[list[SessionRecord], str | None]:
        """The user's non-deleted sessions, newest ``updated_at`` first, from the index only
        (records carry no summaries). Returns (records, next cursor or None)."""
        return self.index.list(user_id, before, limit)

    def rename(self, session_id: str, title: str) -> SessionRecord:
        title = self._check_title(title)
        return self._simple(session_id, "rename", {"title": title})

    def set_model(self, session_id: str, model: str | None) -> SessionRecord:
        _check_opt_str("model", model)
        return self._simple(session_id, "model", {"model": model})

    def delete(self, session_id: str) -> SessionRecord:
        """Soft delete: hidden from list() and search(), files kept until purge()."""
        with self._locked(session_id) as s:
            if not s.state.record.deleted:
                self._commit(s, "delete", {}, at=now_iso())
            return self._copy(s.state.record)

    def restore(self, session_id: str) -> SessionRecord:
        """Undo delete() and every clear(): all stored messages become visible again."""
        return self._simple(session_id, "restore", {})

    def purge(self, session_id: str) -> None:
        """Physically remove the session's files (irreversible)."""
        with self._locked(session_id) as s:
            self._close_session(s)
            os.unlink(s.snap_path)
            try:
                os.unlink(s.journal_path)
            except FileNotFoundError:
                pass
            fsync_dir(self.root)
            self.index.remove(session_id)

    def clear(self, session_id: str) -> int:
        """Hide every current message (recoverable with restore() until purge); returns how many."""
        with self._locked(session_id) as s:
            st = s.state
            n = st.record.message_count
            if n:
                self._commit(s, "clear", {"through": st.msgs[-1]["id"]}, at=now_iso())
            return n

    def add_summary(self, session_id: str, summary: SummaryRecord) -> SessionRecord:
        if not isinstance(summary, SummaryRecord):
            raise InvalidArgument("summary: expected a SummaryRecord")
        return self._simple(session_id, "summary", {"summary": summary.to_dict()})

    def _simple(self, session_id: str, op: str, fields: dict[str, Any]) -> SessionRecord:
        with self._locked(session_id) as s:
            self._commit(s, op, fields, at=now_iso())
            return self._copy(s.state.record)

    # -- messages --------------------------------------------------------------------------
    def append(self, session_id: str, role: str, content: str, *, tool_calls: Iterable[ToolCall | dict] = (),
               metadata: dict[str, Any] | None = None, timestamp: str | None = None) -> ChatMessage:
        """Store one message with the next id; returns once it is durable (fsync mode)."""
        calls = _tool_calls(tool_calls)
        _check_message(role, content, metadata, timestamp)
        with self._locked(session_id) as s:
            msg = ChatMessage(s.state.next_id, role, content, timestamp or now_iso(), calls, dict(metadata or {}))
            raw = self._encode(msg)
            self._commit(s, "append", {"msg": orjson.loads(raw)}, raw_msg=raw, at=now_iso())
            return to_message(s.state.msgs[-1])

    def update(self, session_id: str, message: ChatMessage) -> ChatMessage:
        """Replace the stored message with the same id (e.g. finalize a streamed answer)."""
        if not isinstance(message, ChatMessage):
            raise InvalidArgument("message: expected a ChatMessage")
        msg = ChatMessage(message.id, message.role, message.content, message.timestamp,
                          _tool_calls(message.tool_calls), message.metadata)
        _check_message(msg.role, msg.content, msg.metadata, msg.timestamp)
        with self._locked(session_id) as s:
            if isinstance(msg.id, bool) or not isinstance(msg.id, int) or s.state.position(msg.id) is None:
                raise NotFound(f"message {message.id!r} not found in session {session_id}")
            raw = self._encode(msg)
            self._commit(s, "update", {"msg": orjson.loads(raw)}, raw_msg=raw, at=now_iso())
            return to_message(s.state.msgs[s.state.position(msg.id)])

    def page(self, session_id: str, before: int | None = None, limit: int = 50) -> Page:
        """The newest ``limit`` visible messages with id < before (ascending). O(limit)."""
        if before is not None and (isinstance(before, bool) or not isinstance(before, int) or before < 1):
            raise InvalidArgument(f"before: expected a positive integer or None, got {before!r}")
        _check_positive("limit", limit)
        with self._locked(session_id) as s:
            st = s.state
            start, end, vis = st.visible_range(before, limit)
            msgs = [to_message(d) for d in st.msgs[start:end]]
            has_more = start > vis
            return Page(msgs, has_more, msgs[0].id if has_more else None, len(st.msgs) - vis)

    def messages(self, session_id: str, *, after_id: int = 0) -> list[ChatMessage]:
        """Visible messages with id > after_id, ascending."""
        if isinstance(after_id, bool) or not isinstance(after_id, int):
            raise InvalidArgument(f"after_id: expected an integer, got {after_id!r}")
        with self._locked(session_id) as s:
            return [to_message(d) for d in s.state.after(after_id)]

    def search(self, user_id: str, query: str, *, session_id: str | None = None, limit: int = 20) -> list[SearchHit]:
        """Best ``limit`` matches among visible messages of the user's non-deleted sessions, best
        score first, newest first among ties. Sessions not loaded are read and dropped again."""
        q = compile_query(query)
        _check_positive("limit", limit)
        if session_id is not None:
            entry = self.index.get(validate_session_id(session_id))
            if entry is None or entry["user_id"] != user_id or entry["deleted"]:
                raise NotFound(f"session {session_id} not found")
            targets = [entry]
        else:
            targets = self.index.user_entries(user_id)
        heap: list[tuple] = []
        n = 0
        for entry in targets:
            if not entry["message_count"]:
                continue
            sid = entry["session_id"]
            try:
                with self._locked(sid, transient=True) as s:
                    title, st = s.state.record.title, s.state
                    if SEP in q.text:             # (a NUL in the query: message by message)
                        found = [(i, *hit) for i, d in enumerate(st.msgs[st.vis_start():], st.vis_start())
                                 if (hit := q.match(d.get("content"))) is not None]
                    else:
                        st.text = session_text(st.text, st.last_seq, st.vis_start(), st.msgs)
                        found = st.text.scan(q)
                    for i, score, pos in found:
                        d = st.msgs[i]
                        n += 1
                        item = ((score, str(d.get("timestamp", "")), d["id"]), n, sid, title, d, pos)
                        if len(heap) < limit:
                            heapq.heappush(heap, item)
                        elif item[0] > heap[0][0]:
                            heapq.heapreplace(heap, item)
            except NotFound:
                continue
        heap.sort(reverse=True)
        return [SearchHit(sid, title, d["id"], str(d.get("role", "")), snippet(d.get("content", ""), pos),
                          str(d.get("timestamp", "")), key[0]) for key, _, sid, title, d, pos in heap]

    def export(self, session_id: str, fmt: str) -> str:
        """The session's visible messages as ``"json"`` or ``"markdown"``."""
        if fmt not in FORMATS:
            raise InvalidArgument(f"export format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
        with self._locked(session_id) as s:
            record = self._copy(s.state.record)
            msgs = [to_message(d) for d in s.state.after(0)]
        return export_json(record, msgs) if fmt == "json" else export_markdown(record, msgs)

    # -- validation ------------------------------------------------------------------------
    def _encode(self, msg: ChatMessage) -> bytes:
        try:
            raw = orjson.dumps(msg.to_dict())
        except TypeError as exc:
            raise InvalidArgument(f"message is not JSON-serializable: {exc}") from None
        if len(raw) > self.config.max_message_bytes:
            raise MessageTooLarge(f"message is {len(raw)} bytes encoded, over max_message_bytes "
                                  f"({self.config.max_message_bytes})")
        return raw

    def _check_title(self, title: object) -> str:
        if not isinstance(title, str) or not title.strip():
            raise InvalidArgument("title: expected a non-empty string")
        if len(title) > self.config.max_title_chars:
            raise InvalidArgument(f"title: longer than max_title_chars ({self.config.max_title_chars})")
        return title.strip()


def _check_user(user_id: object) -> None:
    if not isinstance(user_id, str) or not user_id or len(user_id) > MAX_USER_ID_CHARS:
        raise InvalidArgument(f"user_id: expected a string of 1..{MAX_USER_ID_CHARS} characters")


def _check_opt_str(name: str, v: object) -> None:
    if v is not None and not isinstance(v, str):
        raise InvalidArgument(f"{name}: expected a string or None, got {type(v).__name__}")


def _check_positive(name: str, v: object) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InvalidArgument(f"{name}: expected a positive integer, got {v!r}")


def _check_message(role: object, content: object, metadata: object, timestamp: object) -> None:
    if role not in ROLES:
        raise InvalidArgument(f"role: expected one of {', '.join(ROLES)}, got {role!r}")
    if not isinstance(content, str):
        raise InvalidArgument(f"content: expected a string, got {type(content).__name__}")
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidArgument(f"metadata: expected a dict, got {type(metadata).__name__}")
    _check_opt_str("timestamp", timestamp)


def _tool_calls(calls: Iterable[ToolCall | dict]) -> list[ToolCall]:
    out = []
    for c in calls:
        if isinstance(c, ToolCall):
            out.append(c)
        elif isinstance(c, dict):
            try:
                out.append(ToolCall.from_dict(c))
            except (KeyError, TypeError, ValueError) as exc:
                raise InvalidArgument(f"tool_calls: bad tool call {exc!r}") from None
        else:
            raise InvalidArgument(f"tool_calls: expected ToolCall objects, got {type(c).__name__}")
    return out
