"""The document-store port (``server.knowledge.port``) on PostgreSQL: the knowledge base of a cluster.

PostgreSQL holds the truth: documents, chunks, original bytes (1 MiB blocks), vectors and the
trigram index on chunk text (``storage.pg.documents``). Each node derives its catalog and BM25
index from those rows and keeps them current through LISTEN/NOTIFY: every committed insert or
delete notifies ``nplt_kb`` with the document id, the listener reads the rows (and a change of a
group document's uploader or co-uploaders, "upd": the node re-reads them). A document is staged
(copied, hashed, parsed) in a local directory, then written in one transaction: a node killed
mid-ingest leaves nothing in PostgreSQL, and only scratch files that the next start clears.

``copy_documents`` is ``nplt-server migrate-json-to-pg``'s copy of the file store's documents
(``server.knowledge.store``) into these rows.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from protocol import ErrorCode
from server.errors import HandlerError, not_found
from server.knowledge.config import KnowledgeConfig
from server.knowledge.models import DocumentInfo
from server.knowledge.port import Catalog, Loaded, Staged, StagingArea
from server.knowledge.store import FileDocumentStore, UploadersChange, ensure_directory, info_of
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
    """Every limit an upload is held to, checked again in the insert's transaction (PostgreSQL holds
    the truth: another node's uploads count as soon as they commit)."""
    return Limits(config.user_quota_bytes, config.max_documents_per_collection, config.documents_per_member,
                  config.max_chunks_per_user, config.max_total_chunks)


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
        await asyncio.to_thread(ensure_directory, Path(self.tmp))   # (a file there: "... must be a directory")
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

    async def set_uploaders(self, info: DocumentInfo, co: tuple[str, ...]) -> bool:
        """Keep ``info.uploader`` and the co-uploaders ``co`` (announced to the other nodes); False
        if the document is gone."""
        try:
            return await self.rows.set_uploaders(info.doc_id, info.uploader, co)
        except StorageError as exc:
            raise _storage_error(exc) from None

    async def update_uploaders(self, info: DocumentInfo, change: UploadersChange, *,
                               with_usage: bool = False) -> DocumentInfo | None:
        """Apply ``change`` to the uploaders as PostgreSQL holds them, under the row's lock (so the
        changes of several nodes never overwrite one another); the document as it is now, None if
        it is gone. ``with_usage``: ``change`` is given what each co-uploader holds, read under their
        locks in the same transaction (``PgDocuments.update_uploaders``), to hand the document over
        only to one with room."""
        try:
            row = await self.rows.update_uploaders(info.doc_id, change, with_usage=with_usage)
        except StorageError as exc:
            raise _storage_error(exc) from None
        return None if row is None else info_of(row)

    async def uploaders(self, doc_ids: list[str] | None = None) -> dict[str, tuple[str, tuple[str, ...]]]:
        """doc_id -> (uploader, co_uploaders), as stored now (every document when ``doc_ids`` is None)."""
        return await self.rows.uploaders(doc_ids)

    async def fetch(self, doc_id: str) -> Loaded | None:
        found = await self.rows.read([doc_id])
        return _loaded(found[0]) if found else None

    async def doc_ids(self) -> set[str]:
        return await self.rows.doc_ids()

    async def watch(self, on_change: Callable[[str, str], Awaitable[None]],
                    on_gap: Callable[[], Awaitable[None]]) -> None:
        async def event(_channel: str, payload: dict[str, Any]) -> None:
            op, doc = payload.get("op"), payload.get("doc")
            if op not in ("add", "del", "upd") or not isinstance(doc, str):
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


# -- nplt-server migrate-json-to-pg -----------------------------------------------------------------
#: the copy keeps every document of the files, whatever the quotas (they were accepted there)
_COPY_LIMITS = Limits(1 << 62, 1 << 62, 1 << 62, 1 << 62, 1 << 62)

_COPIED_SQL = """
SELECT d.doc_id, d.collection, d.sha256, d.size, d.chunks,
       (SELECT count(*) FROM nplt_kb_chunks c WHERE c.doc_id = d.doc_id) AS chunk_rows,
       (SELECT coalesce(sum(octet_length(b.data)), 0) FROM nplt_kb_blocks b WHERE b.doc_id = d.doc_id) AS stored,
       (SELECT count(*) FROM nplt_kb_vectors v WHERE v.doc_id = d.doc_id) AS vector_rows
FROM nplt_kb_documents d JOIN unnest($1::text[], $2::text[]) AS k(collection, sha256) USING (collection, sha256)"""


@dataclass
class KnowledgeCopy:
    """What ``copy_documents`` did: documents found in the files, copied now (and their bytes), in
    PostgreSQL already, notes (the same bytes there under another id: not copied again) and what
    did not match (an unreadable document, a row that does not hold the file's chunks or bytes)."""
    documents: int = 0
    copied: int = 0
    already: int = 0
    bytes: int = 0
    notes: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)


async def copy_documents(root: str | os.PathLike, link: PgLink) -> KnowledgeCopy:
    """Copy the documents of the file store under ``root`` (the JSON backend's knowledge base) into
    PostgreSQL, each in one transaction with its chunks, original bytes and vectors, the same rows
    an upload writes (``PgDocuments.insert``; collection and uploader kept, quotas not applied), then
    verify per document the stored bytes and the chunk and vector rows. A document whose bytes the
    collection holds already (a rerun, or an interrupted run) is not copied again. The files are
    only read."""
    files = FileDocumentStore(root)
    report = KnowledgeCopy()
    unreadable: list[str] = []
    found = await asyncio.to_thread(lambda: list(files.documents(unreadable)) if files.collections.is_dir() else [])
    report.mismatches += [f"knowledge document {bad}: unreadable" for bad in unreadable]
    rows = PgDocuments(link)
    expected: dict[tuple[str, str], tuple[DocumentInfo, int, int]] = {}   # -> (info, chunks, vectors)
    for path, meta in found:
        def read(p: Path = path) -> tuple[list[dict], list[list[float]] | None, int]:
            return files.chunks(p), files.vectors(p), os.path.getsize(p / "original")
        try:
            info = info_of(meta)
            chunks, vectors, size = await asyncio.to_thread(read)
        except (KeyError, TypeError, ValueError, OSError) as exc:
            report.mismatches.append(f"knowledge document {path}: unreadable ({exc})")
            continue
        report.documents += 1
        if size != info.size or len(chunks) != info.chunks:
            report.mismatches.append(f"knowledge document {info.doc_id} ({info.name}): its files hold {size} bytes "
                                     f"and {len(chunks)} chunks, its metadata says {info.size} and {info.chunks}")
            continue
        row = info.to_dict()
        del row["duplicate"]
        outcome, value = await rows.insert(row, path / "original", chunks, vectors, _COPY_LIMITS)
        if outcome == "added":
            report.copied += 1
            report.bytes += size
        elif outcome == "duplicate":
            report.already += 1
            if value["doc_id"] != info.doc_id:
                report.notes.append(f"knowledge document {info.doc_id} ({info.name}) of {info.collection}: the same "
                                    f"bytes are in PostgreSQL already as document {value['doc_id']}, not copied")
        else:
            report.mismatches.append(f"knowledge document {info.doc_id} ({info.name}): not copied ({value})")
            continue
        expected[(info.collection, info.sha256)] = (info, len(chunks), len(vectors or ()))
    report.mismatches += await _verify_copied(link, expected)
    return report


async def _verify_copied(link: PgLink, expected: dict[tuple[str, str], tuple[DocumentInfo, int, int]]) -> list[str]:
    keys = list(expected)
    found = {(r["collection"], r["sha256"]): r for r in await link.run(lambda con: con.fetch(
        _COPIED_SQL, [c for c, _ in keys], [h for _, h in keys]), write=False)}
    bad = []
    for key, (info, chunks, vectors) in expected.items():
        r = found.get(key)
        what = f"knowledge document {info.doc_id} ({info.name})"
        if r is None:
            bad.append(f"{what}: missing in PostgreSQL")
        elif r["stored"] != info.size:
            bad.append(f"{what}: {info.size} bytes in the files, {r['stored']} in PostgreSQL")
        elif r["doc_id"] == info.doc_id and (r["chunk_rows"], r["vector_rows"]) != (chunks, vectors):
            bad.append(f"{what}: {chunks} chunks and {vectors} vectors in the files, "
                       f"{r['chunk_rows']} and {r['vector_rows']} in PostgreSQL")
    return bad
