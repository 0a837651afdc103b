"""The knowledge base of a cluster (issue 17 item 1): two real server nodes on one PostgreSQL
database. A document uploaded over TCP on node A is listed, searched and downloaded on node B (the
``nplt-client kb`` commands), and deleting it on A removes it on B."""
from __future__ import annotations

import asyncio
import hashlib
import json

from client import kb as kbclient
from client.connection import Client
from client.main import main
from testkit.server import poll

DEADLINE_S = 15.0
NOTES = ("# Ports\n\nThe metrics exporter listens on port 9100 by default.\n\n"
         "## Alerts\n\nThe alertmanager webhook retries every 30 seconds.\n").encode()


async def cli(capsys, srv, *args: str) -> tuple[int, str, str]:
    """``nplt-client --host H --port P ARGS`` (its own event loop, in a worker thread)."""
    code = await asyncio.to_thread(main, ["--host", srv.host, "--port", str(srv.port), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


async def test_a_document_uploaded_on_node_a_is_served_by_node_b(two_nodes, tmp_path, capsys):
    a, b = two_nodes
    src = tmp_path / "notes.md"
    src.write_bytes(NOTES)
    async with Client(a.host, a.port) as c:
        doc = await kbclient.upload(c, src)
    assert doc.md5 == hashlib.md5(NOTES).hexdigest() and not doc.duplicate

    async def listed_on_b():
        code, out, err = await cli(capsys, b, "kb", "list", "--json")
        assert code == 0, err
        return [d for d in json.loads(out)["documents"] if d["doc_id"] == doc.doc_id]
    [listed] = await poll(listed_on_b, DEADLINE_S, "node B lists the document")
    assert listed["name"] == "notes.md" and listed["size"] == len(NOTES)

    code, out, err = await cli(capsys, b, "kb", "search", "alertmanager webhook retries", "--json")
    hits = json.loads(out)["hits"]
    assert code == 0 and hits[0]["doc_id"] == doc.doc_id and "30 seconds" in hits[0]["text"]

    target = tmp_path / "down" / "copy.md"
    target.parent.mkdir()
    code, out, err = await cli(capsys, b, "kb", "download", doc.doc_id, "-o", str(target))
    assert code == 0, err
    assert target.read_bytes() == NOTES

    async with Client(b.host, b.port) as c:                      # the same bytes on B: a duplicate
        again = await kbclient.upload(c, src)
    assert again.duplicate and again.doc_id == doc.doc_id

    code, out, err = await cli(capsys, a, "kb", "delete", doc.doc_id)
    assert code == 0, err

    async def gone_on_b():
        code, out, _ = await cli(capsys, b, "kb", "list", "--json")
        return code == 0 and json.loads(out)["documents"] == []
    await poll(gone_on_b, DEADLINE_S, "node B forgets the deleted document")
    code, out, err = await cli(capsys, b, "kb", "download", doc.doc_id, "-o", str(tmp_path / "down" / "x.md"))
    assert code != 0 and "NOT_FOUND" in err


async def test_a_download_on_node_b_resumes_across_blocks(two_nodes, tmp_path):
    a, b = two_nodes
    body = b"".join(b"%07d disk usage on node-%d is %d percent\n" % (i, i % 5, i % 100) for i in range(70_000))
    assert len(body) > 2 * (1 << 20)                    # three blocks of 1 MiB in PostgreSQL
    src = tmp_path / "usage.log"
    src.write_bytes(body)
    async with Client(a.host, a.port) as c:
        doc = await kbclient.upload(c, src)
    await poll(lambda: _known(b, doc.doc_id), DEADLINE_S, "node B knows the document")
    out = tmp_path / "out" / "usage.log"
    out.parent.mkdir()
    out.with_name("usage.log.part").write_bytes(body[:(1 << 20) + 12345])    # a download cut short
    out.with_name("usage.log.part.json").write_text(json.dumps({"doc_id": doc.doc_id}))   # (its sidecar)
    async with Client(b.host, b.port) as c:
        got = await kbclient.download(c, doc.doc_id, out)
    assert got.md5 == hashlib.md5(body).hexdigest() and out.read_bytes() == body


async def _known(srv, doc_id: str) -> bool:
    return any(d.doc_id == doc_id for d in await srv.services.knowledge.list("local", []))


async def test_an_upload_cut_on_node_a_resumes_through_node_b(tmp_path, pg_url):
    """A client sends part of a file to node A and loses the connection; its BEGIN on node B answers
    the offset of what node A shared (pieces of upload_share_bytes, and the rest at the disconnect),
    and the file completes there. The shared copy goes when the upload ends."""
    from kb_wire.kbwire import md5, send_data
    from protocol import MsgType
    from testkit.server import V3Client

    from .conftest import node
    body = b"".join(b"%07d restore step %d takes %d seconds\n" % (i, i % 7, i % 90) for i in range(40_000))
    size, share = len(body), 1 << 16
    sections = {"knowledge": {"upload_share_bytes": share}}
    async with node(tmp_path, pg_url, "a", sections=sections) as a, node(tmp_path, pg_url, "b", sections=sections) as b:
        begin_body = {"name": "restore.log", "size": size, "md5": md5(body)}
        ca = await V3Client.connect((a.host, a.port))
        begin = await ca.call(MsgType.KB_UPLOAD_BEGIN, **begin_body)
        assert begin["offset"] == 0
        cut = 5 * share + 12_345                           # five whole pieces and a part of the sixth
        send_data(ca, begin["handle"], 0, body[:cut])
        await ca.wait_for(lambda m: m.type == MsgType.KB_PROGRESS and m.body["done"] == cut)
        await ca.close()                                   # the connection is lost
        parts = a.services.uploads.sharing.parts

        async def all_shared() -> bool:
            return await parts.extent(begin["upload_id"]) == cut
        await poll(all_shared, DEADLINE_S, "node A shares what it had at the disconnect")

        cb = await V3Client.connect((b.host, b.port))
        again = await cb.call(MsgType.KB_UPLOAD_BEGIN, **begin_body)
        assert again["upload_id"] == begin["upload_id"] and again["offset"] == cut
        send_data(cb, again["handle"], cut, body[cut:])
        end = await cb.call(MsgType.KB_UPLOAD_END, upload_id=again["upload_id"])
        assert end["document"]["md5"] == md5(body) and end["document"]["size"] == size
        assert await parts.extent(begin["upload_id"]) == 0          # the shared copy is gone
        await cb.close()
