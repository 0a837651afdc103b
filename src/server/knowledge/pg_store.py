"""The document-store port (``server.knowledge.port``) on PostgreSQL: the knowledge base of a cluster.

PostgreSQL holds the truth: documents, chunks, original bytes (1 MiB blocks), vectors and the
trigram index on chunk text (``storage.pg.documents``). Each node derives its catalog and BM25
index from those rows and keeps them current through LISTEN/NOTIFY: every committed insert or
delete notifies ``nplt_kb`` with the document id, the listener reads the rows. A document is staged
(copied, hashed, parsed) in a local directory, then written in one transaction: a node killed
mid-ingest leaves nothing in PostgreSQL, and only scratch files that the next start clears.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO

from protocol import ErrorCode
from server.errors import HandlerError, not_found
from server.knowledge.config import KnowledgeConfig
from server.knowledge.models import DocumentInfo
from server.knowledge.port import Catalog, Loaded, Staged, StagingArea
from server.knowledge.store import info_of
from storage.errors import StorageError
from storage.pg.documents import BLOCK_BYTES, CHANNEL, Limits, PgDocuments, StoredDocument
from storage.pg.link import PgLink
from storage.pg.notify import Listener

log = logging.getLogger("nplt.knowledge")


def _loaded(doc: StoredDocument) -> Loaded:
    return info_of(doc.meta), doc.chunks, doc.vectors


def _storage_error(exc: StorageError) -> HandlerError:
    return HandlerError(exc.code, exc.message)      # STORAGE_UNAVAILABLE when PostgreSQL is unreachable


class PgBlockReader:
    """A read-only binary file over a document's blocks. ``read`` runs in a worker thread (it waits
    for the event loop to fetch one block at a time); calling it on the loop is an error."""

    def __init__(self, rows: PgDocuments, loop: asyncio.AbstractEventLoop, doc_id: str, size: int,
                 offset: int) -> None:
        self._rows = rows
        self._loop = loop
        self._doc_id = doc_id
        self._size = size
        self._pos = offset
        self._block: tuple[int, bytes] | None = None
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        """``n`` bytes (all the rest if ``n`` < 0), fewer only at the end, as a file's ``read``; the
        bytes read so far once the document is deleted under the reader."""
        if self.closed:
            raise ValueError("read of a closed file")
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("PgBlockReader.read blocks: call it in a worker thread")
        want = self._size - self._pos if n is None or n < 0 else min(n, self._size - self._pos)
        out = bytearray()
        while len(out) < want:
            seq, at = divmod(self._pos, BLOCK_BYTES)
            if self._block is None or self._block[0] != seq:
                data = asyncio.run_coroutine_threadsafe(self._rows.block(self._doc_id, seq), self._loop).result()
                if data is None:               # deleted meanwhile
                    break
                self._block = (seq, data)
            part = self._block[1][at:at + want - len(out)]
            if not part:
                break
            out += part
            self._pos += len(part)
        return bytes(out)

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        self.closed = True
        self._block = None

    def __enter__(self) -> PgBlockReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def pg_limits(config: KnowledgeConfig) -> Limits:
    return Limits(config.user_quota_bytes, config.max_documents_per_collection)


class PgDocumentStore:
    """Documents in PostgreSQL, staged in ``staging_root`` (a local scratch directory)."""

    shared = True

    def __init__(self, link: PgLink, staging_root: str | os.PathLike, limits: Limits) -> None:
        self.rows = PgDocuments(link)
        self.link = link
        self.staged = StagingArea(Path(staging_root) / "tmp")
        self.tmp = self.staged.path
        self.limits = limits
        self._listener: Listener | None = None
        self._own: set[str] = set()            # documents this node is committing (and adds itself)

    async def open(self) -> None:
        await asyncio.to_thread(self.staged.clear)

    async def load(self, each: Callable[[Loaded], None]) -> None:
        try:
            async for batch in self.rows.all():
                await asyncio.to_thread(lambda b=batch: [each(_loaded(d)) for d in b])
        except StorageError as exc:
            raise _storage_error(exc) from None

    async def commit(self, staged: Staged, info: DocumentInfo, vectors: list[list[float]] | None,
                     catalog: Catalog) -> DocumentInfo:
        meta = info.to_dict()
        del meta["duplicate"]

        def finish(added: bool) -> None:       # worker thread
            self.staged.discard(staged.path)
            if added:
                with catalog.lock:
                    catalog.add(info, staged.chunks, staged.terms, vectors)
        self._own.add(info.doc_id)             # its notification is skipped here: added below
        try:
            try:
                outcome, value = await self.rows.insert(meta, staged.path / "original", staged.chunks, vectors,
                                                        self.limits)
            except BaseException as exc:
                await asyncio.shield(asyncio.to_thread(finish, False))
                if isinstance(exc, StorageError):
                    raise _storage_error(exc) from None
                raise
            # committed: into this node's index even if the caller is cancelled now
            await asyncio.shield(asyncio.to_thread(finish, outcome == "added"))
        finally:
            self._own.discard(info.doc_id)
        if outcome == "duplicate":
            return replace(info_of(value), duplicate=True)
        if outcome == "quota":
            raise HandlerError(ErrorCode.QUOTA_EXCEEDED, value)
        return info

    async def remove(self, info: DocumentInfo) -> None:
        try:
            await self.rows.delete(info.doc_id)
        except StorageError as exc:
            raise _storage_error(exc) from None

    async def open_original(self, info: DocumentInfo, offset: int) -> BinaryIO:
        try:
            present = await self.rows.exists(info.doc_id)
        except StorageError as exc:
            raise _storage_error(exc) from None
        if not present:
            raise not_found("document")
        reader = PgBlockReader(self.rows, asyncio.get_running_loop(), info.doc_id, info.size, offset)
        return reader  # type: ignore[return-value]

    async def fetch(self, doc_id: str) -> Loaded | None:
        found = await self.rows.read([doc_id])
        return _loaded(found[0]) if found else None

    async def doc_ids(self) -> set[str]:
        return await self.rows.doc_ids()

    async def watch(self, on_change: Callable[[str, str], Awaitable[None]],
                    on_gap: Callable[[], Awaitable[None]]) -> None:
        async def event(_channel: str, payload: dict[str, Any]) -> None:
            op, doc = payload.get("op"), payload.get("doc")
            if op not in ("add", "del") or not isinstance(doc, str):
                return
            if op == "add" and doc in self._own:
                return                         # this node's own commit adds it (no second read)
            await on_change(op, doc)
        self._listener = Listener(self.link, [CHANNEL], event, on_gap)
        await self._listener.start()

    async def close(self) -> None:
        if self._listener is not None:
            await self._listener.close()
            self._listener = None
