"""The knowledge base's rows in PostgreSQL (migrations/0006_knowledge.sql): documents, chunks,
original bytes in blocks, vectors; the SQL only, in plain values (the server's knowledge base maps
them to its records).

``insert`` writes a whole document in one transaction, after taking two transaction-scoped
advisory locks (its uploader's, for the uploader's limits: bytes, chunks, documents in a group
collection; its collection's, for the document count and the dedupe check), so concurrent uploads
on any number of nodes agree on every limit (``Limits``) and on duplicates; the UNIQUE (collection,
sha256) constraint backs the dedupe. The server-wide chunk count is the counter row
``nplt_kb_totals`` (migration ``0014_kb_totals.sql``, kept by a trigger at commit): the insert locks
it last (``SELECT ... FOR UPDATE``, held only until its commit) and checks ``max_total_chunks``
there. The change is announced on ``CHANNEL`` inside the same transaction (only committed
documents are ever announced).

``update_uploaders`` changes a group document's ``uploader`` and ``co_uploaders`` (migration
``0013_kb_co_uploaders.sql``) as a read-modify-write under the row's lock, announced as "upd": two
nodes recording co-uploaders, or passing the document on, at the same time both take effect. A
change that may pass the document on (``with_usage``) also takes the co-uploaders' advisory locks
(the ones ``insert`` takes, in sorted order) and reads what each holds, so the taker's limits are
checked in the same transaction as the hand-over.
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
    """The knowledge base's limits, checked in ``insert``'s transaction (``[knowledge]`` settings)."""
    quota_bytes: int             # bytes one uploader may store, every collection (user_quota_bytes)
    max_documents: int           # documents per collection (max_documents_per_collection)
    max_documents_per_member: int   # documents one uploader may hold in one group collection
    max_chunks_per_user: int     # chunks of the documents one uploader holds, every collection
    max_total_chunks: int        # chunks of every document (nplt_kb_totals)


#: what one user holds, as ``update_uploaders`` reads it under their lock: (bytes of their documents,
#: chunks of their documents, their documents in the document's collection)
Usage = tuple[int, int, int]
#: a change of a document's uploaders: (uploader, co_uploaders, usage of each co-uploader or None) ->
#: the new pair, or None to leave them
UploadersChange = Callable[[str, tuple[str, ...], "dict[str, Usage] | None"], Any]


class _Refused(Exception):
    """Raised inside ``insert``'s transaction to roll it back: a limit checked last (``max_total_chunks``)."""


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
                problem = await self._limit_problem(con, meta, limits)
                if problem is not None:
                    return "quota", problem
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
                # last, so that the counter row is locked only from here to the commit (its trigger
                # adds this document's chunks then): uploads on every node check it one after another
                total = await con.fetchval("SELECT chunks FROM nplt_kb_totals FOR UPDATE")
                if total + meta["chunks"] > limits.max_total_chunks:
                    raise _Refused(_total_problem(total, meta["chunks"], limits))
                await publish_in(con, CHANNEL, {"op": "add", "doc": meta["doc_id"]})
            return "added", meta

        async def guarded(con: asyncpg.Connection) -> tuple[str, Any]:
            try:
                return await work(con)
            except _Refused as exc:            # (the transaction is rolled back: nothing written)
                return "quota", str(exc)
        return await self.link.run(guarded, write=True)

    @staticmethod
    async def _limit_problem(con: asyncpg.Connection, meta: dict[str, Any], limits: Limits) -> str | None:
        """Why the uploader may not add ``meta``'s document to its collection, or None; with the
        uploader's and the collection's locks held (what they hold cannot change meanwhile)."""
        user, coll = meta["uploader"], meta["collection"]
        used, held, mine = await con.fetchrow(
            "SELECT coalesce(sum(size), 0)::bigint, coalesce(sum(chunks), 0)::bigint, "
            "count(*) FILTER (WHERE collection = $2) FROM nplt_kb_documents WHERE uploader = $1", user, coll)
        if used + meta["size"] > limits.quota_bytes:
            return f"quota of {limits.quota_bytes} bytes reached ({used} used)"
        if held + meta["chunks"] > limits.max_chunks_per_user:
            return (f"your documents hold {held} chunks; this document's {meta['chunks']} would take you over the "
                    f"per-user limit (max_chunks_per_user = {limits.max_chunks_per_user})")
        count = await con.fetchval("SELECT count(*) FROM nplt_kb_documents WHERE collection = $1", coll)
        share = limits.max_documents_per_member
        if coll.startswith("group:") and mine + 1 > share:
            return (f"you uploaded {mine} of the {count} documents of {coll}, a member's share "
                    f"(max_documents_per_member = {share}): delete one of yours first")
        if count >= limits.max_documents:
            return (f"collection {coll} holds {count} documents (max_documents_per_collection = "
                    f"{limits.max_documents}), {mine} of them yours")
        total = await con.fetchval("SELECT chunks FROM nplt_kb_totals")   # (early, unlocked: checked again last)
        if total + meta["chunks"] > limits.max_total_chunks:
            return _total_problem(total, meta["chunks"], limits)
        return None

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

    async def update_uploaders(self, doc_id: str, change: UploadersChange, *,
                               with_usage: bool = False) -> dict[str, Any] | None:
        """Change a document's ``uploader`` and ``co_uploaders``: ``change(uploader, co_uploaders,
        usage)`` (pure, called with the row locked: ``SELECT ... FOR UPDATE``) gives the new pair, or
        None to leave them; a change is written and announced ({"op": "upd"}) in one transaction.
        ``with_usage``: first every co-uploader's advisory lock is taken (``insert``'s, sorted by
        name, so two hand-overs never wait for each other in a circle) and ``usage`` maps each to what
        they hold now (``Usage``): a change that passes the document to one of them is decided on
        numbers no upload or other hand-over can change before the commit; else ``usage`` is None.
        The row as it is afterwards (DOC_COLUMNS), None if the document is gone."""
        async def work(con: asyncpg.Connection) -> dict[str, Any] | None:
            async with con.transaction():
                row = await con.fetchrow(f"SELECT {DOC_COLUMNS} FROM nplt_kb_documents WHERE doc_id = $1 FOR UPDATE",
                                         doc_id)
                if row is None:
                    return None
                meta = dict(row)
                usage = None
                if with_usage:
                    usage = await self._usage(con, sorted(set(meta["co_uploaders"])), meta["collection"])
                new = change(meta["uploader"], tuple(meta["co_uploaders"]), usage)
                if new is None or (new[0], tuple(new[1])) == (meta["uploader"], tuple(meta["co_uploaders"])):
                    return meta
                await self._set_uploaders(con, doc_id, new[0], new[1])
                meta["uploader"], meta["co_uploaders"] = new[0], list(new[1])
                return meta
        return await self.link.run(work, write=True)

    @staticmethod
    async def _usage(con: asyncpg.Connection, members: list[str], collection: str) -> dict[str, Usage]:
        """Each of ``members`` locked (``insert``'s lock, in the given order) and what they hold."""
        for member in members:
            await con.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", *_lock_key("user", member))
        rows = await con.fetch(
            "SELECT uploader, coalesce(sum(size), 0)::bigint AS used, coalesce(sum(chunks), 0)::bigint AS held, "
            "count(*) FILTER (WHERE collection = $2) AS mine FROM nplt_kb_documents WHERE uploader = ANY($1) "
            "GROUP BY uploader", members, collection)
        found = {r["uploader"]: (r["used"], r["held"], r["mine"]) for r in rows}
        return {m: found.get(m, (0, 0, 0)) for m in members}

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


def _total_problem(total: int, chunks: int, limits: Limits) -> str:
    return (f"the knowledge base holds {total} chunks; this document's {chunks} would take it over the "
            f"server's limit (max_total_chunks = {limits.max_total_chunks})")


def _assemble(docs: list, chunks: list, vecs: list) -> list[StoredDocument]:
    """Documents from the rows of ``PgDocuments.read`` (JSON locations parsed, vectors as lists)."""
    by_doc: dict[str, list[dict[str, Any]]] = {}
    for r in chunks:
        by_doc.setdefault(r["doc_id"], []).append({"text": r["text"], "location": orjson.loads(r["location"])})
    vec_doc: dict[str, list[list[float]]] = {}
    for r in vecs:
        vec_doc.setdefault(r["doc_id"], []).append(list(r["v"]))
    return [StoredDocument(dict(d), by_doc.get(d["doc_id"], []), vec_doc.get(d["doc_id"])) for d in docs]
