"""v2 file features (docs/protocol.md §7, docs/knowledge.md "v2 clients"): uploads and the UDP port.

Upload: ``FILE_METADATA`` JSON ``{"filename", "size"}``, then ``FILE_DATA`` frames (any piece size) until
``size`` bytes have arrived. The bytes go to a file under ``<storage root>/v2-uploads/`` (at most
``v2_upload_buffer_bytes`` are held in memory; writes run in a worker thread), then the knowledge base
ingests that file into the user's collection (off the loop) and the client gets ONE ``CHAT_TEXT``:
``文件上传成功: <filename> (ID: <doc_id>)`` (for bytes already stored under another name, followed by
``; the same content is already stored as "<stored name>": ...``: the document keeps its first name,
as with v3) or ``文件保存失败: <reason>``. A file that has arrived whole
is not refused because the user's ingests are all in progress (``max_ingests_per_user``): the
connection's request worker waits for one to end (given up if the connection closes). A refusal
known from the metadata alone (bad JSON, hostile name, unsupported type, over ``[knowledge]
max_upload_bytes``, ``user_quota_bytes`` or ``max_documents_per_collection``, the upload limits below)
is answered at once and the announced bytes that follow are swallowed silently. From its metadata to
its end (stored, refused, timed out, its connection closed, replaced by new metadata) an upload is
held in the upload ledger of the v3 uploads (``handlers.upload_ledger``, ``_hold``) by its declared
size: it counts toward user ``local``'s ``max_uploads_per_user`` and ``user_quota_bytes`` and the
server's ``max_uploads``, for v2 and v3 uploads alike, and one that does not fit is refused at its
metadata. The upload is complete when ``size`` bytes have arrived: bytes past them (a file that
grew while it was sent) are dropped, in the same frame or after it, until the next
``FILE_METADATA``, so the client still gets one reply per upload. An upload with no
``FILE_DATA`` for ``v2_upload_timeout_s`` is abandoned (its file removed; the client is told unless
it is closing). An upload whose connection closes before its last byte is discarded at once
(``connection_closed``: timer cancelled, file closed and removed, buffer freed): a v2 upload belongs
to its connection and cannot be resumed by another, so nothing of it is kept, and nothing of it
keeps the connection alive.
A ``FILE_DATA`` before any ``FILE_METADATA`` on the connection is answered once in text (once per
connection); after an upload, one with no upload open is that upload's excess: swallowed silently.
Names quoted in replies (``_shown``) are escaped (Python's repr) when they hold characters that do
not print (a tab, a zero-width space), as v3 errors quote client input.

``CLIENT_UDP_PORT`` JSON ``{"udp_port"}`` registers the connection with the offer service: downloads the
assistant offers go to (the TCP peer's address, that port). It is never answered (the deployed clients
read no reply); an invalid one is logged and ignored. A download runs only while the connection that
asked for it is open (``V2Files.closed`` / ``when_closed``, the ``TransferOwner`` of ``server.udp_transfer``,
ended by ``connection_closed`` from the connection's ``connection_lost``):
the deployed client keeps its TCP connection open during a download, so a closed one means nobody is
receiving (or someone announced a port that is not theirs and left). It sends nothing on that
connection meanwhile, so the download's ACK progress counts as the connection's activity
(``V2Files.note_activity``): ``idle_timeout_s`` does not cut a download that is still moving.
"""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import time
import weakref
from pathlib import Path
from typing import Any, BinaryIO, Callable, Protocol

import orjson

from protocol import ErrorCode, Message, MsgType
from server.auth import LOCAL_USER
from server.config import ServerConfig
from server.errors import HandlerError, failure_of
from server.knowledge.access import resolve
from server.knowledge.kb import KnowledgeBase
from server.knowledge.names import clean_name, name_key
from server.knowledge.parsers import kind_of
from server.services import Services

log = logging.getLogger("nplt.v2.files")

OK = "文件上传成功: {name} (ID: {doc_id})"
#: the same bytes were already stored under another name: the document keeps that name (as v3's
#: KB_UPLOAD does), so the user is told which name (or the id) downloads it
DUPLICATE = OK + '; the same content is already stored as "{stored}": download it by that name or its ID'
FAILED = "文件保存失败: {reason}"
ORPHAN_DATA = "FILE_DATA without FILE_METADATA: send the file's metadata (filename, size) first"
SHOWN_CHARS = 64          # a file name quoted in a reply is cut to this many characters


class _Host(Protocol):
    codec: Any
    conn_id: int
    last_rx: float                # loop time of the client's last message (the idle timeout's clock)

    @property
    def closing(self) -> bool: ...
    def write(self, data: bytes) -> None: ...


class V2FileAdapter(Protocol):
    """What these handlers use of ``server.legacy_v2.LegacyV2`` (also a hub subscriber)."""

    services: Services
    host: _Host
    streaming: bool

    def reply(self, text: str) -> None: ...



def incoming_dir(config: ServerConfig) -> Path:
    return Path(config.storage.root) / "v2-uploads"


async def clear_incoming(config: ServerConfig) -> None:
    """At start: remove uploads a previous run left unfinished."""
    await asyncio.to_thread(shutil.rmtree, incoming_dir(config), True)


class _Upload:
    """One v2 upload in progress: where its bytes go and how many are still to come."""

    def __init__(self, name: str, size: int, path: Path | None, f: BinaryIO | None,
                 release: Callable[[], None] | None = None) -> None:
        self.name = name
        self.size = size
        self.path = path              # None: refused at the metadata, the bytes are swallowed
        self.file = f
        self.release = release        # gives back its place in the upload ledger (``_hold``), once
        self.received = 0
        self.buffer = bytearray()
        self.last = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None
        self.io = asyncio.Lock()      # a discard waits for a write in progress (a close may come mid-write)

    async def flush(self) -> None:
        async with self.io:
            if self.buffer and self.file is not None:
                data, self.buffer = bytes(self.buffer), bytearray()
                await asyncio.to_thread(self.file.write, data)

    def unhold(self) -> None:
        """It no longer counts toward the upload limits (it ended, one way or another)."""
        release, self.release = self.release, None
        if release is not None:
            release()

    async def discard(self) -> None:
        self.unhold()
        if self.timer is not None:
            self.timer.cancel()       # (a cancelled handle drops its callback: the closure goes now)
            self.timer = None
        self.buffer = bytearray()
        async with self.io:
            f, path, self.file, self.path = self.file, self.path, None, None
            if f is not None or path is not None:
                await asyncio.to_thread(_remove, f, path)


def _remove(f: BinaryIO | None, path: Path | None) -> None:
    if f is not None:
        f.close()
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _create(directory: Path) -> tuple[Path, BinaryIO]:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"v2-{secrets.token_hex(12)}.part"
    return path, open(path, "xb")


class V2Files:
    """The file state of one v2 connection; also its ``V2OfferTarget`` for the offer service."""

    def __init__(self, v2: V2FileAdapter) -> None:
        self._v2 = weakref.ref(v2)
        self.udp_port: int | None = None
        self.upload: _Upload | None = None
        self.uploaded = False         # a FILE_METADATA came: FILE_DATA with no upload open is its excess
        self.orphan_reported = False
        self._on_close: list[Callable[[], None]] = []      # (when_closed; run by ``connection_closed``)

    # -- V2OfferTarget -------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        v2 = self._v2()
        return v2 is None or v2.host.closing

    def _sockaddr(self, which: str) -> str | None:
        v2 = self._v2()
        transport = getattr(v2.host, "transport", None) if v2 is not None else None
        addr = transport.get_extra_info(which) if transport is not None else None
        return addr[0] if isinstance(addr, tuple) else None

    def udp_address(self) -> tuple[str, int] | None:
        peer = self._sockaddr("peername")
        return (peer, self.udp_port) if peer is not None and self.udp_port is not None else None

    def local_host(self) -> str | None:
        return self._sockaddr("sockname")

    def when_closed(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` once the connection closes (soon, if it has); returns: unregister."""
        if self.closed:
            return asyncio.get_running_loop().call_soon(callback).cancel
        self._on_close.append(callback)
        return lambda: self._on_close.remove(callback) if callback in self._on_close else None

    def note_activity(self) -> None:
        """A download this connection asked for moved (an ACK over UDP): the client is there and
        busy receiving, so this counts as a message from it for the idle timeout."""
        v2 = self._v2()
        if v2 is not None and not v2.host.closing:
            v2.host.last_rx = asyncio.get_running_loop().time()

    def send_offer(self, payload: bytes) -> None:
        v2 = self._v2()
        if v2 is not None and not v2.host.closing:
            v2.host.write(v2.host.codec.send(MsgType.DOWNLOAD_OFFER, payload))


_STATE: weakref.WeakKeyDictionary[V2FileAdapter, V2Files] = weakref.WeakKeyDictionary()


def connection_closed(v2: V2FileAdapter) -> None:
    """The connection is gone (``LegacyV2.abort``, from ``connection_lost``): what waits for it ends,
    and an upload still receiving is discarded now (nobody can send the rest). A complete upload is
    no longer ``state.upload``: ``_finish`` gives it up itself if it waits for an ingest slot."""
    state = _STATE.get(v2)
    if state is not None:
        waiting, state._on_close = state._on_close, []
        for callback in waiting:
            callback()
        upload, state.upload = state.upload, None
        if upload is not None:
            _discard_soon(upload)


def files_of(v2: V2FileAdapter) -> V2Files:
    state = _STATE.get(v2)
    if state is None:
        state = _STATE[v2] = V2Files(v2)
    return state


# -- CLIENT_UDP_PORT ---------------------------------------------------------------------------------
async def client_udp_port(v2: V2FileAdapter, ev: Message) -> None:
    try:
        body = orjson.loads(ev.body)
        port = body["udp_port"]
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(port)
    except (orjson.JSONDecodeError, TypeError, KeyError, ValueError):
        log.info("v2 connection %s: ignored CLIENT_UDP_PORT %r (expected JSON {\"udp_port\": 1..65535})",
                 v2.host.conn_id, bytes(ev.body[:64]))
        return
    state = files_of(v2)
    state.udp_port = port
    if v2.services.offers is not None:
        v2.services.offers.register_v2(v2, state)


# -- upload ------------------------------------------------------------------------------------------
def _metadata(body: bytes) -> tuple[str, int]:
    """(filename, size) of a FILE_METADATA, or ValueError with the reason."""
    try:
        meta = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ValueError("FILE_METADATA is not JSON {\"filename\", \"size\"}") from None
    if not isinstance(meta, dict):
        raise ValueError("FILE_METADATA is not a JSON object {\"filename\", \"size\"}")
    name, size = meta.get("filename"), meta.get("size")
    if not isinstance(name, str) or not name:
        raise ValueError("field 'filename': expected a non-empty string")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError("field 'size': expected a non-negative integer")
    return name, size


async def file_metadata(v2: V2FileAdapter, ev: Message) -> None:
    state = files_of(v2)
    state.uploaded = True
    if state.upload is not None:   # a new upload replaces one that never finished
        old, state.upload = state.upload, None
        answered = old.path is None        # refused at its metadata: answered then
        await old.discard()
        if not answered:
            v2.reply(FAILED.format(reason=f"{_shown(old.name)}: a new upload started after {old.received} of "
                                          f"{old.size} bytes"))
    try:
        name, size = _metadata(ev.body)
    except ValueError as exc:
        v2.reply(FAILED.format(reason=str(exc)))
        return
    try:
        name = clean_name(name)
        kind_of(name)
        kb = v2.services.knowledge
        limit = kb.config.max_upload_bytes
        if size > limit:
            raise HandlerError(ErrorCode.QUOTA_EXCEEDED, f"{size} bytes is over the upload limit ({limit} bytes)")
        kb.check_quota(LOCAL_USER, resolve(LOCAL_USER, (), None), size)   # (the user's quota, the collection's size)
        release = _hold(v2.services, size)       # (with the uploads in progress, v3's included)
        try:
            path, f = await asyncio.to_thread(_create, incoming_dir(v2.services.config))
        except BaseException:
            if release is not None:
                release()
            raise
    except Exception as exc:
        err = failure_of(exc)
        if err is None:
            log.exception("v2 upload of %r failed on connection %s", name, v2.host.conn_id)
            err = HandlerError(ErrorCode.INTERNAL, "internal error")
        v2.reply(FAILED.format(reason=f"{_shown(name)}: {err.message}"))
        upload = _Upload(name, size, None, None)   # swallow the bytes announced
    else:
        upload = _Upload(name, size, path, f, release)
    if size == 0:                      # nothing to wait for
        if upload.path is not None:
            await _finish(v2, state, upload)
        return
    if state.closed:                   # the client left while the file was being created
        await upload.discard()
        return
    state.upload = upload
    _arm(v2, state, upload)


async def file_data(v2: V2FileAdapter, ev: Message) -> None:
    state = files_of(v2)
    upload = state.upload
    if upload is None:
        # After an upload (ended: stored, refused, timed out) the client may send more than its
        # ``size`` (a file that grew while it was sent): those bytes are the excess of the upload
        # already answered, swallowed without a reply so the client stays in step (one reply per
        # upload). Only FILE_DATA before any FILE_METADATA is answered, once per connection.
        if not state.uploaded and not state.orphan_reported:
            state.orphan_reported = True
            v2.reply(FAILED.format(reason=ORPHAN_DATA))
        return
    data = ev.body
    upload.last = time.monotonic()
    room = upload.size - upload.received
    if len(data) > room:     # the file grew after its metadata: its first ``size`` bytes are the upload
        log.info("v2 connection %s: %s: %d bytes past the %d announced are dropped", v2.host.conn_id,
                 upload.name, len(data) - room, upload.size)
        data = data[:room]
    upload.received += len(data)
    if upload.path is None:             # refused at the metadata: swallow
        if upload.received == upload.size:
            state.upload = None
            await upload.discard()
        return
    upload.buffer += data
    try:
        if len(upload.buffer) >= v2.services.config.transfer.v2_upload_buffer_bytes:
            await upload.flush()
    except OSError as exc:
        state.upload = None
        await upload.discard()
        v2.reply(FAILED.format(reason=f"{_shown(upload.name)}: cannot write: {exc.strerror or exc}"))
        return
    if state.upload is not upload:     # discarded during the write: the connection closed
        return
    if upload.received == upload.size:
        await _finish(v2, state, upload)


async def _finish(v2: V2FileAdapter, state: V2Files, upload: _Upload) -> None:
    """All bytes are in: ingest the file, answer once, remove the temporary file.

    The user's ingests in progress (``max_ingests_per_user``: every v2 connection is user ``local``)
    are a passing limit: the connection's request worker waits for one to end rather than refuse a
    file that has arrived whole (the deployed client says "upload complete" whatever it is told). A
    connection that closes meanwhile gives its file up: nobody is left to tell."""
    state.upload = None
    if upload.timer is not None:
        upload.timer.cancel()
    kb = v2.services.knowledge
    try:
        await upload.flush()
        f, upload.file = upload.file, None
        if f is not None:
            await asyncio.to_thread(f.close)
        if not await _ingest_slot(kb, state):
            log.info("v2 connection %s closed while its upload of %r waited for an ingest slot; dropped",
                     v2.host.conn_id, upload.name)
            return                         # (the file is removed below)
        info = await kb.ingest(LOCAL_USER, (), None, upload.name, upload.path)   # (at once: the slot is free)
    except Exception as exc:
        err = failure_of(exc)
        if err is None:
            log.exception("v2 upload of %r failed on connection %s", upload.name, v2.host.conn_id)
            err = HandlerError(ErrorCode.INTERNAL, "internal error")
        text = FAILED.format(reason=f"{_shown(upload.name)}: {err.message}")
    else:
        log.info("v2 connection %s uploaded %s (%d bytes) as %s%s", v2.host.conn_id, info.name, info.size,
                 info.doc_id, " (duplicate)" if info.duplicate else "")
        if info.duplicate and name_key(info.name) != name_key(upload.name):
            text = DUPLICATE.format(name=upload.name, doc_id=info.doc_id, stored=info.name)
        else:
            text = OK.format(name=info.name, doc_id=info.doc_id)
    finally:
        await upload.discard()             # the temporary file goes before the answer
    v2.reply(text)


async def _ingest_slot(kb: KnowledgeBase, state: V2Files) -> bool:
    """Wait until user ``local`` may start an ingest; False if the connection closed first."""
    gone = asyncio.get_running_loop().create_future()
    unregister = state.when_closed(lambda: None if gone.done() else gone.set_result(None))
    try:
        return await kb.wait_for_ingest_slot(LOCAL_USER, gone)
    finally:
        unregister()


def _arm(v2: V2FileAdapter, state: V2Files, upload: _Upload) -> None:
    timeout = v2.services.config.transfer.v2_upload_timeout_s
    loop = asyncio.get_running_loop()

    def check() -> None:
        if state.upload is not upload:
            return
        idle = time.monotonic() - upload.last
        if idle < timeout or (v2.streaming and not v2.host.closing):   # never inside an answer
            upload.timer = loop.call_later(max(timeout - idle, 0.01), check)
            return
        state.upload = None
        closing = v2.host.closing
        if not closing and upload.path is not None:
            v2.reply(FAILED.format(reason=f"{_shown(upload.name)}: upload timed out after {timeout:g} s without "
                                          f"data ({upload.received} of {upload.size} bytes arrived)"))
        _discard_soon(upload)

    upload.timer = loop.call_later(timeout, check)


_CLEANUPS: set[asyncio.Task] = set()


def _discard_soon(upload: _Upload) -> None:
    """Discard ``upload`` in a task of its own (from a callback: the timer, ``connection_lost``); it
    stops counting toward the upload limits at once."""
    upload.unhold()
    task = asyncio.get_running_loop().create_task(upload.discard())
    _CLEANUPS.add(task)
    task.add_done_callback(_CLEANUPS.discard)


def _shown(name: Any) -> str:
    """A file name as a reply quotes it: cut to ``SHOWN_CHARS``; one that holds characters that do
    not print (a tab, a zero-width space, a bidirectional control: what the metadata check refuses)
    in Python's repr, as v3 errors quote client input, so they show escaped instead of passing unseen."""
    text = str(name)
    text = text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 1] + "…"
    return text if text.isprintable() else repr(text)


def _hold(services: Services, size: int) -> Callable[[], None] | None:
    """Count a new v2 upload of ``size`` declared bytes in the upload ledger of the v3 uploads
    (``handlers.upload_ledger``), as a v3 BEGIN does: toward user ``local``'s ``max_uploads_per_user``
    and ``user_quota_bytes`` (its documents, and every upload in progress, v2 or v3, by declared size;
    its least recently touched detached v3 uploads are dropped to make room, as for a BEGIN) and the
    server's ``max_uploads``. QUOTA_EXCEEDED / SERVER_BUSY when it does not fit; else the function
    that releases it (``_Upload.unhold``, on every end). None without an upload service."""
    uploads = services.uploads
    if uploads is None:
        return None
    return uploads.hold(f"v2-{secrets.token_hex(12)}", LOCAL_USER, size, services.knowledge.usage(LOCAL_USER))
