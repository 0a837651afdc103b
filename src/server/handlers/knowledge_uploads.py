"""Uploads in progress (docs/protocol.md §5.8): partial files under the data dir, the data frames of
each connection, and the named limits (concurrent uploads per user and server-wide, expiry).

A partial upload is ``<root>/<upload_id>.part`` (the bytes so far) plus ``<upload_id>.json`` (who,
where, what). ``upload_id`` is derived from (user, collection, name, size, md5), so a BEGIN sent
again after a disconnect finds the partial file and continues from its size; partial files not
touched for ``upload_expiry_s`` are removed (at start and at every BEGIN). What each user has
reserved with their partial uploads (``max_uploads_per_user``, ``user_quota_bytes``), counting the
partial files found at start, and which detached ones a BEGIN drops to fit, is
``upload_ledger.UploadLedger``; this module removes their files. Received bytes are
buffered and written (and hashed, md5 + sha256) by a writer task in a worker thread, never on the
event loop; a connection whose unwritten bytes exceed ``upload_buffer_bytes`` stops being read
until the writer catches up (``Flow``). A KB_UPLOAD_END whose bytes are all there and verified waits,
when its user's ingests are all in progress (``max_ingests_per_user``), for one to end (``finish``
with ``slot``) instead of being refused; if it gives up (its connection closed, the server stops),
the partial upload is kept for a resume.

With several nodes (PostgreSQL), what is written is also shared so that an upload resumes through
any node (``upload_sharing.UploadSharing``).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol

from protocol import ErrorCode, MsgType, ProtocolError
from protocol.binary import MAX_DATA, decode_data
from protocol.kb import KbProgress, KbUploadReply
from server.errors import HandlerError
from server.handlers.upload_ledger import Partial, UploadLedger
from server.handlers.upload_sharing import UploadSharing
from server.knowledge.config import KnowledgeConfig
from server.knowledge.store import ensure_directory
from server.wire import encode_reply

log = logging.getLogger("nplt.knowledge")

_PROGRESS = int(MsgType.KB_PROGRESS)
HASH_BLOCK = 1 << 20
REPORT_STEPS = 50           # "receiving" progress about every 2 %, and whenever the writer caught up

#: ``KnowledgeBase.wait_for_ingest_slot``: (user, give_up) -> True once the user may start an ingest,
#: False once ``give_up`` is done
SlotWait = Callable[[str, asyncio.Future], Awaitable[bool]]


class Flow(Protocol):
    """The reading side of the connection the data frames come from."""
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


@dataclass(eq=False)
class Upload:
    upload_id: str
    user: str
    collection: str
    name: str
    size: int
    md5: str
    sha256: str | None
    part: Path
    received: int = 0                          # bytes accepted (buffered or written)
    written: int = 0
    buf: list[memoryview] = field(default_factory=list)   # received, not written yet (no copy)
    buffered: int = 0
    writer: asyncio.Task | None = None
    file: Any = None                           # the open .part file (worker threads only)
    h_md5: Any = field(default_factory=lambda: hashlib.md5(usedforsecurity=False))
    h_sha: Any = None                          # sha256, only when the client announced one
    port: Any = None                           # the connection it is attached to, and its handle
    handle: int = 0
    re: Any = None                             # BEGIN's id: KB_PROGRESS "receiving" carries it
    flow: Flow | None = None
    paused: bool = False
    reported_error: bool = False
    next_report: int = 0
    shared: int = 0                            # bytes from 0 in the shared copy (several nodes)
    unshared: list[memoryview] = field(default_factory=list)   # written, not shared yet
    share_failed: bool = False
    failed: str | None = None                  # why the disk refused a write: the upload stops there


def upload_id_of(user: str, collection: str, name: str, size: int, md5: str) -> str:
    key = "\0".join((user, collection, name, str(size), md5.lower()))
    return "up_" + hashlib.sha256(key.encode()).hexdigest()[:32]


class UploadService:
    """Every upload in progress; one per server (``Services.uploads``)."""

    def __init__(self, config: KnowledgeConfig, root: str | os.PathLike, sharing: UploadSharing | None = None) -> None:
        self.config = config
        self.root = Path(root)
        self.sharing = sharing                                # several nodes: the copy they all read
        self._active: dict[str, Upload] = {}                  # upload_id -> attached upload
        self._ports: dict[Any, dict[int, Upload]] = {}        # port -> handle -> upload
        self._closing: dict[str, asyncio.Task] = {}           # upload_id -> its .part file being closed
        self._ledger = UploadLedger()                         # what each user's partial uploads reserve
        self._ending: set[str] = set()                        # upload_ids between END's checks and remove()
        self._ended: dict[str, asyncio.Event] = {}              # ... set when remove() ends it
        self._removing: dict[str, asyncio.Task] = {}          # upload_id -> dropped to make room, files going
        self._leaving: dict[Any, list[asyncio.Future]] = {}   # port -> its ENDs waiting (done when it closes)
        self._handles = 0

    # -- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.to_thread(ensure_directory, self.root)   # (a file there: said plainly, not as an errno)
        await asyncio.to_thread(self._sweep, frozenset())
        self._ledger.found(await asyncio.to_thread(self._scan))

    async def close(self) -> None:
        """Wait for the partial files being closed and their last pieces shared (server stop)."""
        for task in list(self._closing.values()):
            await task
        if self.sharing is not None:
            await self.sharing.close()

    def _in_use(self) -> frozenset[str]:
        """Upload ids attached or being stored: they count, and are never dropped to make room."""
        return frozenset(self._active) | frozenset(self._ending)

    def _busy(self) -> frozenset[str]:
        """Upload ids whose files are in use: attached, being stored, being closed."""
        return self._in_use() | frozenset(self._closing)

    def _sweep(self, busy: frozenset[str]) -> set[str]:
        """Remove partial uploads not touched for ``upload_expiry_s`` (worker thread); their ids."""
        self.root.mkdir(parents=True, exist_ok=True)
        limit = time.time() - self.config.upload_expiry_s
        gone: set[str] = set()
        for entry in os.scandir(self.root):
            uid = entry.name.rsplit(".", 1)[0]
            if uid in busy:
                continue
            try:
                if entry.stat().st_mtime < limit:
                    os.unlink(entry.path)
                    gone.add(uid)
                    log.info("expired partial upload %s removed", entry.name)
            except FileNotFoundError:
                pass
        return gone

    def _scan(self) -> dict[str, Partial]:
        """At start (worker thread): the partial uploads on disk, by their description; a file without
        its partner (it could not be resumed) is removed."""
        found: dict[str, Partial] = {}
        names = {e.name for e in os.scandir(self.root)}
        for name in names:
            uid, _, ext = name.rpartition(".")
            other = f"{uid}.json" if ext == "part" else f"{uid}.part"
            path = self.root / name
            try:
                if ext not in ("part", "json") or other not in names:
                    path.unlink()
                    log.info("partial upload file %s without its %s removed", name, other.rpartition(".")[2])
                elif ext == "json":
                    meta = json.loads(path.read_text(encoding="utf-8"))
                    at = max(path.stat().st_mtime, (self.root / other).stat().st_mtime)
                    found[uid] = Partial(str(meta["user"]), int(meta["size"]), at)
            except FileNotFoundError:
                pass
            except (ValueError, KeyError, TypeError, OSError) as exc:
                log.warning("partial upload %s: unreadable description (%s): removed", uid, exc)
                for p in (self.root / f"{uid}.part", self.root / f"{uid}.json"):
                    p.unlink(missing_ok=True)
        return found

    def expires_at(self) -> str:
        ts = time.time() + self.config.upload_expiry_s
        return datetime.fromtimestamp(ts, timezone.utc).isoformat()

    def in_progress(self, user: str | None = None) -> int:
        """Uploads attached to a connection (``max_uploads`` counts these)."""
        return sum(1 for u in self._active.values() if user is None or u.user == user)

    def hold(self, uid: str, user: str, size: int, usage: int) -> Callable[[], None]:
        """Count an upload that is not this service's (a v2 upload, ``server.legacy_v2_files``) of
        ``size`` declared bytes, as a BEGIN counts its own: toward ``user``'s ``max_uploads_per_user``
        and ``user_quota_bytes`` (``usage``: their stored documents' bytes; the least recently touched
        detached partial uploads are dropped to make room) and the server's ``max_uploads``.
        QUOTA_EXCEEDED / SERVER_BUSY when it does not fit; else the function that releases it."""
        cfg = self.config
        victims = self._ledger.make_room(user, uid, size, usage, self._in_use(),
                                         cfg.max_uploads_per_user, cfg.user_quota_bytes)
        if self.in_progress() + self._ledger.held() >= cfg.max_uploads:
            raise HandlerError(ErrorCode.SERVER_BUSY, f"{cfg.max_uploads} uploads in progress on the server "
                                                      "(max_uploads); retry later")
        self._ledger.hold(uid, user, size)
        for victim in victims:
            self._drop(victim)
        return lambda: self._ledger.release(uid)

    def reserved(self, user: str) -> tuple[int, int]:
        """(count, declared bytes) of ``user``'s partial uploads, attached or not."""
        return self._ledger.reserved(user)

    def _drop(self, uid: str) -> asyncio.Task:
        """Drop a detached partial upload to make room (its files, its shared copy)."""
        self._ledger.release(uid)
        task = asyncio.get_running_loop().create_task(self._remove_files(uid))
        self._removing[uid] = task
        task.add_done_callback(lambda t: self._removing.pop(uid, None) if self._removing.get(uid) is t else None)
        log.info("partial upload %s dropped to make room for a newer upload of its user", uid)
        return task

    async def _remove_files(self, uid: str) -> None:
        await self._closed(uid)
        await asyncio.to_thread(self._unlink, uid)
        if self.sharing is not None:
            await self.sharing.drop(uid)

    def _unlink(self, uid: str) -> None:
        for path in (self.root / f"{uid}.part", self.root / f"{uid}.json"):
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    # -- BEGIN ---------------------------------------------------------------------------------------
    async def begin(self, port: Any, re: Any, user: str, collection: str, name: str, size: int, md5: str,
                    sha256: str | None, usage: Callable[[], int] | None = None) -> KbUploadReply:
        """Start or resume an upload; ``usage()``: the bytes of ``user``'s documents (for the quota), asked
        when the limits are checked (after the awaits, so an upload stored meanwhile is counted)."""
        uid = upload_id_of(user, collection, name, size, md5)
        self._ledger.forget(await asyncio.to_thread(self._sweep, self._busy()), self._in_use())
        if self.sharing is not None:
            await self.sharing.expire()
        while uid in self._ending:               # its KB_UPLOAD_END is storing that very file: not reopened
            await self._ended[uid].wait()        # under it; after it, a new upload (END: the stored document)
        up = self._active.get(uid)
        if up is not None:                       # resumed while the old connection still holds it
            await self._flush(up)
            self._detach(up)
        await self._closed(uid)                  # its file, closed by a connection that went away
        while uid in self._removing:             # dropped by another BEGIN just now: its files go first
            await asyncio.shield(self._removing[uid])
        cfg = self.config
        victims = self._ledger.make_room(user, uid, size, usage() if usage is not None else 0, self._in_use(),
                                         cfg.max_uploads_per_user, cfg.user_quota_bytes)
        if self.in_progress() + self._ledger.held() >= cfg.max_uploads:     # v2 uploads count too
            raise HandlerError(ErrorCode.SERVER_BUSY, f"{cfg.max_uploads} uploads in progress on the server "
                                                      "(max_uploads); retry later")
        up = Upload(uid, user, collection, name, size, md5.lower(), sha256, self.root / f"{uid}.part",
                    h_sha=hashlib.sha256() if sha256 else None)
        self._active[uid] = up                   # (reserved before the await: limits hold)
        before = self._ledger.reserve(uid, user, size)   # (a resume: what to restore if this BEGIN fails)
        dropping = [self._drop(v) for v in victims]
        try:
            if dropping:
                await asyncio.gather(*dropping)
            if self.sharing is not None:       # another node may have received more of it
                held = await asyncio.to_thread(self._held, up) or 0
                more = await self.sharing.missing(up, held)
                if more:
                    await asyncio.to_thread(self._append, up, held, more)
            await asyncio.to_thread(self._open, up)
            if self.sharing is not None:
                await self.sharing.share_local(up)
        except OSError as exc:
            self._unreserve(uid, before)
            raise HandlerError(ErrorCode.STORAGE_ERROR, f"cannot store the upload: {exc.strerror or exc}") from None
        except BaseException:
            self._unreserve(uid, before)
            raise
        self._handles = (self._handles + 1) & 0xFFFFFFFF
        up.port, up.handle, up.re = port, self._handles, re
        up.next_report = up.received + max(1, size // REPORT_STEPS)
        self._ports.setdefault(port, {})[up.handle] = up
        return KbUploadReply(uid, up.handle, up.received, size, MAX_DATA, self.expires_at())

    def _unreserve(self, uid: str, before: Partial | None) -> None:
        """A BEGIN failed: a resumed upload counts as the detached one it was, a new one not at all."""
        self._active.pop(uid, None)
        self._ledger.restore(uid, before)

    # -- the partial files -----------------------------------------------------------------------------
    def _held(self, up: Upload) -> int | None:
        """Bytes of the partial file this node holds (0 when it is longer than the upload), None when
        there is no partial upload (file and description) to continue (worker thread)."""
        meta = self.root / f"{up.upload_id}.json"
        if up.part.exists() and meta.exists():
            held = up.part.stat().st_size
            return held if held <= up.size else 0
        return None

    def _append(self, up: Upload, held: int, data: bytes) -> None:
        """Worker thread: the shared bytes after the first ``held`` of the partial file."""
        self.root.mkdir(parents=True, exist_ok=True)
        meta = self.root / f"{up.upload_id}.json"
        if not meta.exists():
            self._describe(up)
        with open(up.part, "r+b" if up.part.exists() else "wb") as f:
            f.truncate(held)
            f.seek(held)
            f.write(data)

    def _describe(self, up: Upload) -> None:
        (self.root / f"{up.upload_id}.json").write_text(json.dumps(
            {"user": up.user, "collection": up.collection, "name": up.name, "size": up.size, "md5": up.md5}),
            encoding="utf-8")

    def _open(self, up: Upload) -> None:
        """Worker thread: continue a partial file (re-hashing what it holds) or start one."""
        self.root.mkdir(parents=True, exist_ok=True)
        held = self._held(up)
        if held is not None:
            with open(up.part, "rb") as f:
                left = held
                while left:
                    block = f.read(min(HASH_BLOCK, left))
                    if not block:
                        break
                    up.h_md5.update(block)
                    if up.h_sha is not None:
                        up.h_sha.update(block)
                    left -= len(block)
            up.file = open(up.part, "r+b")
            up.file.truncate(held)
            up.file.seek(held)
            up.received = up.written = held
            os.utime(self.root / f"{up.upload_id}.json")
            return
        up.file = open(up.part, "wb")
        self._describe(up)

    # -- data frames ---------------------------------------------------------------------------------
    def on_data(self, port: Any, payload: bytes, flow: Flow) -> None:
        """One KB_UPLOAD_DATA frame of ``port`` (called by the connection, never awaits)."""
        try:
            handle, offset, chunk = decode_data(payload)
        except ProtocolError as exc:
            port.send_error(None, exc.code, exc.message)
            return
        up = self._ports.get(port, {}).get(handle)
        if up is None:
            port.send_error(None, ErrorCode.INVALID_MESSAGE, f"no upload with handle {handle} on this connection")
            return
        if up.failed is not None:               # nothing more is written: END answers STORAGE_ERROR
            if not up.reported_error:
                up.reported_error = True
                port.send_error(None, ErrorCode.STORAGE_ERROR, self._failure(up))
            return
        n = len(chunk)
        if offset != up.received or offset + n > up.size:
            if not up.reported_error:
                up.reported_error = True
                why = (f"{offset + n - up.size} bytes past the announced size" if offset == up.received
                       else f"offset {offset}, expected {up.received}")
                port.send_error(None, ErrorCode.INVALID_MESSAGE,
                                f"upload {up.upload_id}: data frame dropped ({why}); send KB_UPLOAD_BEGIN to resume")
            return
        up.buf.append(chunk)
        up.buffered += n
        up.received += n
        if up.buffered >= self.config.upload_buffer_bytes:   # (again if something resumed reading meanwhile)
            up.paused, up.flow = True, flow
            flow.pause_reading()
        if up.writer is None:
            up.writer = asyncio.get_running_loop().create_task(self._drain(up, up.file))

    async def _drain(self, up: Upload, f: Any) -> None:
        """Write what was received (all of it, even after a disconnect: a resume continues after it)."""
        try:
            while up.buf:
                parts, up.buf, up.buffered = up.buf, [], 0
                await asyncio.to_thread(self._write, up, f, parts)
                if self.sharing is not None:
                    await self.sharing.written(up, parts)
                if up.paused and up.buffered < self.config.upload_buffer_bytes // 2:
                    up.paused = False
                    up.flow.resume_reading()  # type: ignore[union-attr]
                if up.written >= up.next_report or not up.buf:   # every 2 %, and when caught up
                    up.next_report = up.written + max(1, up.size // REPORT_STEPS)
                    self._progress(up, up.re, "receiving", up.written, up.size)
        except OSError as exc:
            up.failed = exc.strerror or str(exc)
            up.buf, up.buffered = [], 0           # (what is still buffered is never written)
            if up.paused and up.flow is not None:
                up.paused = False
                up.flow.resume_reading()
            log.error("upload %s (%s of user %s): the disk refused a write after %d of %d bytes: %s",
                      up.upload_id, up.name, up.user, up.written, up.size, up.failed)
            if up.port is not None and not up.reported_error:
                up.reported_error = True
                up.port.send_error(None, ErrorCode.STORAGE_ERROR, self._failure(up))
        finally:
            up.writer = None

    @staticmethod
    def _failure(up: Upload) -> str:
        """What an upload whose write failed answers (a data frame once, and its KB_UPLOAD_END)."""
        return (f"upload {up.upload_id} ({up.name}): cannot store: the disk refused a write after {up.written} "
                f"of {up.size} bytes ({up.failed}); nothing more is accepted: free space on the server "
                "and upload again (it continues from the bytes kept)")

    @staticmethod
    def _write(up: Upload, f: Any, parts: list[memoryview]) -> None:
        for data in parts:
            f.write(data)
            up.h_md5.update(data)
            if up.h_sha is not None:
                up.h_sha.update(data)
            up.written += len(data)

    def _progress(self, up: Upload, re: Any, stage: str, done: int, total: int) -> None:
        port = up.port
        if port is not None:
            port.send(_PROGRESS, encode_reply(re, KbProgress(up.upload_id, stage, done, total)))

    async def _flush(self, up: Upload) -> None:
        while up.writer is not None:
            await asyncio.shield(up.writer)

    # -- END -----------------------------------------------------------------------------------------
    async def finish(self, port: Any, upload_id: str, slot: SlotWait | None = None) -> Upload:
        """Every byte written and verified: the upload, detached, its file closed. Raises
        INVALID_MESSAGE (bytes missing), CHECKSUM_MISMATCH (the partial upload is removed).

        ``slot`` (``KnowledgeBase.wait_for_ingest_slot``): then wait until the upload's user may start
        an ingest (``max_ingests_per_user``), so that an ``ingest`` called right after this returns is
        not refused for it: a complete upload is never refused for a passing condition. The wait
        holds no thread and no buffer, only the complete partial file, still counted toward the
        user's ``max_uploads_per_user`` and ``user_quota_bytes``. If the connection closes first
        (CONNECTION_CLOSED), the knowledge base closes (SHUTTING_DOWN) or the wait is cancelled, the
        partial upload is kept as if detached: BEGIN again answers offset = size, and END stores it."""
        up = self._active.get(upload_id)
        if up is None or up.port is not port:
            raise HandlerError(ErrorCode.NOT_FOUND, f"no upload {upload_id!r} in progress on this connection "
                                                    "(send KB_UPLOAD_BEGIN)")
        await self._flush(up)
        if up.failed is not None:                # the bytes written so far stay for a resume
            self._detach(up)
            raise HandlerError(ErrorCode.STORAGE_ERROR, self._failure(up))
        if up.written != up.size:
            raise HandlerError(ErrorCode.INVALID_MESSAGE,
                               f"{up.written} of {up.size} bytes received; continue from offset {up.written}")
        self._detach(up)
        self._ending.add(upload_id)              # (still counted until remove())
        self._ended[upload_id] = asyncio.Event()
        await self._closed(upload_id)
        md5 = up.h_md5.hexdigest()
        sha = up.h_sha.hexdigest() if up.h_sha is not None else None
        if md5 != up.md5 or sha != up.sha256:
            await self.remove(up)
            which = "md5" if md5 != up.md5 else "sha256"
            raise HandlerError(ErrorCode.CHECKSUM_MISMATCH,
                               f"the {which} of the received bytes does not match the announced one; nothing was kept")
        if slot is not None:
            try:
                ready = await self._wait_for_slot(port, up, slot)
            except BaseException:
                self.keep(up)
                raise
            if not ready:
                self.keep(up)
                raise HandlerError(ErrorCode.CONNECTION_CLOSED, f"upload {upload_id}: the connection closed while "
                                   "it waited to be stored; it is kept (KB_UPLOAD_BEGIN resumes it at its end)")
        return up

    async def _wait_for_slot(self, port: Any, up: Upload, slot: SlotWait) -> bool:
        """``slot(up.user, gone)``, ``gone`` done when ``port`` closes (``detach_port``)."""
        gone = asyncio.get_running_loop().create_future()
        if getattr(port, "closed", False):
            gone.set_result(None)
        waiting = self._leaving.setdefault(port, [])
        waiting.append(gone)
        try:
            return await slot(up.user, gone)
        finally:
            waiting.remove(gone)
            if not waiting and self._leaving.get(port) is waiting:
                del self._leaving[port]

    def keep(self, up: Upload) -> None:
        """An END that did not store its upload: the partial upload stays, detached (it counts toward its
        user's limits until resumed, dropped to make room or expired), and a BEGIN waiting for it goes on."""
        log.info("upload %s: not stored (its END gave up or failed for a passing reason); kept for a resume", up.upload_id)
        self._ledger.touch(up.upload_id)
        up.port = None
        if self.sharing is not None:           # the rest, for a resume through another node
            self.sharing.detached(up, None)
        self._ending.discard(up.upload_id)
        ended = self._ended.pop(up.upload_id, None)
        if ended is not None:
            ended.set()

    async def remove(self, up: Upload) -> None:
        """Delete a partial upload's files (and its shared copy)."""
        if self._active.get(up.upload_id) in (None, up):
            self._ledger.release(up.upload_id)
        try:
            await asyncio.to_thread(self._unlink, up.upload_id)
            if self.sharing is not None:
                await self.sharing.drop(up.upload_id)
        finally:                                 # a BEGIN waiting for this END goes on once its files are gone
            self._ending.discard(up.upload_id)
            ended = self._ended.pop(up.upload_id, None)
            if ended is not None:
                ended.set()

    def progress(self, up: Upload, re: Any):
        """A ``KnowledgeBase.ingest`` progress callback sending KB_PROGRESS (re = END's id)."""
        def report(stage: str, done: int, total: int) -> None:
            if stage != "receiving":              # (already reported as the bytes arrived)
                self._progress(up, re, stage, done, total)
        return report

    # -- connections ---------------------------------------------------------------------------------
    def _detach(self, up: Upload) -> None:
        """Free the upload's slot and handle; its bytes stay on disk for a resume (and count toward
        its user's limits until resumed, dropped to make room, ended or expired)."""
        if self._active.get(up.upload_id) is up:
            del self._active[up.upload_id]
            self._ledger.touch(up.upload_id)
        handles = self._ports.get(up.port)
        if handles is not None:
            handles.pop(up.handle, None)
            if not handles:
                del self._ports[up.port]
        if up.paused and up.flow is not None:
            up.paused = False
            up.flow.resume_reading()
        if up.file is not None:     # closed (flushed) off the loop, after the writer's last write
            f, up.file = up.file, None
            task = asyncio.get_running_loop().create_task(self._close_file(up.writer, f))
            self._closing[up.upload_id] = task
            task.add_done_callback(lambda t, uid=up.upload_id: self._closing.pop(uid, None)
                                   if self._closing.get(uid) is t else None)

    async def _close_file(self, writer: asyncio.Task | None, f: Any) -> None:
        if writer is not None:
            await asyncio.wait([writer])
        try:
            await asyncio.to_thread(f.close)
        except OSError as exc:      # (its buffer's last bytes refused: a resume re-reads what is there)
            log.warning("partial upload file %s: closing it failed: %s", getattr(f, "name", "?"), exc)

    async def _closed(self, upload_id: str) -> None:
        task = self._closing.pop(upload_id, None)
        if task is not None:
            await task

    def detach_port(self, port: Any) -> None:
        """The connection closed: its uploads stop (the partial files wait for a resume), and its END
        waiting to store one gives up (``finish``)."""
        for gone in self._leaving.get(port, ()):
            if not gone.done():
                gone.set_result(None)
        for up in list(self._ports.get(port, {}).values()):
            writer = up.writer
            self._detach(up)
            up.port = None
            if self.sharing is not None:       # the rest, for a resume through another node
                self.sharing.detached(up, writer)
        self._ports.pop(port, None)
