"""A node SIGKILLed in the middle of an ingest on PostgreSQL (issue 17 item 1): the document exists
whole on the other nodes, or not at all (no row in any table), and the dead node's staging files are
cleared when it starts again. The dying node is a real process: the knowledge base on the shared
database stopped at each step of the ingest (inside the transaction too), and a real ``nplt-server``
killed on its own progress events."""
from __future__ import annotations

import asyncio
import hashlib
import signal
import textwrap

import asyncpg
import pytest

from kb_wire.kbwire import md5, send_data
from kb_wire.test_server_crash import at
from protocol import MsgType
from server.knowledge import KnowledgeBase, KnowledgeConfig
from server.knowledge.pg_store import PgDocumentStore, pg_limits
from storage.config import StorageConfig
from storage.pg.link import PgLink
from testkit.process import ServerProcess, kill_at_point
from testkit.server import V3Client

from cluster.conftest import node

DOC = ("# Failover\n\n" + "".join(f"Step {i}: promote replica {i} and check lag.\n\n" for i in range(400))).encode()

CHILD = textwrap.dedent('''
    import asyncio, sys
    from server.knowledge import KnowledgeBase, KnowledgeConfig
    from server.knowledge import kb as kb_module
    from server.knowledge.pg_store import PgDocumentStore, pg_limits
    from storage.config import StorageConfig
    from storage.pg import documents
    from storage.pg.link import PgLink

    point, url, root, path = sys.argv[1:5]

    def halt(tag):
        print(tag, flush=True)
        sys.stdin.readline()                 # blocks (the event loop too) until the parent kills us

    if point == "parsing":
        real_parse = kb_module.parse
        def parse(*a, **k):
            halt(point)
            return real_parse(*a, **k)
        kb_module.parse = parse
    elif point == "rows-written":            # inside the transaction: blocks and chunks sent, no COMMIT
        real_rows = documents.PgDocuments._write_rows
        async def write_rows(self, *a, **k):
            await real_rows(self, *a, **k)
            halt(point)
        documents.PgDocuments._write_rows = write_rows

    async def main():
        cfg = KnowledgeConfig()
        link = PgLink(StorageConfig(url=url))
        await link.open()
        kb = KnowledgeBase(cfg, None, store=PgDocumentStore(link, root, pg_limits(cfg)))
        await kb.start()
        await kb.ingest("alice", [], None, "failover.md", path)
        halt("committed")

    asyncio.run(main())
''')


async def count_rows(url: str) -> dict[str, int]:
    con = await asyncpg.connect(url)
    try:
        return {t: await con.fetchval(f"SELECT count(*) FROM nplt_kb_{t}") for t in ("documents", "chunks", "blocks")}
    finally:
        await con.close()


@pytest.mark.parametrize("point", ["parsing", "rows-written", "committed"])
async def test_sigkill_mid_ingest_leaves_the_document_whole_or_absent(tmp_path, pg_url, point):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    src = tmp_path / "failover.md"
    src.write_bytes(DOC)
    root = tmp_path / "node"
    kill_at_point(script, point, pg_url, str(root), str(src), point=point)
    committed = point == "committed"
    rows = await count_rows(pg_url)                 # PostgreSQL rolled back the dead connection's work
    assert rows["documents"] == (1 if committed else 0)
    if not committed:
        assert rows == {"documents": 0, "chunks": 0, "blocks": 0}
    cfg = KnowledgeConfig()
    link = PgLink(StorageConfig(url=pg_url))
    await link.open()
    kb = KnowledgeBase(cfg, None, store=PgDocumentStore(link, root, pg_limits(cfg)))   # the node restarts
    await kb.start()
    try:
        assert not list((root / "tmp").iterdir())     # its staging debris is cleared
        docs = await kb.list("alice", [])
        assert len(docs) == (1 if committed else 0)
        if committed:
            info = docs[0]
            _, f = await kb.open_document("alice", [], info.doc_id)
            data = await asyncio.to_thread(lambda: b"".join(iter(lambda: f.read(1 << 16), b"")))
            f.close()
            assert hashlib.md5(data).hexdigest() == info.md5 == hashlib.md5(DOC).hexdigest()
            assert len(kb.index) == info.chunks == rows["chunks"] > 1
            assert (await kb.search("alice", [], "promote replica 399", 1))[0].doc_id == info.doc_id
        again = await kb.ingest("alice", [], None, "failover.md", DOC)     # the upload can simply be retried
        assert again.duplicate == committed
    finally:
        await kb.close()
        await link.close()


@pytest.mark.parametrize("stage", ["parsing", "indexing-done"])
async def test_a_server_node_killed_mid_upload_leaves_the_other_node_whole_or_nothing(tmp_path, pg_url, stage):
    """A real ``nplt-server`` node A is SIGKILLed while it ingests an upload (on its own KB_PROGRESS
    events: while parsing, or once the document is committed); node B, alive all along, then has
    the whole document or none, and A's restart clears its staging files."""
    body = ("# Fleet manual\n\n" + "".join(
        f"## Host {i}\n\nHost {i} runs the ingest worker {i % 17}; its window opens at {i % 24:02d}:00.\n\n"
        for i in range(5_000))).encode()
    data_dir = tmp_path / "a"
    server = await ServerProcess.start(data_dir, "--storage-url", pg_url)
    try:
        c = await V3Client.connect(server.addr)
        begin = await c.call(MsgType.KB_UPLOAD_BEGIN, name="fleet.md", size=len(body), md5=md5(body))
        send_data(c, begin["handle"], 0, body)
        c.send(MsgType.KB_UPLOAD_END, {"id": c.next_id(), "upload_id": begin["upload_id"]})
        await c.wait_for(at(stage), timeout=120)
        server.kill()                                            # SIGKILL, mid-ingest
        assert server.proc.returncode == -signal.SIGKILL
        await c.close()
    finally:
        server.kill()
    committed = stage == "indexing-done"
    assert (await count_rows(pg_url))["documents"] == (1 if committed else 0)
    async with node(tmp_path, pg_url, "b") as b:
        docs = await b.services.knowledge.list("local", [])
        assert len(docs) == (1 if committed else 0)
        if committed:
            _, f = await b.services.knowledge.open_document("local", [], docs[0].doc_id)
            data = await asyncio.to_thread(f.read)
            f.close()
            assert data == body
            hits = await b.services.knowledge.search("local", [], "Host 4321 window", 1)
            assert hits[0].doc_id == docs[0].doc_id
    server = await ServerProcess.start(data_dir, "--storage-url", pg_url)       # A comes back
    try:
        assert not list((data_dir / "knowledge" / "tmp").iterdir())
    finally:
        await server.stop()
