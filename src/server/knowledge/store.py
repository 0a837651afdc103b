"""Crash-safe document storage under ``<root>``: a document exists whole or not at all.

Layout::

    <root>/tmp/<doc_id>/            being written (removed on start: an interrupted ingest)
    <root>/trash/<doc_id>/          being deleted (removed on start)
    <root>/c/<collection key>/<doc_id>/
        original                    the uploaded bytes
        chunks.json                 [{"text", "location"}, ...]
        vectors.json                (with embeddings) one vector per chunk
        meta.json                   the DocumentInfo fields, written last

Ingestion writes everything into ``tmp/<doc_id>`` (each file fsynced), then renames the directory
into its collection in one ``rename`` (atomic on POSIX) and fsyncs the parent. A SIGKILL before the
rename leaves only ``tmp/`` debris, after it the whole document. Deletion renames into ``trash/``
first, so a half-deleted document is never visible either.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
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


def info_of(meta: dict) -> DocumentInfo:
    """A DocumentInfo from stored metadata (KeyError / TypeError when a field is missing or wrong)."""
    return DocumentInfo(**{k: meta[k] for k in DocumentInfo.__dataclass_fields__ if k != "duplicate"})


class FileDocumentStore:
    """The document-store port (``server.knowledge.port``) on files: the default backend."""

    shared = False

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.staged = StagingArea(self.root / "tmp")
        self.tmp = self.staged.path
        self.trash = self.root / "trash"
        self.collections = self.root / "c"

    async def open(self) -> None:
        await asyncio.to_thread(self.open_sync)

    def open_sync(self) -> None:
        """Create the layout and clear what a crash left behind."""
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
        for coll in sorted(self.collections.iterdir()):
            if not coll.is_dir():
                log.info("skipping %s: a file among the collections, not a collection", coll)
                continue
            for doc in sorted(coll.iterdir()):
                if not doc.is_dir():
                    log.info("skipping %s: a file among the documents, not a document", doc)
                    continue
                try:
                    meta = json.loads((doc / "meta.json").read_bytes())
                except (OSError, ValueError) as exc:
                    log.warning("skipping unreadable document %s: %s", doc, exc)
                    if unreadable is not None:
                        unreadable.append(f"{doc}: {exc}")
                    continue
                yield doc, meta

    @staticmethod
    def chunks(doc: Path) -> list[dict]:
        return json.loads((doc / "chunks.json").read_bytes())

    @staticmethod
    def vectors(doc: Path) -> list[list[float]] | None:
        try:
            return json.loads((doc / "vectors.json").read_bytes())
        except FileNotFoundError:
            return None

    # -- the port (server.knowledge.port.DocumentStore) ---------------------------------------------
    async def load(self, each: Callable[[Loaded], None]) -> None:
        def run() -> None:
            for path, meta in self.documents():
                try:
                    loaded = (info_of(meta), self.chunks(path), self.vectors(path))
                except (KeyError, TypeError, ValueError, OSError) as exc:
                    log.warning("skipping unreadable document %s: %s", path, exc)
                    continue
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
            try:
                f = open(self.path(info.collection, info.doc_id) / "original", "rb")
            except FileNotFoundError:
                raise not_found("document") from None
            f.seek(offset)
            return f
        return await asyncio.to_thread(run)

    async def fetch(self, doc_id: str) -> Loaded | None:
        return None                # nothing changes under this node: never asked

    async def doc_ids(self) -> set[str]:
        return set()

    async def watch(self, on_change: Callable[[str, str], Awaitable[None]],
                    on_gap: Callable[[], Awaitable[None]]) -> None:
        return None

    async def close(self) -> None:
        return None
