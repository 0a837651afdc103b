"""Group co-uploaders on PostgreSQL (review s32, kb-co): two KnowledgeBases on one database stand for
two nodes. Carol's duplicate upload on node B is recorded in the row (``co_uploaders``, migration
0013) and announced ("upd"); alice's delete on node A then keeps the document for carol, on both
nodes and after a restart. Before: nothing was recorded on PostgreSQL, and alice's delete removed
what carol had been told was stored. Co-uploads on two nodes at once are both kept (the row lock).
"""
from __future__ import annotations

import asyncio
import json

import asyncpg

from pg.test_kb_pg import DEADLINE_S, RUNBOOK, pg_kb
from server.knowledge import KnowledgeBase
from server.knowledge.pg_store import copy_documents
from storage.config import StorageConfig
from storage.pg.link import PgLink
from testkit.server import poll

GROUPS = ["red"]


async def _row(url: str, doc_id: str) -> tuple[str, list[str]] | None:
    con = await asyncpg.connect(url)
    try:
        r = await con.fetchrow("SELECT uploader, co_uploaders FROM nplt_kb_documents WHERE doc_id = $1", doc_id)
    finally:
        await con.close()
    return None if r is None else (r["uploader"], list(r["co_uploaders"]))


async def _sees(kb: KnowledgeBase, doc_id: str, uploader: str, co: tuple[str, ...], what: str) -> None:
    async def check() -> bool:
        info = kb._docs.get(doc_id)
        return info is not None and (info.uploader, info.co_uploaders) == (uploader, co)
    await poll(check, DEADLINE_S, what)


async def test_a_duplicate_on_node_b_keeps_the_document_when_alice_deletes_it_on_node_a(pg_url, tmp_path):
    async with pg_kb(pg_url, tmp_path / "a") as a, pg_kb(pg_url, tmp_path / "b") as b:
        info = await a.ingest("alice", GROUPS, "red", "runbook.md", RUNBOOK)
        dup = await b.ingest("carol", GROUPS, "red", "copy.md", RUNBOOK)    # (B may not have loaded it yet)
        assert dup.duplicate and dup.doc_id == info.doc_id

        async def heard() -> bool:                                            # before: never (not recorded)
            return a.co_uploaders(info.doc_id) == b.co_uploaders(info.doc_id) == ("carol",)
        await poll(heard, DEADLINE_S, "both nodes record carol's upload")
        await _sees(a, info.doc_id, "alice", ("carol",), "node A hears of carol's upload")
        assert await _row(pg_url, info.doc_id) == ("alice", ["carol"])

        kept = await a.delete("alice", GROUPS, info.doc_id)
        assert kept is not None and kept.uploader == "carol"                  # before: None, removed
        assert await _row(pg_url, info.doc_id) == ("carol", [])
        await _sees(b, info.doc_id, "carol", (), "node B sees the document passed to carol")
        for node in (a, b):
            [doc] = await node.list("carol", GROUPS)
            assert (doc.doc_id, doc.uploader) == (info.doc_id, "carol")
            assert node.usage("carol") == info.size and node.usage("alice") == 0
            assert (await node.search("carol", GROUPS, "promote the replica", 1))[0].doc_id == info.doc_id

    async with pg_kb(pg_url, tmp_path / "a") as a:                           # a restart reads the row
        [doc] = await a.list("carol", GROUPS)
        assert (doc.uploader, doc.co_uploaders) == ("carol", ())
        assert await a.delete("carol", GROUPS, info.doc_id) is None           # the last uploader removes it
        assert await _row(pg_url, info.doc_id) is None


async def test_co_uploads_on_two_nodes_at_once_are_both_kept_and_withdrawn_one_by_one(pg_url, tmp_path):
    async with pg_kb(pg_url, tmp_path / "a") as a, pg_kb(pg_url, tmp_path / "b") as b:
        info = await a.ingest("alice", GROUPS, "red", "runbook.md", RUNBOOK)

        async def on_b() -> bool:
            return info.doc_id in b._docs
        await poll(on_b, DEADLINE_S, "node B loads the document")
        x, y = await asyncio.gather(a.ingest("bob", GROUPS, "red", "b.md", RUNBOOK),
                                    b.ingest("carol", GROUPS, "red", "c.md", RUNBOOK))
        assert x.duplicate and y.duplicate
        uploader, co = await _row(pg_url, info.doc_id)
        assert uploader == "alice" and sorted(co) == ["bob", "carol"]         # neither overwrote the other
        for node in (a, b):
            await _sees(node, info.doc_id, "alice", tuple(co), "both nodes agree on the co-uploaders")

        withdrawn = await b.delete("bob", GROUPS, info.doc_id)                # a co-uploader withdraws
        assert withdrawn is not None and withdrawn.uploader == "alice"
        rest = tuple(u for u in co if u != "bob")
        await _sees(a, info.doc_id, "alice", rest, "node A hears bob withdrew")
        assert (await a.delete("alice", GROUPS, info.doc_id)).uploader == "carol"
        await _sees(b, info.doc_id, "carol", (), "node B sees it passed to carol")
        assert await b.delete("carol", GROUPS, info.doc_id) is None

        async def gone() -> bool:
            return info.doc_id not in a._docs and info.doc_id not in b._docs
        await poll(gone, DEADLINE_S, "both nodes drop the document")


async def test_the_json_to_postgresql_copy_keeps_the_co_uploaders(pg_url, tmp_path):
    from server.knowledge import KnowledgeConfig
    files = KnowledgeBase(KnowledgeConfig(chunk_target_chars=200, chunk_overlap_chars=40), tmp_path / "files")
    await files.start()
    try:
        info = await files.ingest("alice", GROUPS, "red", "runbook.md", RUNBOOK)
        await files.ingest("carol", GROUPS, "red", "copy.md", RUNBOOK)
    finally:
        await files.close()
    [meta] = list((tmp_path / "files" / "c").glob(f"*/{info.doc_id}/meta.json"))
    assert json.loads(meta.read_bytes())["co_uploaders"] == ["carol"]
    link = PgLink(StorageConfig(url=pg_url))
    await link.open()
    try:
        report = await copy_documents(tmp_path / "files", link)
    finally:
        await link.close()
    assert report.copied == 1 and not report.mismatches
    assert await _row(pg_url, info.doc_id) == ("alice", ["carol"])
    async with pg_kb(pg_url, tmp_path / "a") as a:
        assert (await a.delete("alice", GROUPS, info.doc_id)).uploader == "carol"
