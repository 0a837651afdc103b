"""Knowledge-base transfers over a ``Client`` (docs/protocol.md §5.8): resumable upload, resumable
download, and the whole document list (KB_LIST pages).

Several transfers may run at once on one client: each message type's tap (``client.taps``) is a
``SharedTap`` that hands a message to the transfer it belongs to (a data frame by its handle,
``KB_PROGRESS`` by its upload id), so one transfer never takes another's bytes.

``upload`` hashes the file (md5 + sha256, in a worker thread), sends KB_UPLOAD_BEGIN, streams the
bytes from the offset the server reports as binary data frames, then KB_UPLOAD_END; when the
connection drops it waits for the client's reconnect and begins again, and the server continues
from what it kept. ``download`` writes to ``<dest>.part`` and resumes from its size when the sidecar
``<dest>.part.json`` names the same document (a ``.part`` of another document, or of unknown origin,
is started over from 0), then checks the md5 of the whole file before renaming it to ``dest`` (an
existing folder ``dest`` means the document's name in it, as for ``cp``). A ``dest`` that is not a
regular file is written through, never renamed over (as ``curl -o`` does): a symlink's target gets
the bytes (its ``.part`` next to the target), and a FIFO, a device or a file descriptor's alias
(``/dev/stdout``, ``/dev/fd/N``) gets them streamed in order (no ``.part``; the md5 is checked at the end).
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import itertools
import json
import logging
import os
import stat
from os.path import abspath, dirname, join, normpath
from pathlib import Path
from typing import Any, Callable, Iterator

from protocol import ErrorCode, MsgType
from protocol.binary import decode_data
from protocol.kb import KbDocument, KbProgress
from protocol.replies import ErrorReply

from client import errors
from client.errors import ClientCode, ClientError

BLOCK = 1 << 20                   # read from the file (in a worker thread) this much at a time
RETRYABLE = frozenset({errors.CONNECTION_LOST, errors.NOT_CONNECTED})
SEPARATORS = tuple(filter(None, (os.sep, os.altsep)))   # a destination ending in one means a folder
#: paths that name another open file (a descriptor's alias): written through, never created or renamed over
FD_ALIAS_DIRS = ("/proc/", "/dev/fd/")
FD_ALIASES = frozenset({"/dev/stdout", "/dev/stderr", "/dev/stdin"})
MAX_LINK_HOPS = 40                                # a longer symlink chain is a loop (as the kernel's ELOOP)
#: how often a download into a FIFO that has no reader yet looks for one (``open_stream``)
FIFO_READER_POLL_S = 0.05
Progress = Callable[[str, int, int], None]        # (stage, done, total)
_handles = itertools.count(1)
log = logging.getLogger("nplt.client")


class SharedTap:
    """The tap of one message type (``client.taps``) that the transfers running on a client share:
    each message goes to the first transfer whose callback takes it (returns something other than
    False), so two downloads (or uploads) at once never take each other's messages."""

    def __init__(self) -> None:
        self.transfers: list[Callable[[Any], Any]] = []

    def __call__(self, message: Any) -> bool:
        return any(take(message) is not False for take in list(self.transfers))


@contextlib.contextmanager
def _tapped(client: Any, msg_type: MsgType, take: Callable[[Any], Any]) -> Iterator[None]:
    """While the block runs, ``take`` is offered every message of ``msg_type`` (it returns False for
    one that is not its own)."""
    shared = client.taps.get(msg_type)
    if not isinstance(shared, SharedTap):
        shared = SharedTap()
        client.taps[msg_type] = shared
    shared.transfers.append(take)
    try:
        yield
    finally:
        shared.transfers.remove(take)
        if not shared.transfers and client.taps.get(msg_type) is shared:
            del client.taps[msg_type]


def file_digests(path: Path) -> tuple[str, str, int]:
    """(md5, sha256, size) of a file (blocking: run it in a thread)."""
    md5, sha = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            md5.update(block), sha.update(block)
            size += len(block)
    return md5.hexdigest(), sha.hexdigest(), size


async def list_documents(client: Any, collection: str | None = None) -> list[KbDocument]:
    """Every document the user can see (in ``collection``), newest first: KB_LIST pages asked until
    ``has_more`` is false (a server answers as many as fit in one message; an older one, all at once)."""
    body: dict[str, Any] = {} if collection is None else {"collection": collection}
    docs: list[KbDocument] = []
    while True:
        page = await client.request(MsgType.KB_LIST, body)
        docs.extend(page.documents)
        if not page.has_more or not page.next_before:
            return docs
        body = {**body, "before": page.next_before}


async def upload(client: Any, path: str | os.PathLike, *, collection: str | None = None,
                 progress: Progress | None = None, retries: int = 5, reconnect_timeout: float = 30.0,
                 end_timeout: float = 600.0, name: str | None = None) -> KbDocument:
    """Upload one file; returns the stored document (``duplicate`` when the bytes were already there).
    Server refusals raise ClientError with the server's code (UNSUPPORTED_MEDIA, QUOTA_EXCEEDED, ...).
    When the server refuses the bytes while they are sent (STORAGE_ERROR: its disk is full), the
    rest is not sent: END is sent at once and raises that STORAGE_ERROR with its cause."""
    path = Path(path)
    md5, sha, size = await asyncio.to_thread(file_digests, path)
    body: dict[str, Any] = {"name": name or path.name, "size": size, "md5": md5, "sha256": sha}
    if collection:
        body["collection"] = collection
    attempt = 0
    while True:
        try:
            return await _upload_once(client, path, body, progress, end_timeout)
        except ClientError as exc:
            attempt += 1
            if exc.code not in RETRYABLE or attempt > retries or not client.reconnect_enabled:
                raise
            await client.wait_connected(reconnect_timeout)


async def _upload_once(client: Any, path: Path, body: dict[str, Any], progress: Progress | None,
                       end_timeout: float) -> KbDocument:
    begin = await client.request(MsgType.KB_UPLOAD_BEGIN, dict(body))
    upload_id, handle, offset, step = begin.upload_id, begin.handle, begin.offset, begin.chunk_size

    def on_progress(ev: KbProgress) -> bool:
        if ev.upload_id != upload_id:
            return False
        if progress is not None:
            try:       # runs in the link's reader task: a failing display must not end the connection
                progress(ev.stage, ev.done, ev.total)
            except Exception:  # noqa: BLE001
                log.exception("kb upload progress callback failed")
        return True

    refused: list[ErrorReply] = []

    def on_error(err: ErrorReply) -> bool:
        """The server's refusal of this upload's bytes (a full disk, say: ERROR with ``re`` null,
        ``upload <id> (...): cannot store ...``): stop sending them, END answers the cause."""
        if err.code != ErrorCode.STORAGE_ERROR or f"upload {upload_id} " not in err.message:
            return False
        refused.append(err)
        return True

    with _tapped(client, MsgType.KB_PROGRESS, on_progress), _tapped(client, MsgType.ERROR, on_error):
        with open(path, "rb") as f:
            await asyncio.to_thread(f.seek, offset)
            while offset < body["size"] and not refused:
                block = await asyncio.to_thread(f.read, min(BLOCK - BLOCK % step, body["size"] - offset))
                if not block:
                    raise ClientError(ClientCode.FILE_CHANGED, "the file shrank while it was uploaded")
                await client.send_data(MsgType.KB_UPLOAD_DATA, handle, offset, block)
                offset += len(block)
        reply = await client.request(MsgType.KB_UPLOAD_END, {"upload_id": upload_id}, timeout=end_timeout)
        return reply.document


async def download(client: Any, doc_id: str, dest: str | os.PathLike, *, progress: Progress | None = None,
                   retries: int = 5, reconnect_timeout: float = 30.0, timeout: float = 600.0,
                   replace_part: bool = False) -> KbDocument:
    """Download a document to ``dest`` (an existing folder: the document's name in it, as for ``cp``;
    a folder of that name there, or a ``dest`` ending in a separator that is not an existing folder,
    is WRITE_FAILED before any byte is fetched); returns the document.
    The bytes go to ``<dest>.part``, which a later call resumes only when its sidecar
    ``<dest>.part.json`` names this document (document ids are never reused for other bytes); one of
    another document's download is started over from 0, and a ``.part`` without a sidecar (not a
    download's: the user's own file?) is refused with FILE_EXISTS unless ``replace_part``. A resumed
    part that turns out not to be the start of the document (the server refuses its size as an
    offset, or the whole file fails the md5 check) is started over once, at once. ClientError
    CHECKSUM_MISMATCH if the bytes of a download from 0 do not hash to the document's md5 (the part
    file is removed). A local write failure (an OSError: a full disk, a folder that cannot be
    written) removes the part and its sidecar too, and is raised. Several downloads may run at once
    on one client (``SharedTap``), into different files.

    A ``dest`` that exists and is not a regular file is never replaced: a symlink is followed (the
    bytes, and the ``.part``, go to its target, and the link stays); a FIFO, a character or block
    device, or an alias of an open descriptor (``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N``)
    gets the bytes written into it in order (``_stream``: no ``.part``, nothing resumed from an
    earlier run), and their md5 is checked once all are written (CHECKSUM_MISMATCH then says the
    bytes were already written)."""
    dest = await _destination(client, doc_id, dest)
    dest, direct, fd = await asyncio.to_thread(write_target, dest)
    if direct:
        return await _stream(client, doc_id, dest, fd, progress, retries, reconnect_timeout, timeout)
    part = dest.with_name(dest.name + ".part")
    try:
        resumed = await asyncio.to_thread(_claim_part, part, doc_id, replace_part)
        try:
            try:
                doc = await _fetch(client, doc_id, part, progress, retries, reconnect_timeout, timeout)
            except ClientError as exc:
                if not resumed or exc.code not in (ErrorCode.INVALID_MESSAGE, ErrorCode.CHECKSUM_MISMATCH):
                    raise
                await asyncio.to_thread(_restart_part, part, doc_id)     # not this document's start: from 0
                doc = await _fetch(client, doc_id, part, progress, retries, reconnect_timeout, timeout)
        except ClientError:
            await asyncio.to_thread(_drop_if_empty, part)     # NOT_FOUND, say: nothing left to resume
            raise
        await asyncio.to_thread(os.replace, part, dest)
        await asyncio.to_thread(_sidecar(part).unlink, missing_ok=True)
    except OSError:
        await asyncio.to_thread(_drop_part, part)     # nothing of a download that cannot be written is left
        raise
    return doc


def target(dest: str | os.PathLike, doc: KbDocument) -> Path:
    """Where ``download`` writes ``doc`` when asked for ``dest``: ``dest``, or for an existing folder
    the document's name in it (its base name, never a path from the server), as ``cp`` does
    (blocking: it looks at the file system)."""
    dest = Path(dest)
    return dest / (Path(doc.name).name or doc.doc_id) if dest.is_dir() else dest


async def _destination(client: Any, doc_id: str, raw: str | os.PathLike) -> Path:
    """``target`` for document ``doc_id`` (its name is looked up only for a folder). A target that
    is a folder, or a ``raw`` name ending in a separator (a folder meant) that is no existing folder,
    is refused (WRITE_FAILED) before any byte is fetched, as ``cp`` does."""
    dest = Path(raw)
    is_dir = await asyncio.to_thread(dest.is_dir)
    if not is_dir and str(raw).endswith(SEPARATORS):
        raise ClientError(ClientCode.WRITE_FAILED, f"cannot write {raw}: not a folder")
    if is_dir:
        doc = next((d for d in await list_documents(client) if d.doc_id == doc_id), None)
        if doc is None:
            raise ClientError(ErrorCode.NOT_FOUND, f"no document with the id {doc_id!r} (see 'kb list')")
        dest = await asyncio.to_thread(target, dest, doc)
        if await asyncio.to_thread(dest.is_dir):
            raise ClientError(ClientCode.WRITE_FAILED, f"cannot write {dest}: it is a folder")
    return dest


def _fd_alias(path: str) -> bool:
    """Whether ``path`` (absolute, normalised) names an open descriptor rather than a file of its own."""
    return path in FD_ALIASES or path.startswith(FD_ALIAS_DIRS)


def _own_descriptor(path: str) -> int | None:
    """The descriptor of this process that an alias names (``/dev/stdout``: 1, ``/dev/fd/N``,
    ``/proc/self/fd/N``: N), or None."""
    named = {"/dev/stdin": "0", "/dev/stdout": "1", "/dev/stderr": "2"}.get(path)
    if named is None:
        head, _, n = path.rpartition("/")
        if head in ("/dev/fd", "/proc/self/fd", "/proc/thread-self/fd", f"/proc/{os.getpid()}/fd"):
            named = n
    return int(named) if named is not None and named.isdigit() and named.isascii() else None


def write_target(dest: Path) -> tuple[Path, bool, int | None]:
    """(where the bytes go, whether they are streamed into it directly, this process's descriptor
    it names) for ``dest`` (blocking: it looks at the file system). An existing ``dest`` that is not
    a regular file (a FIFO, a device), or a descriptor's alias (``/dev/stdout``, or a symlink chain
    through ``/proc/``), is written directly; a symlink to a regular file, or to nothing yet, is
    resolved to its target, so the rename at the end replaces the target, not the link."""
    start = hop = normpath(abspath(dest))
    for _ in range(MAX_LINK_HOPS):
        if _fd_alias(hop):
            return dest, True, _own_descriptor(hop)
        if not Path(hop).is_symlink():
            break
        hop = normpath(join(dirname(hop), Path(hop).readlink()))
    else:
        raise OSError(f"{dest}: too many levels of symbolic links")
    try:
        mode: int | None = dest.stat().st_mode                  # (follows symlinks)
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        return dest, True, None
    if hop != start:                                       # a symlink: its target is the file
        return dest.resolve(), False, None
    return dest, False, None


def streams_into(dest: str | Path) -> bool:
    """Whether a download to ``dest`` is streamed into it (a FIFO, a device, ``/dev/stdout``...) rather
    than written to a file of its own (blocking: it looks at the file system)."""
    return write_target(Path(dest))[1]


def own_descriptor(dest: str | Path) -> int | None:
    """The descriptor of this process that a download to ``dest`` is written into (``/dev/stdout``:
    1; ``/dev/fd/N``, ``/proc/self/fd/N``, or a symlink to one: N), or None (blocking: it looks at the
    file system)."""
    return write_target(Path(dest))[2]


def _try_open_stream(dest: Path, fd: int | None) -> Any:
    """``dest`` opened for a streamed download, or None for a FIFO that has no reader yet (blocking,
    briefly). One of this process's descriptors (``/dev/stdout``) is duplicated, so the bytes go
    where it points and at its offset: a shell's ``> file`` gets them in order with whatever the
    program writes to it next (reopening the alias would start at offset 0 and be overwritten).
    Anything else is opened to append, without blocking: opening a FIFO waits for its reader, and a
    worker thread blocked in that open could not be cancelled (Ctrl+C, SIGTERM, ``timeout`` would
    not stop the download), so ``open_stream`` asks again until the reader comes (ENXIO until
    then). The descriptor is made blocking again for the writes."""
    if fd is not None:
        return open(os.dup(fd), "wb")
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        raw = os.open(dest, flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ENXIO and stat.S_ISFIFO(os.stat(dest).st_mode):
            return None                                    # (another ENXIO, a socket's alias say, is raised)
        raise
    try:
        os.set_blocking(raw, True)
        return open(raw, "wb")
    except BaseException:
        os.close(raw)
        raise


async def open_stream(dest: Path, fd: int | None) -> Any:
    """``_try_open_stream``, asked every ``FIFO_READER_POLL_S`` until a FIFO's reader comes (as
    ``curl -o FIFO`` waits for it), cancellable meanwhile."""
    while (f := await asyncio.to_thread(_try_open_stream, dest, fd)) is None:
        await asyncio.sleep(FIFO_READER_POLL_S)
    return f


async def _stream(client: Any, doc_id: str, dest: Path, fd: int | None, progress: Progress | None, retries: int,
                  reconnect_timeout: float, timeout: float) -> KbDocument:
    """Write the document into ``dest`` (a FIFO, a device, a descriptor's alias) as it arrives, in
    order, never renamed. A dropped connection continues from the bytes already written. The md5 is
    checked at the end, after the fact."""
    f = await open_stream(dest, fd)
    md5 = hashlib.md5(usedforsecurity=False)
    written = [0]

    def write(data: bytes) -> None:
        f.write(data)
        md5.update(data)
        written[0] += len(data)

    try:
        doc = await _retrying(client, lambda: _download_once(client, doc_id, written[0], write, progress, timeout),
                              retries, reconnect_timeout)
        await asyncio.to_thread(f.close)           # (flushes: a FIFO whose reader left fails here)
    except asyncio.CancelledError:
        # not waited for: a write into a reader that stopped reading blocks the close too (the file's
        # lock), and a cancelled download (Ctrl+C, SIGTERM) must not wait for that reader
        asyncio.get_running_loop().run_in_executor(None, _close_quietly, f)
        raise
    except BaseException:
        await asyncio.to_thread(_close_quietly, f)
        raise
    if md5.hexdigest() != doc.md5:
        raise ClientError(ErrorCode.CHECKSUM_MISMATCH, f"the bytes written to {dest} hash to {md5.hexdigest()}, "
                          f"not {doc.md5}: they were streamed into it and cannot be taken back")
    return doc


def _close_quietly(f: Any) -> None:
    """Close ``f``, ignoring a failing flush (blocking: run it in a thread)."""
    with contextlib.suppress(OSError, ValueError):
        f.close()


async def _retrying(client: Any, attempt: Callable[[], Any], retries: int, reconnect_timeout: float) -> Any:
    """``await attempt()``, again after the client reconnects when the connection was lost (at most
    ``retries`` times)."""
    tries = 0
    while True:
        try:
            return await attempt()
        except ClientError as exc:
            tries += 1
            if exc.code not in RETRYABLE or tries > retries or not client.reconnect_enabled:
                raise
            await client.wait_connected(reconnect_timeout)


def _sidecar(part: Path) -> Path:
    """``<dest>.part.json``: ``{"doc_id"}`` of the document whose first bytes ``part`` holds."""
    return part.with_name(part.name + ".json")


def _claim_part(part: Path, doc_id: str, replace: bool) -> bool:
    """Whether ``part`` holds the start of document ``doc_id`` (its sidecar names it): then the
    download resumes from its size. A ``part`` of another document's download is removed and the
    sidecar written for ``doc_id``; a ``part`` (or sidecar) that is no download's is FILE_EXISTS
    unless ``replace`` (blocking: run it in a thread)."""
    owner: object = None
    try:
        owner = json.loads(_sidecar(part).read_text(encoding="utf-8"))["doc_id"]
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError):
        owner = False                                     # a sidecar that is not ours
    if owner == doc_id and part.is_file():
        return True
    if not replace and (owner is False or (owner is None and part.exists())):
        raise ClientError(ClientCode.FILE_EXISTS, f"{part} exists and is not a download of this document: "
                          "remove it first (kb download --force replaces it)")
    _restart_part(part, doc_id)
    return False


def _restart_part(part: Path, doc_id: str) -> None:
    """Start ``part`` over for ``doc_id``: no bytes yet, and the sidecar naming the document."""
    part.unlink(missing_ok=True)
    _sidecar(part).write_text(json.dumps({"doc_id": doc_id}), encoding="utf-8")


def _drop_part(part: Path) -> None:
    """Remove ``part`` and its sidecar, as far as possible (blocking: run it in a thread)."""
    for path in (part, _sidecar(part)):
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:   # (a folder of that name, say: not ours to remove)
            log.debug("cannot remove %s: %s", path, exc)


def _drop_if_empty(part: Path) -> None:
    """Remove ``part`` and its sidecar when no byte was received (blocking: run it in a thread)."""
    if not part.is_file() or part.stat().st_size == 0:
        part.unlink(missing_ok=True)
        _sidecar(part).unlink(missing_ok=True)


async def _fetch(client: Any, doc_id: str, part: Path, progress: Progress | None, retries: int,
                 reconnect_timeout: float, timeout: float) -> KbDocument:
    """The document's bytes after those ``part`` holds, reconnecting (and resuming) after a drop;
    CHECKSUM_MISMATCH (``part`` and its sidecar removed) when the whole does not hash to its md5."""
    async def once() -> KbDocument:
        f = await asyncio.to_thread(open, part, "ab")
        try:
            return await _download_once(client, doc_id, f.tell(), f.write, progress, timeout)
        finally:
            await asyncio.to_thread(f.close)

    doc = await _retrying(client, once, retries, reconnect_timeout)
    md5, _, _ = await asyncio.to_thread(file_digests, part)
    if md5 != doc.md5:
        await asyncio.to_thread(part.unlink)
        await asyncio.to_thread(_sidecar(part).unlink, missing_ok=True)
        raise ClientError(ErrorCode.CHECKSUM_MISMATCH, f"downloaded bytes hash to {md5}, not {doc.md5} "
                          f"(the partial file {part.name} was removed: a new download starts over)")
    return doc


async def _download_once(client: Any, doc_id: str, offset: int, write: Callable[[bytes], Any],
                         progress: Progress | None, timeout: float) -> KbDocument:
    """The document's bytes from ``offset``, each block given to ``write`` (in a worker thread) in order."""
    handle = next(_handles) & 0xFFFFFFFF
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    failure: list[str] = []
    expected = [offset]

    def on_data(payload: Any) -> bool:
        h, off, data = decode_data(payload)
        if h != handle:
            return False
        if off != expected[0]:
            failure.append(f"data at offset {off}, expected {expected[0]}")
        elif not task.done():      # (a writer that failed raises its error once the reply is in)
            expected[0] += len(data)
            queue.put_nowait(data.tobytes())
        return True

    async def writer() -> None:
        done = offset
        while (data := await queue.get()) is not None:
            await asyncio.to_thread(write, data)
            done += len(data)
            if progress is not None:
                progress("receiving", done, -1)

    task = asyncio.create_task(writer())
    try:
        with _tapped(client, MsgType.KB_DOWNLOAD_DATA, on_data):
            reply = await client.request(MsgType.KB_DOWNLOAD, {"doc_id": doc_id, "handle": handle, "offset": offset},
                                         timeout=timeout)
    except asyncio.CancelledError:
        # the rest is not written, and a write blocked on a reader that stopped reading is not waited for
        task.cancel()
        await asyncio.wait([task])
        raise
    except BaseException:
        queue.put_nowait(None)
        await task            # (a writer that failed: its error)
        raise
    queue.put_nowait(None)
    await task
    if failure:
        raise ClientError(ErrorCode.INVALID_MESSAGE, failure[0])
    return reply.document
