"""Crash-safe document storage under ``<root>``: a document exists whole or not at all.

Layout::

    <root>/tmp/<doc_id>/            being written (removed on start: an interrupted ingest)
    <root>/trash/<doc_id>/          being deleted (removed on start)
    <root>/quarantine/<doc_id>[.N]/ a document found unreadable at start, moved aside (never removed)
    <root>/c/<collection key>/<doc_id>/
        original                    the uploaded bytes
        chunks.json                 [{"text", "location"}, ...]
        vectors.json                (with embeddings) one vector per chunk
        meta.json                   the DocumentInfo fields, written last (rewritten, through
                                    meta.json.tmp and a rename, when a group document's
                                    uploader or co-uploaders change)

Ingestion writes everything into ``tmp/<doc_id>`` (each file fsynced), then renames the directory
into its collection in one ``rename`` (atomic on POSIX) and fsyncs the parent. A SIGKILL before the
rename leaves only ``tmp/`` debris, after it the whole document. Deletion renames into ``trash/``
first, so a half-deleted document is never visible either.

A document directory whose ``meta.json``, ``chunks.json`` or ``vectors.json`` cannot be read at
start (damaged by hand or by the disk) is moved to ``quarantine/`` (logged as an ERROR naming where):
it is not loaded, and it no longer sits under ``c/`` where nothing could delete it. A document whose
``original`` is missing stays listed and searchable (its passages are intact); its download answers
STORAGE_ERROR, and the start-up scan logs an ERROR for it.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import stat
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import orjson

from protocol import ErrorCode
from server.errors import HandlerError, not_found
from server.knowledge.models import DocumentInfo
from server.knowledge.port import Catalog, Loaded, Staged, StagingArea, clear_directory

log = logging.getLogger("nplt.knowledge")


def collection_key(collection: str) -> str:
    """The directory name of a collection (a hash: collection names never reach the filesystem)."""
    return hashlib.sha256(collection.encode()).hexdigest()[:32]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_json(path: Path, obj: Any) -> None:
    # orjson: the same compact UTF-8 bytes as json.dumps(ensure_ascii=False), ~10x faster; the
    # encoder holds the GIL, and a large document's chunk records took ~0.25 s of it (a stall of
    # every client's requests while an upload was stored)
    write_file(path, orjson.dumps(obj))


#: a document file missing, or a folder where it should be: the document is damaged (quarantined)
DAMAGED = (FileNotFoundError, IsADirectoryError, NotADirectoryError)
_KINDS = ((stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "something else")


def ensure_directory(path: Path) -> None:
    """Create the directory ``path`` (and its parents) unless it exists. Something else where it, or
    one of its parents, should be is an OSError saying so ("<path> must be a directory (found a
    regular file)"), instead of the errno of the ``mkdir`` that trips over it (ENOTDIR, EEXIST)."""
    for p in (*reversed(path.parents), path):
        try:
            st = os.stat(p)
        except FileNotFoundError:
            if os.path.islink(p):
                raise NotADirectoryError(f"{p} must be a directory (found a symlink to nothing: "
                                         f"{os.readlink(p)})") from None
            break
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(f"{p} must be a directory (found {_kind(st.st_mode)})")
    path.mkdir(parents=True, exist_ok=True)


def info_of(meta: dict) -> DocumentInfo:
    """A DocumentInfo from stored metadata (TypeError when a field is missing or wrong). A field
    with a default that the metadata lacks (``co_uploaders``: a meta.json written before it, a row
    read without it) takes its default; a list is read as the tuple it was."""
    fields = {k: meta[k] for k in DocumentInfo.__dataclass_fields__ if k != "duplicate" and k in meta}
    if "co_uploaders" in fields:
        co = fields["co_uploaders"]
        if not isinstance(co, (list, tuple)) or not all(isinstance(u, str) for u in co):
            raise TypeError(f"co_uploaders: expected a list of user ids, got {co!r}")
        fields["co_uploaders"] = tuple(co)
    return DocumentInfo(**fields)


#: what a co-uploader holds, as a shared store reads it with their lock held (``update_uploaders``
#: ``with_usage``): (bytes of their documents, chunks of their documents, their documents in the
#: document's collection)
Usage = tuple[int, int, int]
#: a change of a document's uploaders: given the stored (uploader, co_uploaders) and ``usage`` (each
#: co-uploader's ``Usage`` when asked for and the store reads it, else None: the caller's catalog is
#: the truth), the new pair, or None to leave them as they are (``update_uploaders``; a pure
#: function: a store may call it again)
UploadersChange = Callable[[str, tuple[str, ...], "dict[str, Usage] | None"], "tuple[str, tuple[str, ...]] | None"]


class FileDocumentStore:
    """The document-store port (``server.knowledge.port``) on files: the default backend."""

    shared = False

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.staged = StagingArea(self.root / "tmp")
        self.tmp = self.staged.path
        self.trash = self.root / "trash"
        self.collections = self.root / "c"
        self.quarantine = self.root / "quarantine"

    async def open(self) -> None:
        await asyncio.to_thread(self.open_sync)

    def open_sync(self) -> None:
        """Create the layout and clear what a crash left behind (a file where one of its directories
        should be: an OSError naming it)."""
        for path in (self.root, self.tmp, self.collections, self.trash):
            ensure_directory(path)
        self.staged.clear()
        self.collections.mkdir(parents=True, exist_ok=True)
        clear_directory(self.trash)

    def commit_sync(self, staging: Path, collection: str, meta: dict) -> Path:
        """Write ``meta.json`` and move the staged document into its collection (atomically)."""
        write_json(staging / "meta.json", meta)
        _fsync_dir(staging)
        parent = self.collections / collection_key(collection)
        parent.mkdir(exist_ok=True)
        final = parent / staging.name
        os.rename(staging, final)
        _fsync_dir(parent)
        return final

    def path(self, collection: str, doc_id: str) -> Path:
        return self.collections / collection_key(collection) / doc_id

    def set_uploaders_sync(self, collection: str, doc_id: str, uploader: str, co: tuple[str, ...]) -> bool:
        """Rewrite the document's ``meta.json`` with ``uploader`` and ``co_uploaders`` = ``co``,
        atomically (``meta.json.tmp`` written and fsynced, renamed over it, the directory fsynced): a
        crash leaves the old or the new file, never a torn one. False when the document is gone."""
        doc = self.path(collection, doc_id)
        try:
            meta = json.loads((doc / "meta.json").read_bytes())
        except FileNotFoundError:
            return False                          # deleted meanwhile
        meta["uploader"] = uploader
        meta["co_uploaders"] = list(co)
        tmp = doc / "meta.json.tmp"
        try:
            write_json(tmp, meta)
            os.rename(tmp, doc / "meta.json")
        except FileNotFoundError:                 # deleted while it was written (into trash/: removed there)
            return False
        _fsync_dir(doc)
        return True

    def remove_sync(self, collection: str, doc_id: str) -> None:
        src = self.path(collection, doc_id)
        dst = self.trash / doc_id
        try:
            os.rename(src, dst)
        except FileNotFoundError:                 # deleted meanwhile
            return
        _fsync_dir(src.parent)
        shutil.rmtree(dst, ignore_errors=True)

    def documents(self, unreadable: list[str] | None = None) -> Iterator[tuple[Path, dict]]:
        """Every stored document: (directory, meta). One whose ``meta.json`` cannot be read is
        skipped (logged, and named in ``unreadable`` when given). A file where a collection or a
        document directory would be (a ``.DS_Store`` copied in) is no document: skipped, logged."""
        for doc in self._document_dirs():
            try:
                meta = json.loads((doc / "meta.json").read_bytes())
            except (OSError, ValueError) as exc:
                log.warning("skipping unreadable document %s: %s", doc, exc)
                if unreadable is not None:
                    unreadable.append(f"{doc}: {exc}")
                continue
            yield doc, meta

    def _document_dirs(self) -> Iterator[Path]:
        """Every document directory under ``c/`` (files among them skipped, logged)."""
        for coll in sorted(self.collections.iterdir()):
            if not coll.is_dir():
                log.info("skipping %s: a file among the collections, not a collection", coll)
                continue
            for doc in sorted(coll.iterdir()):
                if not doc.is_dir():
                    log.info("skipping %s: a file among the documents, not a document", doc)
                    continue
                yield doc

    @staticmethod
    def chunks(doc: Path) -> list[dict]:
        return json.loads((doc / "chunks.json").read_bytes())

    @staticmethod
    def vectors(doc: Path) -> list[list[float]] | None:
        try:
            return json.loads((doc / "vectors.json").read_bytes())
        except FileNotFoundError:
            return None

    def read_sync(self, doc: Path) -> Loaded:
        """A stored document's (info, chunks, vectors); OSError, ValueError, KeyError or TypeError
        when one of its files is missing or damaged (worker thread)."""
        meta = json.loads((doc / "meta.json").read_bytes())
        info, chunks, vectors = info_of(meta), self.chunks(doc), self.vectors(doc)
        if not isinstance(chunks, list) or not all(
                isinstance(c, dict) and isinstance(c.get("text"), str) and isinstance(c.get("location"), dict)
                for c in chunks):
            raise ValueError("chunks.json does not hold a list of {text, location} records")
        if vectors is not None and not isinstance(vectors, list):
            raise ValueError("vectors.json does not hold a list")
        return info, chunks, vectors

    def quarantine_sync(self, doc: Path, why: object) -> Path | None:
        """Move an unreadable document directory out of ``c/`` into ``quarantine/`` (never over
        another: ``<doc_id>.1``, ``.2``, ...), logged as an ERROR; where it went (None: it could not
        be moved, logged too)."""
        try:
            ensure_directory(self.quarantine)
            dest = self.quarantine / doc.name
            n = 0
            while os.path.lexists(dest):
                n += 1
                dest = self.quarantine / f"{doc.name}.{n}"
            os.rename(doc, dest)
            _fsync_dir(doc.parent)
        except OSError as exc:
            log.error("unreadable document %s (%s) is not loaded; it could not be moved to %s: %s",
                      doc, why, self.quarantine, exc)
            return None
        log.error("unreadable document %s (%s) is not loaded: moved to %s (its original bytes, if any, are "
                  "there; remove it, or repair it and move it back into %s)", doc, why, dest, doc.parent)
        return dest

    # -- the port (server.knowledge.port.DocumentStore) ---------------------------------------------
    async def load(self, each: Callable[[Loaded], None]) -> None:
        """Every stored document to ``each``. A document whose files cannot be read is moved to
        ``quarantine/``; one whose ``original`` is missing is loaded, and logged as an ERROR (its
        download answers STORAGE_ERROR)."""
        def run() -> None:
            for path in self._document_dirs():
                try:
                    loaded = self.read_sync(path)
                except (KeyError, TypeError, ValueError, *DAMAGED) as exc:
                    self.quarantine_sync(path, exc)
                    continue
                except OSError as exc:        # (permissions, an I/O error: maybe passing, so left in place)
                    log.error("document %s cannot be read (%s): not loaded", path, exc)
                    continue
                if not (path / "original").is_file():
                    log.error("document %s (%s): its stored bytes are missing (%s is not a file): it is listed "
                              "and searchable, but cannot be downloaded", loaded[0].doc_id, loaded[0].name,
                              path / "original")
                each(loaded)
        await asyncio.to_thread(run)

    async def commit(self, staged: Staged, info: DocumentInfo, vectors: list[list[float]] | None,
                     catalog: Catalog) -> DocumentInfo:
        """The catalog is the authority on duplicates and quotas here (one node owns the files)."""
        def run() -> DocumentInfo:
            try:
                if vectors is not None:
                    write_json(staged.path / "vectors.json", vectors)
                with catalog.lock:
                    dup = catalog.duplicate_of(info.collection, info.sha256)
                    if dup is not None:                  # the same bytes committed meanwhile
                        self.staged.discard(staged.path)
                        return replace(dup, duplicate=True)
                    catalog.check_quota(info.uploader, info.collection, info.size)
                    meta = info.to_dict()
                    del meta["duplicate"]
                    self.commit_sync(staged.path, info.collection, meta)
                    catalog.add(info, staged.chunks, staged.terms, vectors)
                return info
            except OSError as exc:
                self.staged.discard(staged.path)
                raise HandlerError(ErrorCode.STORAGE_ERROR,
                                   f"cannot store the document: {exc.strerror or exc}") from None
        return await asyncio.to_thread(run)

    async def remove(self, info: DocumentInfo) -> None:
        try:
            await asyncio.to_thread(self.remove_sync, info.collection, info.doc_id)
        except OSError as exc:
            raise HandlerError(ErrorCode.STORAGE_ERROR, f"cannot delete: {exc.strerror or exc}") from None

    async def open_original(self, info: DocumentInfo, offset: int) -> BinaryIO:
        def run() -> BinaryIO:
            doc = self.path(info.collection, info.doc_id)
            try:
                f = open(doc / "original", "rb")
            except FileNotFoundError:
                if not doc.is_dir():                 # deleted meanwhile
                    raise not_found("document") from None
                log.error("document %s (%s): its stored bytes are missing (%s)", info.doc_id, info.name,
                          doc / "original")
                raise HandlerError(ErrorCode.STORAGE_ERROR, f"the stored bytes of {info.name} ({info.doc_id}) "
                                   "are missing on the server: ask its administrator") from None
            except OSError as exc:
                log.error("document %s (%s): cannot read its stored bytes: %s", info.doc_id, info.name, exc)
                raise HandlerError(ErrorCode.STORAGE_ERROR, f"the stored bytes of {info.name} ({info.doc_id}) "
                                   f"cannot be read on the server: {exc.strerror or exc}") from None
            try:
                f.seek(offset)
            except BaseException:
                f.close()
                raise
            return f
        return await asyncio.to_thread(run)

    async def set_uploaders(self, info: DocumentInfo, co: tuple[str, ...]) -> bool:
        """Keep ``info.uploader`` and the co-uploaders ``co`` of a group document in its
        ``meta.json`` (atomically); False if it is gone. STORAGE_ERROR when the disk refuses."""
        try:
            return await asyncio.to_thread(self.set_uploaders_sync, info.collection, info.doc_id,
                                           info.uploader, tuple(co))
        except OSError as exc:
            raise HandlerError(ErrorCode.STORAGE_ERROR,
                               f"cannot record the document's uploaders: {exc.strerror or exc}") from None

    async def update_uploaders(self, info: DocumentInfo, change: UploadersChange, *,
                               with_usage: bool = False) -> DocumentInfo | None:
        """Apply ``change`` to the uploaders of ``info`` (this node's catalog is the truth here: the
        caller serializes the changes, and ``change`` is given no usage even ``with_usage``) and
        keep the result; the document as it is now, None if gone."""
        new = change(info.uploader, info.co_uploaders, None)
        if new is None:
            return info
        kept = replace(info, uploader=new[0], co_uploaders=tuple(new[1]))
        return kept if await self.set_uploaders(kept, kept.co_uploaders) else None

    async def fetch(self, doc_id: str) -> Loaded | None:
        return None                # nothing changes under this node: never asked

    async def doc_ids(self) -> set[str]:
        return set()

    async def watch(self, on_change: Callable[[str, str], Awaitable[None]],
                    on_gap: Callable[[], Awaitable[None]]) -> None:
        return None

    async def close(self) -> None:
        return None
