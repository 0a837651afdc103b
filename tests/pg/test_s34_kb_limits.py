"""Knowledge-base limits on PostgreSQL held across nodes (review s34, brief PG items 1 and 2). Two
KnowledgeBases on one embedded PostgreSQL stand for two nodes.

1. ``max_documents_per_member``, ``max_chunks_per_user`` and ``max_total_chunks`` are checked in the
   insert's transaction (``PgDocuments.insert``, under the uploader's and the collection's advisory
   locks; the server-wide count in the counter row ``nplt_kb_totals``). Before, only the node's
   in-memory catalog checked them: a document staged on a node whose catalog did not know of the
   other node's uploads yet was stored past the limit (8 of a member's share of 2 when uploads ran
   on two nodes at once).
2. A hand-over (an uploader's delete passing a group document to a co-uploader) reads the taker's
   bytes, chunks and documents in the collection in SQL, under the taker's lock, in the transaction
   of the change (``update_uploaders(with_usage=True)``). Before, two hand-overs at once on two
   nodes both read their node's catalog and pushed the co-uploader past their share.
"""
from __future__ import annotations

import asyncio

import asyncpg
import pytest

from pg.test_kb_pg import config, pg_kb, staged
from protocol import ErrorCode
from server.errors import HandlerError

RED = ["red"]


def doc(i: int, paragraphs: int = 2) -> bytes:
    body = "\n\n".join(f"## Section {j}\n\n" + f"Document {i} paragraph {j} says the backup host is db-{i}-{j}. " * 3
                       for j in range(paragraphs))
    return f"# Doc {i}\n\n{body}\n".encode()


async def _rows(url: str, sql: str, *args):
    con = await asyncpg.connect(url)
    try:
        return await con.fetch(sql, *args)
    finally:
        await con.close()


async def _commit_refused(kb, st) -> str:
    with pytest.raises(HandlerError) as refused:
        await kb.store.commit(*st, kb)
    assert refused.value.code == ErrorCode.QUOTA_EXCEEDED
    return refused.value.message


async def test_a_members_share_holds_for_a_document_staged_before_another_nodes_uploads(pg_url, tmp_path):
    cfg = config(max_documents_per_member=2)
    async with pg_kb(pg_url, tmp_path / "a", cfg) as a, pg_kb(pg_url, tmp_path / "b", cfg) as b:
        late = await staged(b, "alice", "late.md", doc(9), "group:red")       # B's catalog: alice holds none
        await a.ingest("alice", RED, "red", "one.md", doc(1))
        await a.ingest("alice", RED, "red", "two.md", doc(2))
        message = await _commit_refused(b, late)                              # before: stored, 3 of a share of 2
        assert "max_documents_per_member = 2" in message and "you uploaded 2" in message
    [row] = await _rows(pg_url, "SELECT count(*) AS n FROM nplt_kb_documents WHERE uploader = 'alice'")
    assert row["n"] == 2


async def test_the_per_user_chunk_limit_holds_for_a_document_staged_before_another_nodes_uploads(pg_url, tmp_path):
    cfg = config(max_chunks_per_user=5)
    async with pg_kb(pg_url, tmp_path / "a", cfg) as a, pg_kb(pg_url, tmp_path / "b", cfg) as b:
        late = await staged(b, "alice", "late.md", doc(9))                    # B's catalog: alice holds none
        assert len(late[0].chunks) == 2
        one = await a.ingest("alice", RED, "red", "one.md", doc(1))
        two = await a.ingest("alice", [], None, "two.md", doc(2))
        assert one.chunks + two.chunks == 4
        message = await _commit_refused(b, late)                              # before: stored, 6 of 5
        assert "max_chunks_per_user = 5" in message and "hold 4 chunks" in message
    [row] = await _rows(pg_url, "SELECT sum(chunks) AS c FROM nplt_kb_documents WHERE uploader = 'alice'")
    assert row["c"] == 4


async def test_uploads_on_two_nodes_at_once_stay_within_a_members_share(pg_url, tmp_path):
    cfg = config(max_documents_per_member=2)
    async with pg_kb(pg_url, tmp_path / "a", cfg) as a, pg_kb(pg_url, tmp_path / "b", cfg) as b:
        nodes = (a, b)
        done = await asyncio.gather(*(nodes[i % 2].ingest("alice", RED, "red", f"d{i}.md", doc(i)) for i in range(8)),
                                    return_exceptions=True)
        refused = [r for r in done if isinstance(r, HandlerError)]
        assert all(r.code == ErrorCode.QUOTA_EXCEEDED for r in refused), done
        [row] = await _rows(pg_url, "SELECT count(*) AS n FROM nplt_kb_documents WHERE uploader = 'alice' "
                                    "AND collection = 'group:red'")
        assert row["n"] == 2 and len(refused) == 6                            # before: up to 8 stored


async def test_max_total_chunks_holds_across_nodes_through_the_counter_row(pg_url, tmp_path):
    probe = config()
    async with pg_kb(pg_url, tmp_path / "p", probe) as p:
        one = await p.ingest("zed", [], None, "probe.md", doc(0))
        await p.delete("zed", [], one.doc_id)
    cfg = config(max_total_chunks=2 * one.chunks + 1)
    async with pg_kb(pg_url, tmp_path / "a", cfg) as a, pg_kb(pg_url, tmp_path / "b", cfg) as b:
        late = await staged(b, "carol", "late.md", doc(2))                    # B's catalog: the index is empty
        await a.ingest("alice", [], None, "a.md", doc(1))
        await a.ingest("dave", [], None, "d.md", doc(3))
        message = await _commit_refused(b, late)                              # before: stored, over the limit
        assert "max_total_chunks" in message
        [row] = await _rows(pg_url, "SELECT (SELECT chunks FROM nplt_kb_totals) AS counted, "
                                    "(SELECT sum(chunks) FROM nplt_kb_documents) AS held")
        assert row["counted"] == row["held"] == 2 * one.chunks                # the counter follows inserts
        gone = (await a.list("alice", []))[0]
        await a.delete("alice", [], gone.doc_id)
        [row] = await _rows(pg_url, "SELECT chunks FROM nplt_kb_totals")
        assert row["chunks"] == one.chunks                                    # ... and deletes
        await b.store.commit(*(await staged(b, "carol", "now.md", doc(2))), b)   # room again


async def _handover_setup(a, b, url: str, texts: dict[str, bytes]):
    """bob holds B1 in group:red; alice uploaded X (node A), carol Y (node B); bob co-uploaded both."""
    await a.ingest("bob", RED, "red", "b1.md", texts["b1"])
    x = await a.ingest("alice", RED, "red", "x.md", texts["x"])
    y = await b.ingest("carol", RED, "red", "y.md", texts["y"])
    assert (await b.ingest("bob", RED, "red", "x-copy.md", texts["x"])).duplicate
    assert (await a.ingest("bob", RED, "red", "y-copy.md", texts["y"])).duplicate
    rows = await _rows(url, "SELECT co_uploaders FROM nplt_kb_documents WHERE doc_id = ANY($1)", [x.doc_id, y.doc_id])
    assert [list(r["co_uploaders"]) for r in rows] == [["bob"], ["bob"]]
    return x, y


async def _bob_after_two_handovers_at_once(pg_url, tmp_path, cfg, texts):
    async with pg_kb(pg_url, tmp_path / "a", cfg) as a, pg_kb(pg_url, tmp_path / "b", cfg) as b:
        x, y = await _handover_setup(a, b, pg_url, texts)
        kept = await asyncio.gather(a.delete("alice", RED, x.doc_id), b.delete("carol", RED, y.doc_id))
        rows = await _rows(pg_url, "SELECT doc_id, uploader, size FROM nplt_kb_documents WHERE collection = 'group:red'")
        return kept, rows, (x, y)


async def test_two_handovers_at_once_on_two_nodes_keep_the_takers_share(pg_url, tmp_path):
    texts = {"b1": b"# B1\n\nbob's own runbook about nginx.\n", "x": b"# X\n\nalice's runbook: the backup is db-7.\n",
             "y": b"# Y\n\ncarol's runbook: the cache host is redis-3.\n"}
    kept, rows, (x, y) = await _bob_after_two_handovers_at_once(pg_url, tmp_path, config(max_documents_per_member=2),
                                                                 texts)
    bobs = [r["doc_id"] for r in rows if r["uploader"] == "bob"]
    assert len(bobs) == 2                                                     # before: 3 (both passed to bob)
    assert sum(k is not None for k in kept) == 1                             # one passed on, the other removed
    assert {r["doc_id"] for r in rows} & {x.doc_id, y.doc_id} == {k.doc_id for k in kept if k is not None}


async def test_two_handovers_at_once_on_two_nodes_keep_the_takers_byte_quota(pg_url, tmp_path):
    texts = {"b1": b"# B1\n\n" + b"bob's own runbook about nginx. " * 4 + b"\n",
             "x": b"# X\n\n" + b"alice's runbook: the backup is db-7. " * 3 + b"\n",
             "y": b"# Y\n\n" + b"carol's runbook: the cache host is redis-3. " * 3 + b"\n"}
    quota = len(texts["b1"]) + max(len(texts["x"]), len(texts["y"])) + 10    # room for one of X and Y, not both
    assert quota < len(texts["b1"]) + len(texts["x"]) + len(texts["y"])
    cfg = config(user_quota_bytes=quota)
    kept, rows, _ = await _bob_after_two_handovers_at_once(pg_url, tmp_path, cfg, texts)
    held = sum(r["size"] for r in rows if r["uploader"] == "bob")
    assert held <= quota                                                      # before: over it (315 of 300)
    assert sum(k is not None for k in kept) == 1
