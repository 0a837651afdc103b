"""Group co-uploaders over TCP, against a real server restarted on the same data directory (review
s32, kb-co): carol's duplicate upload into group:red is kept on disk, so after a restart alice's
delete keeps the document for carol and says so (``"kept_for": "carol"`` in the KB_DELETE reply;
``nplt-client kb delete`` prints it). Before: the co-uploaders lived in memory only, and after a
restart alice's delete removed what carol had been told was stored.
"""
from __future__ import annotations

import asyncio
import json

from client.main import main as client_main
from kb_wire.kbwire import connect, kb_server, raw_upload, token
from protocol import MsgType

MATRIX = b"# Escalation\n\nThe escalation matrix: on-call first, then the team lead, then the director.\n"


def _cli(addr, user: str, *args: str) -> int:
    return client_main(["--host", addr[0], "--port", str(addr[1]), "--token", token(user), *args])


async def test_a_restart_keeps_the_co_uploader_and_the_delete_reply_names_them(tmp_path):
    async with kb_server(tmp_path) as (_srv, addr):
        alice, carol = await connect(addr, "alice"), await connect(addr, "carol")    # both in group red
        mine = (await raw_upload(alice, "matrix.txt", MATRIX, collection="group:red"))["document"]
        dup = (await raw_upload(carol, "carols_matrix.txt", MATRIX, collection="group:red"))["document"]
        assert dup["duplicate"] and dup["doc_id"] == mine["doc_id"]
        await alice.close(), await carol.close()

    async with kb_server(tmp_path) as (srv, addr):                                   # restarted
        alice, carol = await connect(addr, "alice"), await connect(addr, "carol")
        reply = await alice.call(MsgType.KB_DELETE, doc_id=mine["doc_id"])
        [doc] = (await carol.call(MsgType.KB_LIST, collection="group:red"))["documents"]   # before: gone
        assert (doc["doc_id"], doc["uploader"]) == (mine["doc_id"], "carol")
        assert reply["deleted"] is True and reply["kept_for"] == "carol"             # before: no kept_for
        assert "co_uploaders" not in doc                                              # (the wire is unchanged)
        hits = (await carol.call(MsgType.KB_SEARCH, query="escalation matrix team lead"))["hits"]
        assert hits and hits[0]["doc_id"] == mine["doc_id"]
        reply = await carol.call(MsgType.KB_DELETE, doc_id=mine["doc_id"])          # the last uploader
        assert reply["deleted"] is True and "kept_for" not in reply
        assert (await carol.call(MsgType.KB_LIST, collection="group:red"))["documents"] == []
        await alice.close(), await carol.close()


async def test_kb_delete_prints_who_the_document_is_kept_for(tmp_path, capsys):
    async with kb_server(tmp_path) as (_srv, addr):
        alice, carol = await connect(addr, "alice"), await connect(addr, "carol")
        mine = (await raw_upload(alice, "matrix.txt", MATRIX, collection="group:red"))["document"]
        await raw_upload(carol, "copy.txt", MATRIX, collection="group:red")
        await alice.close(), await carol.close()
        capsys.readouterr()
        assert await asyncio.to_thread(_cli, addr, "alice", "kb", "delete", mine["doc_id"]) == 0
        out = capsys.readouterr().out
        assert out == f"deleted {mine['doc_id']} for you; kept for carol, who uploaded the same bytes\n"
        assert await asyncio.to_thread(_cli, addr, "carol", "kb", "delete", mine["doc_id"], "--json") == 0
        assert json.loads(capsys.readouterr().out) == {"doc_id": mine["doc_id"]}     # removed: no kept_for
        c = await connect(addr, "alice")
        other = (await raw_upload(c, "again.txt", MATRIX, collection="group:red"))["document"]
        await c.close()
        c = await connect(addr, "carol")
        await raw_upload(c, "again2.txt", MATRIX, collection="group:red")
        await c.close()
        assert await asyncio.to_thread(_cli, addr, "alice", "kb", "delete", other["doc_id"], "--json") == 0
        assert json.loads(capsys.readouterr().out) == {"doc_id": other["doc_id"], "kept_for": "carol"}
