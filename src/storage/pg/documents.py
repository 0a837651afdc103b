"""The knowledge base's rows in PostgreSQL (migrations/0006_knowledge.sql): documents, chunks,
original bytes in blocks, vectors; the SQL only, in plain values (the server's knowledge base maps
them to its records).

``insert`` writes a whole document in one transaction, after taking two transaction-scoped
advisory locks (its uploader's, for the quota; its collection's, for the document count and the
dedupe check), so concurrent uploads on any number of nodes agree on quotas and duplicates; the
UNIQUE (collection, sha256) constraint backs the dedupe. The change is announced on ``CHANNEL``
inside the same transaction (only committed documents are ever announced).

``update_uploaders`` changes a group document's ``uploader`` and ``co_uploaders`` (migration
``0013_kb_co_uploaders.sql``) as a read-modify-write under the row's lock, announced as "upd": two
nodes recording co-uploaders, or passing the document on, at the same time both take effect.
"""
from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson

from .link import PgLink, progress
from .notify import publish_in

#: NOTIFY channel of knowledge-base changes: {"op": "add" | "del" | "upd", "doc": doc_id} ("upd": its
#: uploader or co-uploaders changed)
CHANNEL = "nplt_kb"
BLOCK_BYTES = 1 << 20            # the original bytes are stored in blocks of this size
LOAD_BATCH = 200                 # documents read per round trip when loading everything
DOC_COLUMNS = "doc_id, name, md5, sha256, size, chunks, collection, uploaded_at, uploader, co_uploaders"


@dataclass(frozen=True, slots=True)
class Limits:
    quota_bytes: int             # bytes one uploader may store, every collection
    max_documents: int           # documents per collection


@dataclass(frozen=True, slots=True)
class StoredDocument:
    meta: dict[str, Any]                      # DOC_COLUMNS by name (co_uploaders: a list)
    chunks: list[dict[str, Any]]              # {"text", "location"} in order
    vectors: list[list[float]] | None


def _text(s: str) -> str:
    return s.replace("\x00", "\ufffd")        # PostgreSQL text holds no NUL


def _lock_key(kind: str, name: str) -> tuple[str]:
    return (f"nplt-kb-{kind}:{name}",)


async def _blocks(path: str | os.PathLike, doc_id: str) -> AsyncIterator[tuple[str, int, bytes]]:
    """The file at ``path`` as block rows, read off the event loop."""
    f = await asyncio.to_thread(open, path, "rb")
    try:
        seq = 0
        while data := await asyncio.to_thread(f.read, BLOCK_BYTES):
            yield doc_id, seq, data
            seq += 1
    finally:
        await asyncio.to_thread(f.close)


class PgDocuments:
    """The knowledge base's tables, through ``link`` (the history store's pool)."""

    def __init__(self, link: PgLink) -> None:
        self.link = link

    async def insert(self, meta: dict[str, Any], original: str | os.PathLike, chunks: list[dict[str, Any]],
                     vectors: list[list[float]] | None, limits: Limits) -> tuple[str, Any]:
        """Store one document whole. Returns ("added", meta), ("duplicate", existing meta) or
        ("quota", reason); nothing is written unless "added"."""
        async def work(con: asyncpg.Connection) -> tuple[str, Any]:
            async with con.transaction():
                await con.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                                  *_lock_key("user", meta["uploader"]))
                await con.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                                  *_lock_key("collection", meta["collection"]))
                row = await con.fetchrow(f"SELECT {DOC_COLUMNS} FROM nplt_kb_documents "
                                         "WHERE collection = $1 AND sha256 = $2", meta["collection"], meta["sha256"])
                if row is not None:
                    return "duplicate", dict(row)
                used = await con.fetchval("SELECT coalesce(sum(size), 0) FROM nplt_kb_documents WHERE uploader = $1",
                                          meta["uploader"])
                if used + meta["size"] > limits.quota_bytes:
                    return "quota", f"quota of {limits.quota_bytes} bytes reached ({used} used)"
                count = await con.fetchval("SELECT count(*) FROM nplt_kb_documents WHERE collection = $1",
                                           meta["collection"])
                if count >= limits.max_documents:
                    return "quota", f"collection holds {limits.max_documents} documents"
                added = await con.fetchval(
                    "INSERT INTO nplt_kb_documents (doc_id, name, md5, sha256, size, chunks, collection, uploaded_at, "
                    "uploader, co_uploaders) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) "
                    "ON CONFLICT (collection, sha256) DO NOTHING RETURNING 1",
                    meta["doc_id"], meta["name"], meta["md5"], meta["sha256"], meta["size"], meta["chunks"],
                    meta["collection"], meta["uploaded_at"], meta["uploader"], list(meta.get("co_uploaders") or ()))
                if added is None:          # (the collection lock makes this unreachable; the constraint decides)
                    row = await con.fetchrow(f"SELECT {DOC_COLUMNS} FROM nplt_kb_documents WHERE collection = $1 "
                                             "AND sha256 = $2", meta["collection"], meta["sha256"])
                    return "duplicate", dict(row)
                await self._write_rows(con, meta["doc_id"], original, chunks, vectors)
                await publish_in(con, CHANNEL, {"op": "add", "doc": meta["doc_id"]})
            return "added", meta
        return await self.link.run(work, write=True)

    async def _write_rows(self, con: asyncpg.Connection, doc_id: str, original: str | os.PathLike,
                          chunks: list[dict[str, Any]], vectors: list[list[float]] | None) -> None:
        progress()        # (each of these statements may take long: the call's bound starts again)
        await con.copy_records_to_table("nplt_kb_blocks", records=_blocks(original, doc_id),
                                        columns=("doc_id", "seq", "data"))
        progress()
        await con.copy_records_to_table(
            "nplt_kb_chunks", columns=("doc_id", "ordinal", "text", "location"),
            records=[(doc_id, i, _text(c["text"]), orjson.dumps(c["location"]).decode()) for i, c in enumerate(chunks)])
        if vectors:
            progress()
            await con.executemany(
                "INSERT INTO nplt_kb_vectors (doc_id, ordinal, embedding) VALUES ($1, $2, $3::float4[])",
                [(doc_id, i, v) for i, v in enumerate(vectors)])
        progress()        # (and the commit after them)

    async def delete(self, doc_id: str) -> bool:
        """Delete a document and its rows; False if it was not there."""
        async def work(con: asyncpg.Connection) -> bool:
            async with con.transaction():
                gone = await con.fetchval("DELETE FROM nplt_kb_documents WHERE doc_id = $1 RETURNING 1", doc_id)
                if gone is not None:
                    await publish_in(con, CHANNEL, {"op": "del", "doc": doc_id})
                return gone is not None
        return await self.link.run(work, write=True)

    async def update_uploaders(self, doc_id: str, change: Callable[[str, tuple[str, ...]], Any]) -> dict[str, Any] | None:
        """Change a document's ``uploader`` and ``co_uploaders``: ``change(uploader, co_uploaders)``
        (pure, called with the row locked: ``SELECT ... FOR UPDATE``) gives the new pair, or None to
        leave them; a change is written and announced ({"op": "upd"}) in one transaction. The row
        as it is afterwards (DOC_COLUMNS), None if the document is gone."""
        async def work(con: asyncpg.Connection) -> dict[str, Any] | None:
            async with con.transaction():
                row = await con.fetchrow(f"SELECT {DOC_COLUMNS} FROM nplt_kb_documents WHERE doc_id = $1 FOR UPDATE",
                                         doc_id)
                if row is None:
                    return None
                meta = dict(row)
                new = change(meta["uploader"], tuple(meta["co_uploaders"]))
                if new is None or (new[0], tuple(new[1])) == (meta["uploader"], tuple(meta["co_uploaders"])):
                    return meta
                await self._set_uploaders(con, doc_id, new[0], new[1])
                meta["uploader"], meta["co_uploaders"] = new[0], list(new[1])
                return meta
        return await self.link.run(work, write=True)

    async def set_uploaders(self, doc_id: str, uploader: str, co: Iterable[str]) -> bool:
        """Set a document's ``uploader`` and ``co_uploaders`` (announced as "upd"); False if it is gone."""
        async def work(con: asyncpg.Connection) -> bool:
            async with con.transaction():
                return await self._set_uploaders(con, doc_id, uploader, co)
        return await self.link.run(work, write=True)

    @staticmethod
    async def _set_uploaders(con: asyncpg.Connection, doc_id: str, uploader: str, co: Iterable[str]) -> bool:
        done = await con.fetchval("UPDATE nplt_kb_documents SET uploader = $2, co_uploaders = $3 WHERE doc_id = $1 "
                                  "RETURNING 1", doc_id, uploader, list(co))
        if done is not None:
            await publish_in(con, CHANNEL, {"op": "upd", "doc": doc_id})
        return done is not None

    async def uploaders(self, doc_ids: Iterable[str] | None = None) -> dict[str, tuple[str, tuple[str, ...]]]:
        """doc_id -> (uploader, co_uploaders) of the given documents (every one when None)."""
        if doc_ids is None:
            rows = await self.link.run(lambda con: con.fetch(
                "SELECT doc_id, uploader, co_uploaders FROM nplt_kb_documents"), write=False)
        else:
            ids = list(doc_ids)
            rows = await self.link.run(lambda con: con.fetch(
                "SELECT doc_id, uploader, co_uploaders FROM nplt_kb_documents WHERE doc_id = ANY($1)", ids), write=False)
        return {r["doc_id"]: (r["uploader"], tuple(r["co_uploaders"])) for r in rows}

    async def doc_ids(self) -> set[str]:
        return {r["doc_id"] for r in await self.link.run(
            lambda con: con.fetch("SELECT doc_id FROM nplt_kb_documents"), write=False)}

    async def exists(self, doc_id: str) -> bool:
        return await self.link.run(lambda con: con.fetchval(
            "SELECT EXISTS (SELECT 1 FROM nplt_kb_documents WHERE doc_id = $1)", doc_id), write=False)

    async def read(self, doc_ids: Iterable[str]) -> list[StoredDocument]:
        """Documents with their chunks and vectors (the ids not found are left out)."""
        ids = list(doc_ids)

        async def work(con: asyncpg.Connection) -> tuple[list, list, list]:
            async with con.transaction(isolation="repeatable_read", readonly=True):   # one snapshot
                docs = await con.fetch(f"SELECT {DOC_COLUMNS} FROM nplt_kb_documents WHERE doc_id = ANY($1) "
                                       "ORDER BY doc_id", ids)
                chunks = await con.fetch("SELECT doc_id, text, location FROM nplt_kb_chunks WHERE doc_id = ANY($1) "
                                         "ORDER BY doc_id, ordinal", ids)
                vecs = await con.fetch("SELECT doc_id, embedding::float4[] AS v FROM nplt_kb_vectors "
                                       "WHERE doc_id = ANY($1) ORDER BY doc_id, ordinal", ids)
            return docs, chunks, vecs
        rows = await self.link.run(work, write=False)
        return await asyncio.to_thread(_assemble, *rows)    # tens of thousands of rows: off the event loop

    async def all(self) -> AsyncIterator[list[StoredDocument]]:
        """Every document, in batches of ``LOAD_BATCH``."""
        ids = sorted(await self.doc_ids())
        for start in range(0, len(ids), LOAD_BATCH):
            yield await self.read(ids[start:start + LOAD_BATCH])

    async def block(self, doc_id: str, seq: int) -> bytes | None:
        """Block ``seq`` of a document's bytes (None past the end or once deleted)."""
        return await self.link.run(lambda con: con.fetchval(
            "SELECT data FROM nplt_kb_blocks WHERE doc_id = $1 AND seq = $2", doc_id, seq), write=False)

    async def candidates(self, terms: list[str], collections: list[str], limit: int) -> list[tuple[str, int]]:
        """Chunks of ``collections`` whose text contains every one of ``terms`` (case-insensitive),
        found through the trigram index: (doc_id, ordinal), at most ``limit``. Ranking is not done
        here (the node's BM25 engine ranks); this is the PostgreSQL-side candidate query."""
        if not terms:
            return []
        patterns = ["%" + t.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%" for t in terms]
        rows = await self.link.run(lambda con: con.fetch(
            "SELECT c.doc_id, c.ordinal FROM nplt_kb_chunks c JOIN nplt_kb_documents d USING (doc_id) "
            "WHERE d.collection = ANY($1) AND c.text ILIKE ALL($2::text[]) ORDER BY c.doc_id, c.ordinal LIMIT $3",
            collections, patterns, limit), write=False)
        return [(r["doc_id"], r["ordinal"]) for r in rows]


def _assemble(docs: list, chunks: list, vecs: list) -> list[StoredDocument]:
    """Documents from the rows of ``PgDocuments.read`` (JSON locations parsed, vectors as lists)."""
    by_doc: dict[str, list[dict[str, Any]]] = {}
    for r in chunks:
        by_doc.setdefault(r["doc_id"], []).append({"text": r["text"], "location": orjson.loads(r["location"])})
    vec_doc: dict[str, list[list[float]]] = {}
    for r in vecs:
        vec_doc.setdefault(r["doc_id"], []).append(list(r["v"]))
    return [StoredDocument(dict(d), by_doc.get(d["doc_id"], []), vec_doc.get(d["doc_id"])) for d in docs]
