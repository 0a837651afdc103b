"""Group commit: one thread makes journal writes durable for everyone waiting on them.

In ``fsync`` mode a commit writes its journal line under the session lock, then asks the flusher
for durability and waits (outside the session lock) on the returned future. The flusher takes every
request queued at that moment as one batch, issues one fsync per journal in the batch (covering all
lines written to it so far, so later lines ride along) and resolves the batch's futures. While one
batch is being fsynced the next one gathers, as PostgreSQL's WAL flush does: the more appends wait,
the more each fsync is shared. A request whose journal is already durable up to its target (an
eviction or a compaction fsynced it) costs nothing.

In ``batched`` mode nothing waits: the same thread fsyncs every journal with pending writes every
``batch_ms``.

A failed fsync fails every waiter on that journal with ``StorageIOError`` after ``on_failure``
(the store's invalidation: cut the journal back to its durable length, drop the loaded session)
has run, so no caller is acknowledged for a change that may not be on disk.

New files (a new session's snapshot, ``NewFile``) are group-committed the same way, in both modes:
each round fsyncs the new files side by side, renames them in and fsyncs their directory once for
all of them, then runs each file's ``on_durable`` (the store makes the session visible) and
resolves its future. A failure removes that file (and its ``extra`` companions) and fails its
future with ``StorageIOError``.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from .errors import StorageIOError
from .fsio import fsync_dir
from .session import LoadedSession

log = logging.getLogger("storage")


@dataclass(eq=False)
class NewFile:
    """``tmp`` (written, not yet fsynced) becomes ``path`` durably; ``extra``: other new entries of
    the same directory, removed with it on failure; ``on_durable`` runs (flusher thread) before
    ``future`` resolves."""
    tmp: str
    path: str
    extra: tuple[str, ...]
    on_durable: Callable[[], None]
    future: Future[None] = field(default_factory=Future)


class JournalFlusher:
    """The flusher thread and its queue (thread-safe)."""

    def __init__(self, *, batched: bool, batch_s: float, threads: int,
                 on_failure: Callable[[LoadedSession], None]) -> None:
        self.batched = batched
        self._batch_s = batch_s
        self._on_failure = on_failure
        self._cond = threading.Condition(threading.Lock())
        self._waiting: list[tuple[LoadedSession, int, Future[None]]] = []
        self._files: list[NewFile] = []
        self._dirty: set[LoadedSession] = set()
        self._stopping = False
        self.batches = 0               # flush rounds with waiters (for benchmarks and tests)
        self.fsyncs = 0                # fsyncs issued for waiters
        # The fsyncs of one round run side by side: on ext4 and xfs concurrent fsyncs join the same
        # journal commit, so the device flush is shared even though each file needs its own call.
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="storage-fsync")
        self._thread = threading.Thread(target=self._run, name="storage-flusher", daemon=True)
        self._thread.start()

    def request(self, sess: LoadedSession, target: int) -> Future[None] | None:
        """After a journal write that returned ``target``: a future resolved once it is durable
        (fsync mode), or None (batched mode: the journal is marked for the next periodic fsync)."""
        with self._cond:
            if self.batched:
                self._dirty.add(sess)
                return None
            fut: Future[None] = Future()
            if self._stopping:
                fut.set_exception(StorageIOError("the history store is closing"))
                return fut
            self._waiting.append((sess, target, fut))
            self._cond.notify()
            return fut

    def request_file(self, item: NewFile) -> Future[None]:
        """Make a new file durable in the next round (both modes); returns ``item.future``."""
        with self._cond:
            if self._stopping:
                _discard(item)
                item.future.set_exception(StorageIOError("the history store is closing"))
            else:
                self._files.append(item)
                self._cond.notify()
        return item.future

    def queued(self) -> int:
        """Commits waiting for the next flush round (not yet taken by the flusher)."""
        with self._cond:
            return len(self._waiting)

    def files_queued(self) -> int:
        """New files waiting for the next round (not yet taken by the flusher)."""
        with self._cond:
            return len(self._files)

    def flush(self) -> None:
        """fsync every journal with batched writes pending, now (in the caller's thread)."""
        with self._cond:
            batch, self._dirty = self._dirty, set()
        for sess in batch:
            if sess.writer is not None and sess.writer.dirty:
                try:
                    sess.writer.sync()
                except OSError:
                    log.exception("storage: batched fsync of %s failed", sess.sid)
                    self._on_failure(sess)

    def forget(self, sess: LoadedSession) -> None:
        """The session was closed (its journal fsynced): no periodic fsync for it any more."""
        with self._cond:
            self._dirty.discard(sess)

    def _run(self) -> None:
        next_flush = time.monotonic() + self._batch_s
        while True:
            with self._cond:
                if self.batched:
                    self._cond.wait_for(lambda: self._files or self._stopping,
                                        timeout=max(0.0, next_flush - time.monotonic()))
                else:
                    self._cond.wait_for(lambda: self._waiting or self._files or self._stopping)
                batch, self._waiting = self._waiting, []
                files, self._files = self._files, []
                stopping = self._stopping
            try:
                if files:
                    self._create_files(files)
                if self.batched:
                    if stopping or time.monotonic() >= next_flush:
                        self.flush()
                        next_flush = time.monotonic() + self._batch_s
                elif batch:
                    self._flush_batch(batch)
            except Exception as exc:       # a bug, not an I/O error: fail the round, keep the thread
                log.exception("storage: flush round failed")
                for fut in [f for _, _, f in batch] + [item.future for item in files]:
                    if not fut.done():
                        fut.set_exception(StorageIOError(f"could not make the change durable: {exc!r}"))
            if stopping:
                return

    def _create_files(self, files: list[NewFile]) -> None:
        """fsync the new files side by side, rename them in, fsync each directory once."""
        results = self._pool.map(_sync_file, files) if len(files) > 1 else map(_sync_file, files)
        renamed: dict[str, list[NewFile]] = {}
        for item, err in zip(files, results):
            if err is None:
                try:
                    os.replace(item.tmp, item.path)
                except OSError as exc:
                    err = exc.strerror or str(exc)
            if err is None:
                renamed.setdefault(os.path.dirname(item.path) or ".", []).append(item)
            else:
                _fail_file(item, err)
        for directory, items in renamed.items():
            try:
                fsync_dir(directory)
            except OSError as exc:
                for item in items:
                    _fail_file(item, exc.strerror or str(exc))
                continue
            for item in items:
                try:
                    item.on_durable()
                except Exception as exc:
                    log.exception("storage: %s is durable but could not be published", item.path)
                    item.future.set_exception(StorageIOError(f"could not create {item.path}: {exc!r}"))
                else:
                    item.future.set_result(None)

    def _flush_batch(self, batch: list[tuple[LoadedSession, int, Future[None]]]) -> None:
        self.batches += 1
        targets: dict[LoadedSession, int] = {}
        for sess, target, _ in batch:
            targets[sess] = max(target, targets.get(sess, 0))
        todo = [(sess, target) for sess, target in targets.items() if sess.writer.synced < target]
        self.fsyncs += len(todo)
        failed: dict[LoadedSession, str] = {}
        results = self._pool.map(_sync, todo) if len(todo) > 1 else map(_sync, todo)
        for (sess, _), err in zip(todo, results):
            if err is None:
                continue
            log.error("storage: fsync of %s failed: %s", sess.writer.path, err)
            failed[sess] = err
            try:
                self._on_failure(sess)
            except Exception:
                log.exception("storage: could not invalidate %s after a failed fsync", sess.sid)
        for sess, _, fut in batch:
            if sess in failed:
                fut.set_exception(StorageIOError(f"could not make session {sess.sid} durable: {failed[sess]}"))
            else:
                fut.set_result(None)

    def close(self) -> None:
        """Flush what is queued, then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()
        self._pool.shutdown(wait=True)


def _sync_file(item: NewFile) -> str | None:
    """fsync a new file; the error text if it failed."""
    try:
        fd = os.open(item.tmp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _discard(item: NewFile) -> None:
    """Remove what a failed new file left behind."""
    for path in (item.tmp, item.path, *item.extra):
        try:
            os.unlink(path)
        except OSError:
            pass


def _fail_file(item: NewFile, err: str) -> None:
    log.error("storage: could not create %s: %s", item.path, err)
    _discard(item)
    item.future.set_exception(StorageIOError(f"could not create {os.path.basename(item.path)}: {err}"))


def _sync(item: tuple[LoadedSession, int]) -> str | None:
    """fsync one journal through ``target``; the error text if it failed."""
    sess, target = item
    try:
        sess.writer.sync_through(target)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None
