"""Group commit: one thread makes journal writes durable for everyone waiting on them.

In ``fsync`` mode a commit writes its journal line under the session lock (no fsync), or queues it
for the flusher to write (``JournalWriter.queue``: an append on the event loop), then asks the
flusher for durability and waits (outside the session lock) on the returned future. The flusher
takes every request queued at that moment as one round, writes their lines to the shared WAL
(``wal.py``) with one write and one fdatasync, whatever the number of sessions, and resolves the
round's futures. While one round is being fsynced the next one gathers, as PostgreSQL's WAL flush
does: the more appends wait, the more the fsync is shared. After a round, a WAL file that is big or
old enough is retired and checkpointed on the checkpoint thread (its journals fsynced side by side
on ``fsync_threads``, then the file deleted), off the commit path.

In ``batched`` mode nothing waits: the same thread fsyncs every journal with pending writes every
``batch_ms``.

A failed WAL write or fsync fails every waiter of the round with ``StorageIOError`` after
``on_failure`` (the store's invalidation: cut the journal back to its durable length, drop the
loaded session) has run for each session of the round, so no caller is acknowledged for a change
that may not be on disk; commits already queued for those sessions fail too (their writer is
``failed``).

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
from .wal import SharedLog, encode_record

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
                 on_failure: Callable[[LoadedSession], None], root: str,
                 checkpoint_bytes: int, checkpoint_s: float) -> None:
        self.batched = batched
        self._batch_s = batch_s
        self._on_failure = on_failure
        self._cond = threading.Condition(threading.Lock())
        self._waiting: list[tuple[LoadedSession, int, int, bytes, Future[None]]] = []
        self._files: list[NewFile] = []
        self._dirty: set[LoadedSession] = set()
        self._stopping = False
        self.batches = 0               # flush rounds with waiters (for benchmarks and tests)
        self.fsyncs = 0                # fsyncs issued for waiters (one WAL fdatasync per round)
        # The fsyncs of one checkpoint (or of one round's new files) run side by side: on ext4 and
        # xfs concurrent fsyncs join the same journal commit, so the device flush is shared.
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="storage-fsync")
        self.wal = SharedLog(root, checkpoint_bytes=checkpoint_bytes, checkpoint_s=checkpoint_s,
                             sync_journals=self._sync_paths)
        self._checkpointer = ThreadPoolExecutor(1, thread_name_prefix="storage-checkpoint")
        self._checkpoint_now: list[Future[None]] = []
        self._thread = threading.Thread(target=self._run, name="storage-flusher", daemon=True)
        self._thread.start()

    def request(self, sess: LoadedSession, target: int, seq: int, line: bytes) -> Future[None] | None:
        """After journal ``line`` (change ``seq``) was written and the writer's count reached
        ``target``: a future resolved once it is durable (fsync mode), or None (batched mode: the
        journal is marked for the next periodic fsync)."""
        with self._cond:
            if self.batched:
                self._dirty.add(sess)
                return None
            fut: Future[None] = Future()
            if self._stopping:
                fut.set_exception(StorageIOError("the history store is closing"))
                return fut
            self._waiting.append((sess, target, seq, line, fut))
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
                    self._cond.wait_for(lambda: self._waiting or self._files or self._stopping
                                        or self._checkpoint_now, timeout=self.wal.next_due())
                batch, self._waiting = self._waiting, []
                asked, self._checkpoint_now = self._checkpoint_now, []
                files, self._files = self._files, []
                stopping = self._stopping
            try:
                if files:
                    self._create_files(files)
                if self.batched:
                    if stopping or time.monotonic() >= next_flush:
                        self.flush()
                        next_flush = time.monotonic() + self._batch_s
                else:
                    if batch:
                        self._flush_batch(batch)
                if asked or self.wal.due():
                    self.wal.retire()
                    ran = self._checkpointer.submit(self._checkpoint)
                    for fut in asked:
                        ran.add_done_callback(lambda _, fut=fut: fut.set_result(None))
            except Exception as exc:       # a bug, not an I/O error: fail the round, keep the thread
                log.exception("storage: flush round failed")
                for fut in [w[-1] for w in batch] + [item.future for item in files]:
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

    def _flush_batch(self, batch: list[tuple[LoadedSession, int, int, bytes, Future[None]]]) -> None:
        """One WAL write + fdatasync for every commit of the round."""
        self.batches += 1
        live, records, journals = [], [], set()
        for item in batch:
            sess, _, seq, line, fut = item
            if not sess.writer.failed:
                try:
                    sess.writer.drain()  # lines queued on the event loop: journal before WAL
                except OSError as exc:
                    log.error("storage: journal write failed for %s: %s", sess.sid, exc.strerror or exc)
                    self._invalidate(sess)
            if sess.writer.failed:       # an earlier write failed: its session was cut back
                fut.set_exception(StorageIOError(f"could not make session {sess.sid} durable: "
                                                 "an earlier write of it failed"))
                continue
            live.append(item)
            records.append(encode_record(sess.sid, seq, line))
            journals.add(sess.writer.path)
        if not live:
            return
        self.fsyncs += 1
        try:
            self.wal.write(b"".join(records), journals)
        except OSError as exc:
            err = exc.strerror or str(exc)
            log.error("storage: WAL write failed: %s", err)
            for sess in {item[0] for item in live}:
                sess.writer.failed = True
                self._invalidate(sess)
            for sess, _, _, _, fut in live:
                fut.set_exception(StorageIOError(f"could not make session {sess.sid} durable: {err}"))
            return
        for sess, target, _, _, fut in live:
            sess.writer.mark_synced(target)
            fut.set_result(None)

    def _invalidate(self, sess: LoadedSession) -> None:
        try:
            self._on_failure(sess)
        except Exception:
            log.exception("storage: could not invalidate %s after a failed write", sess.sid)

    def _sync_paths(self, paths: list[str]) -> list[str]:
        """fsync journal files by path, side by side; the paths that failed."""
        results = self._pool.map(_sync_path, paths) if len(paths) > 1 else map(_sync_path, paths)
        return [p for p, ok in zip(paths, results) if not ok]

    def _checkpoint(self) -> None:
        try:
            self.wal.checkpoint()
        except Exception:
            log.exception("storage: WAL checkpoint failed")

    def checkpoint(self) -> None:
        """Retire the current WAL file and checkpoint every retired one; returns when done."""
        done: Future[None] = Future()
        with self._cond:
            if self._stopping:
                return
            self._checkpoint_now.append(done)
            self._cond.notify()
        done.result()

    def close(self) -> None:
        """Flush what is queued, stop the thread, then checkpoint the WAL (nothing is left to
        replay after a clean close, unless a journal could not be fsynced)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()
        self.wal.retire()
        self._checkpointer.submit(self._checkpoint)
        self._checkpointer.shutdown(wait=True)
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


def _sync_path(path: str) -> bool:
    """fsync one journal file by path (a file gone meanwhile, purged, needs nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:
        log.exception("storage: checkpoint could not open %s", path)
        return False
    try:
        os.fsync(fd)
    except OSError:
        log.exception("storage: checkpoint could not fsync %s", path)
        return False
    finally:
        os.close(fd)
    return True
