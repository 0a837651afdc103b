"""migrate-json-to-pg brings the knowledge base along: documents uploaded to a JSON server are listed,
searched and downloaded with the same bytes, in the same collections, by a server on PostgreSQL; a
rerun copies nothing twice, an interrupted copy is finished by the next run, and a damaged copy is
reported."""
from __future__ import annotations

import asyncio
import hashlib
import json

import asyncpg

from client import kb as kbclient
from client.connection import Client
from protocol import MsgType
from server.knowledge.store import collection_key
from server.migrate import main
from testkit.server import running_server

from kb_wire.kbwire import auth_section, token

NOTES = ("# Ports\n\nThe metrics exporter listens on port 9100 by default.\n\n"
         "## Alerts\n\nThe alertmanager webhook retries every 30 seconds.\n").encode()
RUNBOOK = "# 恢复\n\n数据库恢复超时是 45 分钟。\n\nThe restore timeout is 45 minutes.\n".encode()
# over two blocks of 1 MiB in PostgreSQL
BIG = b"".join(b"%07d disk usage on node-%d is %d percent\n" % (i, i % 5, i % 100) for i in range(60_000))


async def _upload(addr, user: str, path, collection: str | None = None):
    async with Client(*addr, token=token(user)) as c:
        return await kbclient.upload(c, path, collection=collection)


async def _documents(addr, user: str) -> dict[str, tuple[str, str, int, str]]:
    async with Client(*addr, token=token(user)) as c:
        return {d.doc_id: (d.name, d.collection, d.size, d.md5) for d in await kbclient.list_documents(c)}


async def _migrate(root, url: str, capsys) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, ["--data-dir", str(root), "--storage-url", url])
    out = capsys.readouterr()
    return code, out.out, out.err


async def test_the_knowledge_base_is_copied_found_and_downloaded_with_the_same_bytes(tmp_path, pg_url, capsys):
    files = {"notes.md": NOTES, "runbook.md": RUNBOOK, "usage.log": BIG}
    for name, body in files.items():
        (tmp_path / name).write_bytes(body)
    sections = {"auth": auth_section()}
    async with running_server(tmp_path / "json", sections=sections) as (_srv, addr):
        docs = {"alice": [await _upload(addr, "alice", tmp_path / "notes.md"),
                          await _upload(addr, "alice", tmp_path / "runbook.md", collection="red")],
                "bob": [await _upload(addr, "bob", tmp_path / "usage.log")]}
        before = {user: await _documents(addr, user) for user in ("alice", "bob", "carol")}
    root = tmp_path / "json" / "history"
    assert (root / "knowledge" / "c").is_dir()

    code, out, err = await _migrate(root, pg_url, capsys)
    assert code == 0, err
    size = len(NOTES) + len(RUNBOOK) + len(BIG)
    assert f"knowledge base: 3 documents: 3 copied ({size} bytes), 0 already in PostgreSQL" in out
    assert "verified: counts match" in out

    async with running_server(tmp_path / "pg", sections=sections, storage={"url": pg_url}) as (_srv, addr):
        for user in ("alice", "bob", "carol"):                  # carol reads alice's group collection
            assert await _documents(addr, user) == before[user]
        assert before["carol"] and set(before["carol"]) == {docs["alice"][1].doc_id}
        for user, theirs in docs.items():
            for doc in theirs:
                out_path = tmp_path / "down" / user / doc.name
                out_path.parent.mkdir(parents=True, exist_ok=True)
                async with Client(*addr, token=token(user)) as c:
                    got = await kbclient.download(c, doc.doc_id, out_path)
                assert out_path.read_bytes() == files[doc.name]
                assert got.md5 == hashlib.md5(files[doc.name]).hexdigest()
        async with Client(*addr, token=token("alice")) as c:
            hits = (await c.request(MsgType.KB_SEARCH, {"query": "alertmanager webhook retries"})).hits
            assert hits and hits[0].doc_id == docs["alice"][0].doc_id
            hits = (await c.request(MsgType.KB_SEARCH, {"query": "数据库恢复超时"})).hits
            assert hits and hits[0].doc_id == docs["alice"][1].doc_id
            again = await kbclient.upload(c, tmp_path / "notes.md")   # the same bytes: known there
            assert again.duplicate and again.doc_id == docs["alice"][0].doc_id

    code, out, err = await _migrate(root, pg_url, capsys)      # a rerun copies nothing
    assert code == 0, err
    assert "knowledge base: 3 documents: 0 copied (0 bytes), 3 already in PostgreSQL" in out


async def test_an_interrupted_copy_is_finished_by_the_next_run_and_damage_is_reported(tmp_path, pg_url, capsys):
    (tmp_path / "notes.md").write_bytes(NOTES)
    (tmp_path / "usage.log").write_bytes(BIG)
    async with running_server(tmp_path / "json", sections={"auth": auth_section()}) as (_srv, addr):
        notes = await _upload(addr, "alice", tmp_path / "notes.md")
        usage = await _upload(addr, "bob", tmp_path / "usage.log")
    root = tmp_path / "json" / "history"
    vectors = [[0.25, -1.0, 0.5]] * notes.chunks           # (as with embeddings configured)
    doc_dir = root / "knowledge" / "c" / collection_key("user:alice") / notes.doc_id
    (doc_dir / "vectors.json").write_text(json.dumps(vectors))
    # files copied in beside the collections and the documents (a .DS_Store) are no documents:
    # skipped (before: a traceback, or a MISMATCH on every rerun)
    (root / "knowledge" / "c" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (doc_dir.parent / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    code, out, err = await _migrate(root, pg_url, capsys)
    assert code == 0, err
    assert "knowledge base: 2 documents: 2 copied" in out

    con = await asyncpg.connect(pg_url)
    try:
        assert await con.fetchval("SELECT count(*) FROM nplt_kb_vectors WHERE doc_id = $1", notes.doc_id) \
            == notes.chunks
        # as if the run had stopped before bob's document (its rows go with it)
        await con.execute("DELETE FROM nplt_kb_documents WHERE doc_id = $1", usage.doc_id)
        code, out, err = await _migrate(root, pg_url, capsys)
        assert code == 0, err
        assert f"knowledge base: 2 documents: 1 copied ({len(BIG)} bytes), 1 already in PostgreSQL" in out
        assert await con.fetchval("SELECT sum(octet_length(data)) FROM nplt_kb_blocks WHERE doc_id = $1",
                                  usage.doc_id) == len(BIG)

        await con.execute("DELETE FROM nplt_kb_chunks WHERE doc_id = $1 AND ordinal = 0", notes.doc_id)
        await con.execute("DELETE FROM nplt_kb_blocks WHERE doc_id = $1 AND seq = 1", usage.doc_id)
        code, out, err = await _migrate(root, pg_url, capsys)
        assert code == 1
        assert "2 mismatches" in out
        assert f"MISMATCH knowledge document {notes.doc_id} (notes.md): " in err and "chunks" in err
        assert f"MISMATCH knowledge document {usage.doc_id} (usage.log): {len(BIG)} bytes in the files" in err
    finally:
        await con.close()
