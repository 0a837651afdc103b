"""The machinery under HistoryStore: the bounded LRU of loaded sessions with per-session locks,
journaled commits, background compaction, the batched-fsync flusher, idle eviction, startup
recovery and shutdown. The public API is in store.py."""
from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import orjson

from .config import StorageConfig
from .errors import CorruptSession, NotFound, StorageClosed, StorageError, StorageLocked
from .fsio import fsync_dir, quarantine
from .ids import journal_name, snapshot_name, validate_session_id
from .index import INDEX_NAME, SessionIndex, entry_for
from .journal import JournalWriter
from .models import SessionRecord
from .recovery import recover
from .session import (GONE, READY, LoadedSession, SnapshotError, UnsupportedSchema, file_stat,
                      load_session, write_snapshot)

log = logging.getLogger("storage")

LOCK_NAME = ".lock"


class StoreCore:
    """Session cache, commits, compaction and maintenance; thread-safe."""

    def __init__(self, config: StorageConfig) -> None:
        self.config = config
        self.root = os.path.abspath(config.root)
        os.makedirs(self.root, exist_ok=True)
        self._lock_fd = _lock_root(self.root)
        self._batched = config.durability == "batched"
        self._cache: OrderedDict[str, LoadedSession] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._dirty: set[LoadedSession] = set()
        self._dirty_lock = threading.Lock()
        self._closed = False
        self.index = SessionIndex(os.path.join(self.root, INDEX_NAME))
        try:
            self.recovery_stats = recover(self.root, self.index, self._reload_entry)
            self.index.save()
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._compactor = ThreadPoolExecutor(1, thread_name_prefix="storage-compact")
        self._stop = threading.Event()
        self._maint = threading.Thread(target=self._maintain, name="storage-maintenance", daemon=True)
        self._maint.start()

    # -- paths and loading -----------------------------------------------------------------
    def _paths(self, sid: str) -> tuple[str, str]:
        return os.path.join(self.root, snapshot_name(sid)), os.path.join(self.root, journal_name(sid))

    def _read(self, sid: str, snap: str, jpath: str):
        """Load one session from disk, quarantining a corrupt snapshot (and its journal)."""
        try:
            loaded = load_session(snap, jpath)
        except FileNotFoundError:
            self.index.remove(sid)
            raise NotFound(f"session {sid} not found (its file is gone)") from None
        except UnsupportedSchema as exc:
            log.error("storage: %s left in place: %s", snap, exc)
            raise CorruptSession(f"session {sid} cannot be read by this version: {exc}") from None
        except OSError as exc:
            log.error("storage: cannot read %s: %s", snap, exc)
            raise StorageError(f"session {sid} cannot be read right now: {exc.strerror or exc}") from None
        except SnapshotError as exc:
            quarantine(self.root, snap, reason=f"corrupt snapshot: {exc}")
            quarantine(self.root, jpath, reason="journal of a quarantined snapshot")
            self.index.remove(sid)
            raise CorruptSession(f"session {sid} is unreadable ({exc}); its files were moved to "
                                 f"quarantine/") from None
        scan = loaded.scan
        if scan.torn:
            log.warning("storage: %s: ignored a torn last line (%d bytes)", jpath, scan.disk_len - scan.valid_len)
        if scan.bad_lines or scan.rejected:
            log.warning("storage: %s: skipped unreadable lines %s and entries seq %s", jpath,
                        scan.bad_lines[:10], scan.rejected[:10])
            quarantine(self.root, jpath, copy=True, reason="journal with unreadable lines")
        return loaded

    def _reload_entry(self, sid: str) -> dict[str, Any] | None:
        """Recovery callback: re-read one session and return its index entry (None if unusable)."""
        snap, jpath = self._paths(sid)
        try:
            loaded = self._read(sid, snap, jpath)
        except StorageError:          # quarantined, newer schema or unreadable: not indexed
            return None
        return entry_for(loaded.state.record, [*loaded.snap_stat, loaded.scan.disk_len])

    def _fill(self, sess: LoadedSession) -> None:
        loaded = self._read(sess.sid, sess.snap_path, sess.journal_path)
        sess.state = loaded.state
        sess.writer = JournalWriter(sess.journal_path, loaded.scan.valid_len)
        sess.journal_lines = loaded.scan.lines
        sess.jdisk = loaded.scan.disk_len
        sess.snap_stat = loaded.snap_stat
        sess.status = READY

    # -- the cache -------------------------------------------------------------------------
    @contextmanager
    def _locked(self, sid: str, *, transient: bool = False) -> Iterator[LoadedSession]:
        """Yield the loaded session with its lock held, loading it if needed. A transient load
        (search) is dropped again on exit instead of staying in the LRU."""
        validate_session_id(sid)
        while True:
            with self._cache_lock:
                if self._closed:
                    raise StorageClosed("the history store is closed")
                sess = self._cache.get(sid)
                fresh = sess is None
                if fresh:
                    if self.index.get(sid) is None:
                        raise NotFound(f"session {sid} not found")
                    sess = LoadedSession(sid, *self._paths(sid))
                    sess.transient = transient
                    sess.lock.acquire()
                    self._cache[sid] = sess
                else:
                    self._cache.move_to_end(sid)
            if fresh:
                try:
                    self._fill(sess)
                except BaseException:
                    self._forget(sess)
                    sess.lock.release()
                    raise
                break
            sess.lock.acquire()
            if sess.status == READY:
                if not transient:
                    sess.transient = False
                break
            sess.lock.release()
        try:
            sess.last_used = time.monotonic()
            yield sess
        finally:
            if sess.transient and sess.status == READY and not sess.compacting:
                self._close_session(sess)
            sess.lock.release()
        if fresh and not transient:
            self._trim()

    def _forget(self, sess: LoadedSession) -> None:
        sess.status = GONE
        with self._cache_lock:
            if self._cache.get(sess.sid) is sess:
                del self._cache[sess.sid]
        with self._dirty_lock:
            self._dirty.discard(sess)

    def _close_session(self, sess: LoadedSession) -> None:
        """Flush and close a session's journal and drop it from the cache (caller holds its lock)."""
        try:
            if sess.writer is not None:
                sess.writer.close()
        finally:
            self._forget(sess)

    def _evict(self, sess: LoadedSession) -> bool:
        if not sess.lock.acquire(blocking=False):
            return False          # in use right now: not a good victim
        try:
            if sess.status != READY or sess.compacting:
                return False
            self._close_session(sess)
            return True
        finally:
            sess.lock.release()

    def _trim(self) -> None:
        """Evict least recently used sessions beyond ``lru_size``, skipping busy ones (the
        maintenance thread retries). The most recently used session is never the victim."""
        with self._cache_lock:
            excess = len(self._cache) - self.config.lru_size
            candidates = list(self._cache.values())[:-1] if excess > 0 else []
        for v in candidates:
            if excess <= 0:
                break
            excess -= self._evict(v)

    def evict_idle(self, now: float | None = None) -> int:
        """Evict sessions unused for ``idle_evict_s``; returns how many (the maintenance thread
        calls this; ``now`` lets tests move the clock)."""
        now = time.monotonic() if now is None else now
        limit = self.config.idle_evict_s
        with self._cache_lock:
            victims = [s for s in self._cache.values() if now - s.last_used > limit]
        return sum(self._evict(v) for v in victims)

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosed("the history store is closed")

    def loaded_count(self) -> int:
        """Sessions currently held in memory."""
        with self._cache_lock:
            return len(self._cache)

    # -- commits and compaction ------------------------------------------------------------
    def _commit(self, sess: LoadedSession, op: str, fields: dict[str, Any], *,
                raw_msg: bytes | None = None, at: str) -> None:
        """Journal one change (fsynced unless batched), apply it, update the index. Holds sess.lock."""
        seq = sess.state.last_seq + 1
        entry = {"seq": seq, "op": op, "at": at, **fields}
        wire = entry if raw_msg is None else {**entry, "msg": orjson.Fragment(raw_msg)}
        try:
            sess.writer.append(orjson.dumps(wire) + b"\n", sync=not self._batched)
        except OSError as exc:
            log.exception("storage: journal write failed for %s", sess.sid)
            raise StorageError(f"could not write session {sess.sid}: {exc.strerror or exc}") from None
        sess.state.apply(entry)
        sess.journal_lines += 1
        sess.jdisk = sess.writer.size
        if self._batched:
            with self._dirty_lock:
                self._dirty.add(sess)
        self.index.put(sess.state.record, sess.files())
        if not sess.compacting:
            self._schedule_compaction(sess)

    def _schedule_compaction(self, sess: LoadedSession) -> bool:
        """Queue a background compaction if the journal reached the threshold. Holds sess.lock.

        Sets ``sess.compacting`` while one is queued; returns whether one was queued.
        """
        if sess.journal_lines < self.config.compact_threshold:
            return False
        sess.compacting = True
        try:
            self._compactor.submit(self._compact_bg, sess, self._capture(sess))
        except RuntimeError:              # shutting down: close() compacts
            sess.compacting = False
            return False
        return True

    @staticmethod
    def _capture(sess: LoadedSession) -> tuple[dict[str, Any], list[dict[str, Any]], int, int]:
        return sess.state.head(), sess.state.msgs[:], sess.writer.size, sess.journal_lines

    def _install(self, sess: LoadedSession, tmp: str, offset: int, lines: int) -> None:
        """Rename the new snapshot in, then drop the journal lines it covers. Holds sess.lock."""
        os.replace(tmp, sess.snap_path)
        fsync_dir(self.root)
        sess.snap_stat = file_stat(sess.snap_path)
        sess.writer.drop_prefix(offset)
        sess.journal_lines = max(sess.journal_lines - lines, 0)
        sess.jdisk = sess.writer.size
        self.index.put(sess.state.record, sess.files())

    def _compact_bg(self, sess: LoadedSession, cap: tuple) -> None:
        head, msgs, offset, lines = cap
        tmp = sess.snap_path + ".tmp"
        queued_again = False
        try:
            write_snapshot(tmp, head, msgs)
            with sess.lock:
                if sess.status != READY:
                    os.unlink(tmp)
                    return
                self._install(sess, tmp, offset, lines)
                # Appends made while this snapshot was written may have filled the journal again;
                # nothing else would compact it until the next append. (Queued behind this one on
                # the single worker, so it cannot start before this call returns.)
                queued_again = self._schedule_compaction(sess)
        except Exception:
            log.exception("storage: background compaction of %s failed", sess.sid)
            _unlink_quiet(tmp)
        finally:
            if not queued_again:
                sess.compacting = False
            self._trim()

    def _compact_locked(self, sess: LoadedSession) -> None:
        head, msgs, offset, lines = self._capture(sess)
        tmp = sess.snap_path + ".tmp"
        try:
            write_snapshot(tmp, head, msgs)
            self._install(sess, tmp, offset, lines)
        except BaseException:
            _unlink_quiet(tmp)
            raise

    def compact(self, session_id: str) -> bool:
        """Compact one session now (False if a background compaction of it is running)."""
        with self._locked(session_id) as sess:
            if sess.compacting:
                return False
            self._compact_locked(sess)
            return True

    # -- maintenance and shutdown ----------------------------------------------------------
    def _maintain(self) -> None:
        cfg = self.config
        tick = min(cfg.batch_ms / 1000 if self._batched else 0.25, cfg.index_flush_ms / 1000)
        next_index = time.monotonic() + cfg.index_flush_ms / 1000
        while not self._stop.wait(tick):
            try:
                if self._batched:
                    self.flush()
                now = time.monotonic()
                if now >= next_index:
                    self.index.save()
                    next_index = now + cfg.index_flush_ms / 1000
                self.evict_idle(now)
                self._trim()
            except Exception:
                log.exception("storage: maintenance step failed")

    def flush(self) -> None:
        """fsync every journal with batched writes pending."""
        with self._dirty_lock:
            batch, self._dirty = self._dirty, set()
        for sess in batch:
            if sess.writer is not None:
                sess.writer.sync()

    def close(self) -> None:
        """Stop background work, compact and close every loaded session, write the index."""
        with self._cache_lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._maint.join()
        self._compactor.shutdown(wait=True)
        with self._cache_lock:
            sessions = list(self._cache.values())
        for sess in sessions:
            with sess.lock:
                if sess.status != READY:
                    continue
                try:
                    if sess.journal_lines > 0:
                        self._compact_locked(sess)
                except Exception:
                    log.exception("storage: compaction of %s on close failed", sess.sid)
                self._close_session(sess)
        try:
            self.index.save(force=True)
        finally:
            os.close(self._lock_fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _copy(record: SessionRecord) -> SessionRecord:
        """A copy the caller may change; the (immutable) summaries are shared, not copied."""
        return dataclasses.replace(record, summaries=list(record.summaries))


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _lock_root(root: str) -> int:
    fd = os.open(os.path.join(root, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StorageLocked(f"storage root {root} is already in use by another store") from None
    return fd
