"""HistoryStore: the synchronous, thread-safe conversation store the server uses.

Every method may do file I/O (load a session, fsync a journal); call them from a thread, or use
AsyncHistoryStore. See docs/storage.md for the on-disk format and the guarantees.

The store is assembled from parts with one job each: ``SessionIndex`` (listings), ``SessionLoader``
(files -> memory), ``SessionCache`` (LRU and per-session locks), ``JournalFlusher`` (group commit),
``Compactor`` (journal -> snapshot), ``Searcher`` and ``Maintenance`` (index writes, idle eviction).
This class validates arguments, journals each change through ``_commit`` and waits for durability.
"""
from __future__ import annotations

import fcntl
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from concurrent.futures import Future
from datetime import datetime, timezone
from typing import Any, TypeVar

import orjson

from .cache import SessionCache
from .compaction import Compactor
from .config import StorageConfig
from .errors import InvalidArgument, MessageTooLarge, NotFound, StorageIOError, StorageLocked
from .export import FORMATS, export
from .flusher import JournalFlusher, NewFile
from .fsio import DIR_MODE, FILE_MODE, add_reliever, fsync_dir, open_regular, os_open, remove_reliever, write_file
from .ids import new_session_id
from .index import INDEX_NAME, SessionIndex
from .journal import JournalWriter
from .loader import SessionLoader
from .maintenance import Maintenance
from .models import (DEFAULT_TITLE, ChatMessage, EncodedPage, Page, SearchHit, SessionRecord, SummaryRecord, ToolCall,
                     now_iso)
from .recovery import recover
from .searcher import Searcher
from .session import READY, LoadedSession, SessionState, encode_snapshot, file_stat, to_message
from .validation import check_message, check_opt_str, check_positive, check_title, check_user
from .validation import tool_calls as tool_calls_of
from .wal_replay import replay_wal

log = logging.getLogger("storage")

LOCK_NAME = ".lock"

T = TypeVar("T")


class HistoryStore:
    """Sessions as JSON snapshot + journal files under ``config.root``."""

    def __init__(self, config: StorageConfig) -> None:
        self.config = config
        self.root = os.path.abspath(config.root)
        warn_if_shared(self.root)
        os.makedirs(self.root, mode=DIR_MODE, exist_ok=True)
        self._lock_fd = _lock_root(self.root)
        self.index = SessionIndex(os.path.join(self.root, INDEX_NAME))
        self.loader = SessionLoader(self.root, self.index)
        try:
            self.wal_replay = replay_wal(self.root, self.loader.paths)
            self.recovery_stats = recover(self.root, self.index, self.loader.reload_entry)
            self.index.save()
        except BaseException:
            os.close(self._lock_fd)
            raise
        batched = config.durability == "batched"
        self.flusher = JournalFlusher(batched=batched, batch_s=config.batch_ms / 1000,
                                      threads=config.fsync_threads,
                                      on_failure=self._invalidate, root=self.root,
                                      checkpoint_bytes=config.wal_checkpoint_mib << 20,
                                      checkpoint_s=config.wal_checkpoint_s)
        self.cache = SessionCache(size=config.lru_size, max_bytes=config.lru_mib << 20, idle_s=config.idle_evict_s,
                                  exists=lambda sid: self.index.get(sid) is not None,
                                  new=lambda sid: LoadedSession(sid, *self.loader.paths(sid)),
                                  load=self.loader.fill)
        add_reliever(self.cache.close_idle_journals)     # (out of descriptors: idle journals are closed)
        self.compactor = Compactor(self.root, self.index, config.compact_threshold, after=self.cache.trim)
        self.searcher = Searcher(self.index, self.cache)
        self.maintenance = Maintenance(tick_s=0.25, index_s=config.index_flush_ms / 1000,
                                       save_index=self.index.save, evict=self._evict_step)

    # -- sessions --------------------------------------------------------------------------
    def create(self, user_id: str, title: str | None = None, model: str | None = None) -> SessionRecord:
        """A new empty session; returns once its files are durable."""
        record, done = self.create_pending(user_id, title, model)
        _durable(done)
        return record

    def create_pending(self, user_id: str, title: str | None = None,
                       model: str | None = None) -> tuple[SessionRecord, Future[None]]:
        """``create`` without the wait: the record and a future resolved once the session's files
        are durable and it is visible (``get``, ``list``). The snapshot is written here; the flusher
        fsyncs it, renames it in and fsyncs the directory once for every create of its round."""
        self.cache.check_open()
        check_user(user_id)
        title = DEFAULT_TITLE if title is None else self._check_title(title)
        check_opt_str("model", model)
        dt = datetime.now(timezone.utc)
        now = dt.isoformat()
        with _io_errors("could not create a session"):
            while True:
                sid = new_session_id(dt)
                sess = LoadedSession(sid, *self.loader.paths(sid))
                if self.index.get(sid) is not None or os.path.exists(sess.snap_path):
                    continue
                try:
                    # The empty journal is created first, so the directory fsync of the snapshot's
                    # rename covers both entries and the first append needs no directory fsync.
                    os.close(os_open(sess.journal_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE))
                except FileExistsError:
                    continue                 # another create picked the same id a moment ago
                break
            state = SessionState(SessionRecord(sid, user_id, title, now, now, 0, False, model), [])
            tmp = sess.snap_path + ".tmp"
            try:
                write_file(tmp, encode_snapshot(state.head(), []))
            except BaseException:
                for path in (tmp, sess.journal_path):
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
                raise

        def visible() -> None:            # flusher thread, once the files are durable
            sess.state, sess.writer = state, JournalWriter(sess.journal_path, 0)
            sess.snap_stat = file_stat(sess.snap_path)
            sess.status, sess.last_used = READY, time.monotonic()
            self.cache.add(sess)
            self.index.put(state.record, sess.files())

        done = self.flusher.request_file(NewFile(tmp, sess.snap_path, (sess.journal_path,), visible))
        return _copy(state.record), done

    def get(self, session_id: str) -> SessionRecord:
        """The full record (with summaries); deleted sessions are returned with ``deleted=True``."""
        with self.cache.locked(session_id) as s:
            return _copy(s.state.record)

    @contextmanager
    def _try_locked(self, session_id: str) -> Iterator[LoadedSession | None]:
        """The session with its lock held if it is loaded, ready and its lock free right now, else
        None: never waits, never does I/O, so safe on the event loop (microseconds)."""
        sess = self.cache.get(session_id) if not self.cache.closed else None
        if sess is None or not sess.lock.acquire(blocking=False):
            yield None
            return
        try:
            yield sess if sess.status == READY else None
        finally:
            sess.lock.release()

    def _if_loaded(self, session_id: str, read: Callable[[SessionState], T]) -> T | None:
        """``read(state)`` if the session is loaded, ready and its lock free right now, else None."""
        with self._try_locked(session_id) as sess:
            if sess is None:
                return None
            sess.last_used = time.monotonic()
            return read(sess.state)

    def get_loaded(self, session_id: str) -> SessionRecord | None:
        """``get`` without waiting and without I/O: the record if the session is loaded and its lock
        is free right now, else None (then call ``get``). Safe on the event loop (microseconds)."""
        return self._if_loaded(session_id, _copy_state_record)

    def read_loaded(self, session_id: str, after_id: int | None, max_messages: int,
                    memo: dict[int, tuple[dict, ChatMessage]] | None = None
                    ) -> tuple[SessionRecord, list[ChatMessage]] | None:
        """``get`` and ``messages`` in one, without waiting and without I/O (as ``get_loaded``): the
        record and the visible messages with id > ``after_id`` (None: those its newest summary does
        not cover), or None if the session is not loaded, its lock is busy or more than
        ``max_messages`` would be returned (then read through a thread). Safe on the event loop.

        ``memo`` (a dict the caller keeps between reads of one session, initially empty): a message
        stored unchanged since the caller's last read comes back as the same ``ChatMessage`` object,
        not converted again (an update stores a new message, so it is converted). The caller must
        not change the messages it gets that way; the memo keeps only the last read's messages."""
        with self._try_locked(session_id) as sess:
            if sess is None:
                return None
            st = sess.state
            if after_id is None:
                summary = st.record.summary
                after_id = summary.covers_to_id if summary is not None else 0
            start = st.after_pos(after_id)
            if len(st.msgs) - start > max_messages:
                return None
            sess.last_used = time.monotonic()
            if memo is None:
                return _copy(st.record), [to_message(d) for d in st.msgs[start:]]
            return _copy(st.record), _converted(st.msgs[start:], memo)

    def records(self, session_ids: Iterable[str]) -> dict[str, SessionRecord]:
        """The records of those of ``session_ids`` that exist (deleted ones too, marked), from the index
        only, like ``list``'s (no summaries, no system prompt). No file I/O: safe on the event loop."""
        found = ((sid, self.index.get(sid)) for sid in session_ids if isinstance(sid, str))
        return {sid: SessionRecord.from_dict(e) for sid, e in found if e is not None}

    def list(self, user_id: str, *, before: str | None = None, limit: int = 50,
             deleted: bool = False) -> tuple[list[SessionRecord], str | None]:
        """The user's non-deleted sessions (``deleted``: the deleted ones instead, the trash), newest
        ``updated_at`` first, from the index only (records carry no summaries and no system prompt).
        Returns (records, next cursor or None)."""
        return self.index.list(user_id, before, limit, deleted=deleted)

    def rename(self, session_id: str, title: str, *, auto: bool = False) -> SessionRecord:
        """Set the title; ``auto``: made from the first message (a clear sets it back to DEFAULT_TITLE)."""
        title = self._check_title(title)
        return self._simple(session_id, "rename", {"title": title, "auto": True} if auto else {"title": title})

    def set_model(self, session_id: str, model: str | None) -> SessionRecord:
        check_opt_str("model", model)
        return self._simple(session_id, "model", {"model": model})

    def set_system_prompt(self, session_id: str, prompt: str | None) -> SessionRecord:
        """The session's own system prompt (None: back to the server's)."""
        check_opt_str("system_prompt", prompt)
        if prompt is not None and len(prompt) > self.config.max_system_prompt_chars:
            raise InvalidArgument(f"system_prompt: longer than max_system_prompt_chars "
                                  f"({self.config.max_system_prompt_chars})")
        return self._simple(session_id, "prompt", {"system_prompt": prompt})

    def delete(self, session_id: str) -> SessionRecord:
        """Soft delete: hidden from list() and search(), files kept until purge()."""
        with self.cache.locked(session_id) as s:
            done = None if s.state.record.deleted else self._commit(s, "delete", {}, at=now_iso())
            record = _copy(s.state.record)
        _durable(done)
        return record

    def restore(self, session_id: str) -> SessionRecord:
        """Undo delete() and every clear(): all stored messages become visible again."""
        return self._simple(session_id, "restore", {})

    def undelete(self, session_id: str) -> SessionRecord:
        """Undo delete() only (out of the trash); cleared messages stay hidden."""
        with self.cache.locked(session_id) as s:
            done = self._commit(s, "undelete", {}, at=now_iso()) if s.state.record.deleted else None
            record = _copy(s.state.record)
        _durable(done)
        return record

    def purge(self, session_id: str) -> None:
        """Physically remove the session's files (irreversible); index.json is rewritten at once,
        so no title or preview of the session stays on disk."""
        with self.cache.locked(session_id) as s:
            with _io_errors(f"could not purge session {session_id}"):
                self.cache.close_session(s)
                os.unlink(s.snap_path)
                try:
                    os.unlink(s.journal_path)
                except FileNotFoundError:
                    pass
                fsync_dir(self.root)
            self.index.remove(session_id)
            self.compactor.forget(session_id)
        with _io_errors("could not write the session index"):
            self.index.save()
        self.flusher.checkpoint()         # the session's lines leave the shared WAL too

    def clear(self, session_id: str, *, purge: bool = False) -> int:
        """Hide every current message and drop the session's summaries; returns how many messages
        were hidden. Hidden messages come back with restore(), unless ``purge``: then every hidden
        message (of this clear and earlier ones) is removed from the files (snapshot rewritten,
        journal emptied, and index.json rewritten at once, as ``purge`` does, so neither an old
        title nor preview stays in it) before this returns."""
        with self.cache.locked(session_id) as s:
            st = s.state
            n = st.record.message_count
            hidden = st.vis_start() > 0
            done, changed = None, bool(n or st.record.summaries or (purge and hidden) or st.record.title_auto)
            if changed:
                through = st.msgs[-1]["id"] if n else st.cleared
                done = self._commit(s, "clear", {"through": through, "purge": purge}, at=now_iso())
        _durable(done)
        if purge and changed:
            self._rewrite(session_id)
            with _io_errors("could not write the session index"):
                self.index.save()         # (not at the next index_flush_ms: the old preview is in it)
            self.flusher.checkpoint()     # the purged lines leave the shared WAL too
        return n

    def _rewrite(self, session_id: str) -> None:
        """Fold the journal into a new snapshot now (after a background compaction in flight, which
        may have captured the state from before the change)."""
        while True:
            self.compactor.barrier()
            with self.cache.locked(session_id) as s:
                if s.compacting:
                    continue
                with _io_errors(f"could not rewrite session {session_id}"):
                    self.compactor.compact_locked(s)
                return

    def add_summary(self, session_id: str, summary: SummaryRecord) -> SessionRecord:
        if not isinstance(summary, SummaryRecord):
            raise InvalidArgument("summary: expected a SummaryRecord")
        return self._simple(session_id, "summary", {"summary": summary.to_dict()})

    def _simple(self, session_id: str, op: str, fields: dict[str, Any]) -> SessionRecord:
        with self.cache.locked(session_id) as s:
            done = self._commit(s, op, fields, at=now_iso())
            record = _copy(s.state.record)
        _durable(done)
        return record

    # -- messages --------------------------------------------------------------------------
    def append(self, session_id: str, role: str, content: str, *, tool_calls: Iterable[ToolCall | dict] = (),
               metadata: dict[str, Any] | None = None, timestamp: str | None = None) -> ChatMessage:
        """Store one message with the next id; returns once it is durable (fsync mode)."""
        msg, done = self.append_pending(session_id, role, content, tool_calls=tool_calls, metadata=metadata,
                                        timestamp=timestamp)
        _durable(done)
        return msg

    def append_pending(self, session_id: str, role: str, content: str, *,
                       tool_calls: Iterable[ToolCall | dict] = (), metadata: dict[str, Any] | None = None,
                       timestamp: str | None = None) -> tuple[ChatMessage, Future[None] | None]:
        """``append`` without the wait: the message and a future resolved once it is durable (None
        when nothing is left to wait for). Used by AsyncHistoryStore, which awaits the future
        without holding a worker thread; do not acknowledge the message before it resolves."""
        calls = tool_calls_of(tool_calls)
        check_message(role, content, metadata, timestamp)
        with self.cache.locked(session_id) as s:
            msg = ChatMessage(s.state.next_id, role, content, timestamp or now_iso(), calls, dict(metadata or {}))
            raw = self._encode(msg)
            done = self._commit(s, "append", {"msg": orjson.loads(raw)}, raw_msg=raw, at=now_iso())
            return to_message(s.state.msgs[-1]), done

    def append_loaded(self, session_id: str, role: str, content: str, *,
                      tool_calls: Iterable[ToolCall | dict] = (), metadata: dict[str, Any] | None = None,
                      timestamp: str | None = None) -> tuple[ChatMessage, Future[None]] | None:
        """``append_pending`` without waiting and without I/O (as ``get_loaded``): the journal line
        is queued for the flusher thread, which writes it before the WAL record that makes it
        durable (fsync mode) or writes it at once (batched mode: the future resolves when it is
        written). None if the session is not loaded and idle with its journal open (then call
        ``append_pending`` in a thread). Safe on the event loop."""
        calls = tool_calls_of(tool_calls)
        check_message(role, content, metadata, timestamp)
        with self._loaded_idle(session_id) as s:
            if s is None:
                return None
            msg = ChatMessage(s.state.next_id, role, content, timestamp or now_iso(), calls, dict(metadata or {}))
            raw = self._encode(msg)
            done = self._commit(s, "append", {"msg": orjson.loads(raw)}, raw_msg=raw, at=now_iso(), queue=True)
            assert done is not None
            return to_message(s.state.msgs[-1]), done

    def update_loaded(self, session_id: str, message: ChatMessage) -> tuple[ChatMessage, Future[None]] | None:
        """``update_pending`` without waiting and without I/O (see ``append_loaded``)."""
        if not isinstance(message, ChatMessage):
            raise InvalidArgument("message: expected a ChatMessage")
        msg = ChatMessage(message.id, message.role, message.content, message.timestamp,
                          tool_calls_of(message.tool_calls), message.metadata)
        check_message(msg.role, msg.content, msg.metadata, msg.timestamp)
        with self._loaded_idle(session_id) as s:
            if s is None:
                return None
            if isinstance(msg.id, bool) or not isinstance(msg.id, int) or s.state.position(msg.id) is None:
                raise NotFound(f"message {message.id!r} not found in session {session_id}")
            raw = self._encode(msg)
            done = self._commit(s, "update", {"msg": orjson.loads(raw)}, raw_msg=raw, at=now_iso(), queue=True)
            assert done is not None
            return to_message(s.state.msgs[s.state.position(msg.id)]), done

    @contextmanager
    def _loaded_idle(self, session_id: str) -> Iterator[LoadedSession | None]:
        """The session with its lock held if it is loaded, idle right now and its journal can take
        a queued line, else None; never waits, never does I/O."""
        with self._try_locked(session_id) as sess:
            ok = sess is not None and sess.writer is not None and sess.writer.can_queue()
            if ok:
                sess.last_used = time.monotonic()
            yield sess if ok else None

    def update(self, session_id: str, message: ChatMessage) -> ChatMessage:
        """Replace the stored message with the same id (e.g. finalize a streamed answer)."""
        msg, done = self.update_pending(session_id, message)
        _durable(done)
        return msg

    def update_pending(self, session_id: str, message: ChatMessage) -> tuple[ChatMessage, Future[None] | None]:
        """``update`` without the wait (see ``append_pending``)."""
        if not isinstance(message, ChatMessage):
            raise InvalidArgument("message: expected a ChatMessage")
        msg = ChatMessage(message.id, message.role, message.content, message.timestamp,
                          tool_calls_of(message.tool_calls), message.metadata)
        check_message(msg.role, msg.content, msg.metadata, msg.timestamp)
        with self.cache.locked(session_id) as s:
            if isinstance(msg.id, bool) or not isinstance(msg.id, int) or s.state.position(msg.id) is None:
                raise NotFound(f"message {message.id!r} not found in session {session_id}")
            raw = self._encode(msg)
            done = self._commit(s, "update", {"msg": orjson.loads(raw)}, raw_msg=raw, at=now_iso())
            return to_message(s.state.msgs[s.state.position(msg.id)]), done

    def page(self, session_id: str, before: int | None = None, limit: int = 50) -> Page:
        """The newest ``limit`` visible messages with id < before (ascending). O(limit)."""
        _check_page(before, limit)
        with self.cache.locked(session_id) as s:
            st = s.state
            start, end, vis = st.visible_range(before, limit)
            msgs = [to_message(d) for d in st.msgs[start:end]]
            has_more = start > vis
            return Page(msgs, has_more, msgs[0].id if has_more else None, len(st.msgs) - vis)

    def page_encoded(self, session_id: str, before: int | None = None, limit: int = 50) -> EncodedPage:
        """``page`` with each message as its JSON bytes, encoded once per stored message and kept
        with the loaded session, so a page is a splice of cached bytes."""
        _check_page(before, limit)
        with self.cache.locked(session_id) as s:
            return _encoded_page(s.state, before, limit)

    def page_encoded_loaded(self, session_id: str, before: int | None = None,
                            limit: int = 50) -> EncodedPage | None:
        """``page_encoded`` without waiting and without I/O (as ``get_loaded``): None if the
        session is not loaded or its lock is busy. Safe on the event loop."""
        _check_page(before, limit)
        return self._if_loaded(session_id, lambda state: _encoded_page(state, before, limit))

    def messages(self, session_id: str, *, after_id: int = 0) -> list[ChatMessage]:
        """Visible messages with id > after_id, ascending."""
        if isinstance(after_id, bool) or not isinstance(after_id, int):
            raise InvalidArgument(f"after_id: expected an integer, got {after_id!r}")
        with self.cache.locked(session_id) as s:
            return [to_message(d) for d in s.state.after(after_id)]

    def raw_state(self, session_id: str) -> tuple[dict[str, Any], int, int, list[dict[str, Any]]]:
        """(record dict, cleared, next_id, every stored message dict, hidden ones included): the whole
        session as stored, for copying it to another backend (``storage.pg.migrate``)."""
        with self.cache.locked(session_id) as sess:
            st = sess.state
            return st.record.to_dict(), st.cleared, st.next_id, list(st.msgs)

    def search(self, user_id: str, query: str, *, session_id: str | None = None, limit: int = 20) -> list[SearchHit]:
        """Best ``limit`` matches among visible messages of the user's non-deleted sessions, best
        score first, newest first among ties. Sessions not loaded are read and dropped again."""
        return self.searcher.search(user_id, query, session_id=session_id, limit=limit)

    def export(self, session_id: str, fmt: str, model: str | None = None, *,
               max_bytes: int | None = None) -> str:
        """The session's visible messages as ``"json"`` or ``"markdown"`` (``model``: the model the
        header names instead of the stored one; ``max_bytes``: ExportTooLarge as soon as the part
        built is over it, see ``storage.export.export``).

        Only the list of stored dicts is taken under the session's lock (a change replaces a dict,
        never edits it); they are converted one by one while the export is built, so an export
        refused for its size converts only the messages before that point."""
        if fmt not in FORMATS:
            raise InvalidArgument(f"export format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
        with self.cache.locked(session_id) as s:
            record = _copy(s.state.record)
            dicts = s.state.after(0)            # (a new list: a later append or purge leaves it as is)
        return export(record, map(to_message, dicts), fmt, model, max_bytes=max_bytes, total=len(dicts))

    # -- commits ---------------------------------------------------------------------------
    def _commit(self, sess: LoadedSession, op: str, fields: dict[str, Any], *,
                raw_msg: bytes | None = None, at: str, queue: bool = False) -> Future[None] | None:
        """Journal one change, apply it, update the index (holds sess.lock). Returns the future to
        wait on (outside the lock) before acknowledging it, or None (batched mode, a line written
        here). ``queue``: the line is left to the flusher thread to write (``JournalWriter.queue``)."""
        seq = sess.state.last_seq + 1
        entry = {"seq": seq, "op": op, "at": at, **fields}
        wire = entry if raw_msg is None else {**entry, "msg": orjson.Fragment(raw_msg)}
        self.flusher.admit()              # (closing: refused here, before anything is written)
        try:
            try:
                line = orjson.dumps(wire, option=orjson.OPT_APPEND_NEWLINE)
                target = sess.writer.queue(line) if queue else sess.writer.append(line, sync=False)
            except OSError as exc:
                log.error("storage: journal write failed for %s: %s", sess.sid, exc)
                raise StorageIOError(f"could not write session {sess.sid}: {exc.strerror or exc}") from None
            sess.state.apply(entry)
            sess.journal_lines += 1
            sess.jdisk = sess.writer.size
            self.index.put(sess.state.record, sess.files())
            self.compactor.maybe_schedule(sess)
        except BaseException:
            self.flusher.withdraw()
            raise
        return self.flusher.request(sess, target, seq, line, queued=queue)

    def _invalidate(self, sess: LoadedSession, *, cut: bool = True) -> None:
        """A journal write or fsync failed: cut the journal back to what is durable (unless not
        ``cut``: batched mode after a failed write, whose journal holds what was acknowledged) and
        drop the loaded session, so the next call reloads exactly what is on disk (flusher thread)."""
        with sess.lock:
            if sess.status != READY:
                return
            if cut:
                try:
                    sess.writer.cut_to_synced()
                except OSError:
                    log.exception("storage: could not cut %s back after a failed fsync", sess.journal_path)
            self.cache.close_session(sess)
            log.error("storage: session %s dropped from memory after a failed write or fsync; it will be reloaded",
                      sess.sid)

    def compact(self, session_id: str) -> bool:
        """Compact one session now (False if a background compaction of it is running)."""
        with self.cache.locked(session_id) as sess:
            if sess.compacting:
                return False
            with _io_errors(f"could not compact session {session_id}"):
                self.compactor.compact_locked(sess)
            return True

    # -- memory and shutdown ---------------------------------------------------------------
    def loaded_count(self) -> int:
        """Sessions currently held in memory."""
        return len(self.cache)

    def evict_idle(self, now: float | None = None) -> int:
        """Evict sessions unused for ``idle_evict_s``; returns how many (``now`` lets tests move
        the clock)."""
        return self.cache.evict_idle(now)

    def _evict_step(self, now: float) -> None:
        self.cache.evict_idle(now)
        self.cache.trim()

    def flush(self) -> None:
        """Batched mode: make every acknowledged change durable now (a no-op in fsync mode)."""
        self.flusher.flush()

    def checkpoint(self) -> None:
        """fsync mode: make the journals durable by themselves and empty the WAL now (it happens
        on its own every ``wal_checkpoint_mib`` / ``wal_checkpoint_s`` and at close)."""
        self.flusher.checkpoint()

    def close(self) -> None:
        """Stop background work, compact and close every loaded session, write the index."""
        if not self.cache.close():
            return
        self.maintenance.close()
        self.compactor.close()
        self.flusher.close()
        for sess in self.cache.sessions():
            with sess.lock:
                if sess.status != READY:
                    continue
                try:
                    if sess.journal_lines > 0:
                        self.compactor.compact_locked(sess)
                except Exception:
                    log.exception("storage: compaction of %s on close failed", sess.sid)
                self.cache.close_session(sess)
        remove_reliever(self.cache.close_idle_journals)
        try:
            self.index.save(force=True)
        finally:
            os.close(self._lock_fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        return check_title(title, self.config.max_title_chars)


def _durable(done: Future[None] | None) -> None:
    """Wait until a commit is durable; raises StorageIOError if its fsync failed."""
    if done is not None:
        done.result()


@contextmanager
def _io_errors(what: str) -> Iterator[None]:
    """OSError -> StorageIOError (code STORAGE_ERROR), logged."""
    try:
        yield
    except OSError as exc:
        log.error("storage: %s: %s", what, exc)
        raise StorageIOError(f"{what}: {exc.strerror or exc}") from None


def _check_page(before: object, limit: object) -> None:
    if before is not None and (isinstance(before, bool) or not isinstance(before, int) or before < 1):
        raise InvalidArgument(f"before: expected a positive integer or None, got {before!r}")
    check_positive("limit", limit)


def _encoded_page(st: SessionState, before: int | None, limit: int) -> EncodedPage:
    start, end, vis = st.visible_range(before, limit)
    raws, sups = st.encoded(start, end)
    has_more = start > vis
    return EncodedPage(raws, sups, has_more, st.msgs[start]["id"] if has_more else None, len(st.msgs) - vis)


def _copy_state_record(state: SessionState) -> SessionRecord:
    return _copy(state.record)


def _converted(stored: list[dict], memo: dict[int, tuple[dict, ChatMessage]]) -> list[ChatMessage]:
    """``to_message`` of each stored message, reusing ``memo``'s conversion of the very same dict
    (keyed by ``id()``; the dict is kept in the memo, so its id cannot be reused meanwhile)."""
    out: list[ChatMessage] = []
    fresh: dict[int, tuple[dict, ChatMessage]] = {}
    for d in stored:
        got = memo.get(id(d))
        m = got[1] if got is not None and got[0] is d else to_message(d)
        fresh[id(d)] = (d, m)
        out.append(m)
    memo.clear()
    memo.update(fresh)
    return out


def _copy(record: SessionRecord) -> SessionRecord:
    """A copy the caller may change; the (immutable) summaries are shared, not copied.
    (Built positionally: ``dataclasses.replace`` costs ~4x more, and this runs several times a turn.)"""
    r = record
    return SessionRecord(r.session_id, r.user_id, r.title, r.created_at, r.updated_at, r.message_count,
                         r.deleted, r.model, r.preview, list(r.summaries), r.system_prompt, r.title_auto)


def warn_if_shared(root: str) -> None:
    """Log a WARNING (and go on) when the existing ``root`` (not a link to it: its target) grants
    group or other users any access: the store's own files are created private (0600 in 0700
    directories), but those made earlier, or by hand, may be readable through it (as sshd and
    PostgreSQL check their directories). Nothing is changed: fix it with ``chmod 700 <root>``."""
    try:
        st = os.stat(root)
    except OSError:
        return                     # (missing: created 0700 below; unreachable: makedirs will say)
    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o077:
        log.warning("storage: the history directory %s is accessible to other accounts (mode %04o); "
                    "other local users may read the conversations stored before: run chmod 700 on it",
                    root, stat.S_IMODE(st.st_mode))


def _lock_root(root: str) -> int:
    fd = open_regular(os.path.join(root, LOCK_NAME), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StorageLocked(f"storage root {root} is already in use by another store") from None
    return fd
