"""The document-store port of the knowledge base: where documents, chunks, vectors and original bytes
are kept. Two backends: files under the data directory (``store.FileDocumentStore``, the default)
and PostgreSQL (``pg_store.PgDocumentStore``, when ``[storage] url`` is PostgreSQL).

``KnowledgeBase`` keeps, on every node, an in-memory catalog and ChunkIndex derived from the store
(the ``Catalog`` below). A store that is ``shared`` (several nodes on one database) reports the
changes other nodes make through ``watch``; the catalog re-reads those documents.
"""
from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from server.knowledge.models import DocumentInfo

log = logging.getLogger("nplt.knowledge")

#: one loaded document: (info, chunks [{"text", "location"}], vectors or None)
Loaded = tuple[DocumentInfo, list[dict], list[list[float]] | None]


@dataclass(slots=True)
class Staged:
    """A document parsed and analyzed in a local staging directory (``path/original``, ...)."""
    doc_id: str
    path: Path
    md5: str
    sha256: str
    size: int
    chunks: list[dict]
    terms: list[dict[str, float]]


def clear_directory(path: Path) -> None:
    """Create ``path`` if missing and remove what an interrupted operation left in it (worker thread)."""
    path.mkdir(parents=True, exist_ok=True)
    for child in path.iterdir():
        log.info("removing unfinished %s", child)
        shutil.rmtree(child, ignore_errors=True)


class StagingArea:
    """The local directory where documents are parsed and staged before their commit (both
    backends stage locally). Worker threads only."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def clear(self) -> None:
        """Create the directory and remove what an interrupted ingest left in it."""
        clear_directory(self.path)

    def new(self, doc_id: str) -> Path:
        path = self.path / doc_id
        path.mkdir()
        return path

    @staticmethod
    def discard(staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)


class Catalog(Protocol):
    """The knowledge base's in-memory view, as the stores update it."""
    lock: threading.Lock

    def duplicate_of(self, collection: str, sha256: str) -> DocumentInfo | None: ...
    def check_quota(self, user: str, collection: str, size: int) -> None: ...
    def add(self, info: DocumentInfo, chunks: list[dict], terms: list[dict[str, float]],
            vectors: list[list[float]] | None) -> None: ...


class DocumentStore(Protocol):
    shared: bool          # other nodes change it too (watch reports their changes)

    async def open(self) -> None:
        """Create what is missing and clear what a crash left (staging debris)."""

    async def load(self, each: Callable[[Loaded], None]) -> None:
        """Call ``each`` (in a worker thread) for every stored document."""

    staged: StagingArea   # where documents are staged before their commit

    async def commit(self, staged: Staged, info: DocumentInfo, vectors: list[list[float]] | None,
                     catalog: Catalog) -> DocumentInfo:
        """Keep the staged document whole, or nothing. Returns ``info`` (added to ``catalog``), or the
        document already holding the same bytes in the collection with ``duplicate=True``.
        HandlerError QUOTA_EXCEEDED / STORAGE_ERROR. The staging directory is gone afterwards."""

    async def remove(self, info: DocumentInfo) -> None:
        """Delete a document (nothing happens if it is already gone)."""

    async def open_original(self, info: DocumentInfo, offset: int) -> BinaryIO:
        """The original bytes from ``offset``: a binary file to read in a worker thread (never on
        the event loop) and close. NOT_FOUND once the document is gone."""

    async def fetch(self, doc_id: str) -> Loaded | None:
        """One document as stored now (None if absent)."""

    async def doc_ids(self) -> set[str]: ...

    async def watch(self, on_change: Callable[[str, str], Awaitable[None]],
                    on_gap: Callable[[], Awaitable[None]]) -> None:
        """Report other nodes' changes: ``on_change(op, doc_id)`` with op "add" or "del", and
        ``on_gap()`` when changes may have been missed (resynchronize). No-op when not shared."""

    async def close(self) -> None: ...
