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

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

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
    write_file(path, json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode())


class DocumentStore:
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.tmp = self.root / "tmp"
        self.trash = self.root / "trash"
        self.collections = self.root / "c"

    def open(self) -> None:
        """Create the layout and clear what a crash left behind."""
        for d in (self.tmp, self.trash, self.collections):
            d.mkdir(parents=True, exist_ok=True)
        for d in (self.tmp, self.trash):
            for child in d.iterdir():
                log.info("removing unfinished %s", child)
                shutil.rmtree(child, ignore_errors=True)

    def staging(self, doc_id: str) -> Path:
        path = self.tmp / doc_id
        path.mkdir()
        return path

    def discard(self, staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)

    def commit(self, staging: Path, collection: str, meta: dict) -> Path:
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

    def remove(self, collection: str, doc_id: str) -> None:
        src = self.path(collection, doc_id)
        dst = self.trash / doc_id
        os.rename(src, dst)
        _fsync_dir(src.parent)
        shutil.rmtree(dst, ignore_errors=True)

    def documents(self) -> Iterator[tuple[Path, dict]]:
        """Every stored document: (directory, meta)."""
        for coll in sorted(self.collections.iterdir()):
            for doc in sorted(coll.iterdir()):
                try:
                    meta = json.loads((doc / "meta.json").read_bytes())
                except (OSError, ValueError) as exc:
                    log.warning("skipping unreadable document %s: %s", doc, exc)
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
