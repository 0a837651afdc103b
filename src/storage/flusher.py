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

In ``batched`` mode nothing waits for an fsync. A commit written in a worker thread is
acknowledged at once; a line queued on the event loop is acknowledged once the flusher has written
it, which it does at once, a round for every line queued meanwhile (so a SIGKILL loses nothing
acknowledged: the kernel has it). The round's WAL records are kept, and every ``batch_ms`` the
records gathered so far go to the shared WAL with one write and one fdatasync, as a round of fsync
mode does, and are checkpointed the same way. (Before, each dirty journal was fsynced by itself
every ``batch_ms``, and every line was written by a worker thread of its own.)

A failed WAL write or fsync fails every waiter of the round with ``StorageIOError`` after
``on_failure`` (the store's invalidation: cut the journal back to its durable length, drop the
loaded session) has run for each session of the round, so no caller is acknowledged for a change
that may not be on disk; commits already queued for those sessions fail too (their writer is
``failed``). In batched mode the same invalidation follows a failed periodic write or fdatasync
(what it drops was acknowledged: that is the mode's bargain), and a failed journal write fails the
queued line's caller.

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
from typing import NamedTuple

from .errors import StorageIOError
from .journal import JournalWriter
from .fsio import NotRegularFile, fsync_dir, open_regular
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


class Commit(NamedTuple):
    """One change waiting for the flusher: its journal line (written up to ``target`` bytes of
    ``writer``), change ``seq``, and the future its caller waits on (None: nobody waits)."""
    sess: LoadedSession
    writer: JournalWriter
    target: int
    seq: int
    line: bytes
    future: Future[None] | None


class JournalFlusher:
    """The flusher thread and its queue (thread-safe)."""

    def __init__(self, *, batched: bool, batch_s: float, threads: int,
                 on_failure: Callable[..., None], root: str,
                 checkpoint_bytes: int, checkpoint_s: float) -> None:
        self.batched = batched
        self._batch_s = batch_s
        self._on_failure = on_failure
        lock = threading.Lock()
        self._cond = threading.Condition(lock)    # the flusher thread waits on it for work
        self._idle = threading.Condition(lock)    # close waits on it for admitted commits
        self._admitted = 0             # commits between ``admit`` and ``request`` (or ``withdraw``)
        self._refusing = False         # closing: ``admit`` refuses
        self._waiting: list[Commit] = []      # for the next round: to write, and in fsync mode to sync
        self._written: list[Commit] = []      # batched mode: written in a worker, for the next periodic sync
        self._sync_now: list[Future[None]] = []   # batched mode: ``flush`` callers
        self._files: list[NewFile] = []
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

    def admit(self) -> None:
        """Before a commit writes or queues its journal line (session lock held): raises
        StorageIOError once the store is closing; otherwise the commit owes a ``request`` (or a
        ``withdraw`` if it fails before writing), and ``close`` waits for it. So a change is either
        refused before anything is written or applied, or made durable by the close: never
        refused after it was written (it would then be in the journal, and in the snapshot the
        close writes, although its caller was told it failed)."""
        with self._cond:
            if self._refusing:
                raise StorageIOError("the history store is closing")
            self._admitted += 1

    def withdraw(self) -> None:
        """An admitted commit failed before its ``request``: nothing of it is written."""
        with self._cond:
            self._settle()

    def _settle(self) -> None:
        self._admitted -= 1
        if self._refusing and not self._admitted:
            self._idle.notify_all()

    def request(self, sess: LoadedSession, target: int, seq: int, line: bytes, *,
                queued: bool) -> Future[None] | None:
        """After journal ``line`` (change ``seq``, ``admit``-ted) was written, or ``queued`` for the
        flusher to write, and the writer's count reached ``target``: a future to wait on before
        acknowledging the change, resolved once it is durable (fsync mode) or written (batched
        mode); None in batched mode for a line already written (its WAL record goes with the next
        periodic sync). ``close`` waits for every admitted commit's request, so this is always
        before the flusher's last round."""
        with self._cond:
            self._settle()
            if self.batched and not queued:
                if not self._written:
                    self._cond.notify()          # (the flusher times the next sync from the first)
                self._written.append(Commit(sess, sess.writer, target, seq, line, None))
                return None
            fut = Future()
            self._waiting.append(Commit(sess, sess.writer, target, seq, line, fut))
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
        """Batched mode: make every acknowledged change durable now (the next periodic sync, at
        once); returns when it is done. Nothing to do in fsync mode."""
        if not self.batched:
            return
        done: Future[None] = Future()
        with self._cond:
            if self._stopping:
                return
            self._sync_now.append(done)
            self._cond.notify()
        done.result()

    def _run(self) -> None:
        # batched mode: written and acknowledged, not yet synced (a session closed meanwhile fsynced
        # its journal: its records are then harmless, replay skips what a journal holds)
        unsynced: list[Commit] = []
        sync_at = 0.0                    # batched mode: when they are synced
        while True:
            with self._cond:
                def ready() -> bool:
                    return bool(self._waiting or self._files or self._stopping or self._checkpoint_now
                                or self._sync_now or (self._written and not unsynced))
                timeout = self.wal.next_due()
                if unsynced:
                    timeout = max(0.0, min(sync_at - time.monotonic(), timeout if timeout is not None else 1e9))
                self._cond.wait_for(ready, timeout=timeout)
                batch, self._waiting = self._waiting, []
                written, self._written = self._written, []
                asked, self._checkpoint_now = self._checkpoint_now, []
                syncs, self._sync_now = self._sync_now, []
                files, self._files = self._files, []
                stopping = self._stopping
            try:
                if files:
                    self._create_files(files)
                if not self.batched:
                    if batch:
                        self._flush_batch(batch)
                else:
                    live = self._write(batch)
                    for commit in live:
                        commit.future.set_result(None)      # type: ignore[union-attr]  (written: acknowledged)
                    if (live or written) and not unsynced:
                        sync_at = time.monotonic() + self._batch_s
                    unsynced += written
                    unsynced += live
                    # (a checkpoint asked for, after a purge say, first takes what is pending with it)
                    if unsynced and (stopping or syncs or asked or time.monotonic() >= sync_at):
                        synced = [c for c in unsynced if c.writer.lost_after is None
                                  or c.target <= c.writer.lost_after]     # (not what a failure cut off)
                        unsynced = []
                        if synced:
                            self._log(synced)
                    for fut in syncs:
                        fut.set_result(None)
                if asked or self.wal.due():
                    self.wal.retire()
                    ran = self._checkpointer.submit(self._checkpoint)
                    for fut in asked:
                        ran.add_done_callback(lambda _, fut=fut: fut.set_result(None))
            except Exception as exc:       # a bug, not an I/O error: fail the round, keep the thread
                log.exception("storage: flush round failed")
                for fut in [c.future for c in batch] + [item.future for item in files] + syncs:
                    if fut is not None and not fut.done():
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

    def _flush_batch(self, batch: list[Commit]) -> None:
        """fsync mode: one WAL write + fdatasync for every commit of the round."""
        self.batches += 1
        live = self._write(batch)
        if not live:
            return
        err = self._log(live)
        for commit in live:
            fut = commit.future
            assert fut is not None
            if err is None:
                fut.set_result(None)
            else:
                fut.set_exception(StorageIOError(f"could not make session {commit.sess.sid} durable: {err}"))

    def _write(self, batch: list[Commit]) -> list[Commit]:
        """Write the lines queued on the event loop (journal before WAL); the commits still good.
        Each commit whose journal failed (now or earlier: its session was cut back) fails."""
        live = []
        for commit in batch:
            writer = commit.writer
            if not writer.failed:
                try:
                    writer.drain()
                except OSError as exc:
                    log.error("storage: journal write failed for %s: %s", commit.sess.sid, exc.strerror or exc)
                    self._invalidate(commit.sess, cut=not self.batched)   # (batched: keep what was acknowledged)
            if writer.failed:
                if commit.future is not None:
                    commit.future.set_exception(StorageIOError(
                        f"could not make session {commit.sess.sid} durable: an earlier write of it failed"))
                continue
            live.append(commit)
        return live

    def _log(self, commits: list[Commit]) -> str | None:
        """One WAL write + fdatasync for ``commits`` (their journal lines written); None, or the
        error after their sessions were invalidated (cut back to what is durable)."""
        self.fsyncs += 1
        try:
            self.wal.write(b"".join(encode_record(c.sess.sid, c.seq, c.line) for c in commits),
                           {c.writer.path for c in commits})
        except OSError as exc:
            err = exc.strerror or str(exc)
            log.error("storage: WAL write failed: %s", err)
            for sess, writer in {(c.sess, c.writer) for c in commits}:
                writer.failed = True
                self._invalidate(sess)
            return err
        for commit in commits:
            commit.writer.mark_synced(commit.target)
        return None

    def _invalidate(self, sess: LoadedSession, *, cut: bool = True) -> None:
        try:
            self._on_failure(sess, cut=cut)
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
        """Refuse new commits, wait for the admitted ones to be requested, flush what is queued,
        stop the thread, then checkpoint the WAL (nothing is left to replay after a clean close,
        unless a journal could not be fsynced)."""
        with self._cond:
            self._refusing = True
            self._idle.wait_for(lambda: not self._admitted)     # their lines join the last round
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
        fd = open_regular(item.tmp)
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
    """fsync one journal file by path (a file gone meanwhile, purged, needs nothing; nor does one
    replaced by a symbolic link or something else, which is not the store's: never opened)."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return True
    except NotRegularFile as exc:
        log.error("storage: checkpoint: %s %s; not fsynced", path, exc.strerror)
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
