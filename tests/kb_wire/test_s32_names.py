"""Review s32 knowledge-base fixes over TCP, against a real server:

- names with invisible or blank-drawing characters, or full-width brackets, are refused at
  KB_UPLOAD_BEGIN (before: ``run\\u3164book.md`` was stored; ``runbook.md\\u3164§Backup.txt`` was
  cited as ``[runbook.mdㅤ§Backup.txt §line 1]``);
- a coloured log and a UTF-16 file without a BOM are stored (before: "binary content in a text file");
- ``[knowledge] max_total_chunks`` refuses the upload that would pass it, at KB_UPLOAD_END;
- in a group, the uploader's delete of a document another member uploaded too keeps it for them
  (before: bob's upload, answered "duplicate", vanished when alice deleted "her" document).
"""
from __future__ import annotations

import pytest

from kb_wire.kbwire import connect, kb_server, md5, raw_upload
from protocol import MsgType
from testkit.server import ReplyError


async def test_invisible_and_blank_names_are_refused_at_begin(tmp_path):
    data = b"restart the proxy with systemctl\n"
    async with kb_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        for name, expect in (("run\u3164book.md", "U+3164"), ("run\u034fbook.md", "U+034F"),
                             ("run\u2800book.md", "U+2800"), ("runbook.md\u3164§Backup.txt", "U+3164"),
                             ("x］ ［runbook.md", "citation")):
            with pytest.raises(ReplyError) as exc:
                await c.call(MsgType.KB_UPLOAD_BEGIN, name=name, size=len(data), md5=md5(data))
            assert exc.value.code == "INVALID_MESSAGE" and expect in exc.value.body["message"]
        ok = await raw_upload(c, "会議資料\u3000第2版 ❤\ufe0f.txt", data)
        assert ok["document"]["name"] == "会議資料\u3000第2版 ❤\ufe0f.txt"
        assert len((await c.call(MsgType.KB_LIST))["documents"]) == 1
        await c.close()


async def test_a_coloured_log_and_bomless_utf16_are_stored(tmp_path):
    log = b"".join(b"2026-11-01 10:00:%02d \x1b[32mINFO\x1b[0m served ok\n" % i for i in range(30)) + \
        b"2026-11-01 10:01:00 \x1b[31mERROR\x1b[0m replication lag on db-7 over 30 s\n"
    utf16 = "告警阈值为百分之八十，BOM none.\nthreshold eighty percent\n".encode("utf-16-le")
    async with kb_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        await raw_upload(c, "app.log", log)
        await raw_upload(c, "alerts.txt", utf16)
        hits = (await c.call(MsgType.KB_SEARCH, query="replication lag db-7"))["hits"]
        assert hits and hits[0]["name"] == "app.log" and "\x1b" not in hits[0]["text"]
        assert "ERROR replication lag" in hits[0]["text"]
        hits = (await c.call(MsgType.KB_SEARCH, query="threshold eighty percent"))["hits"]
        assert hits and hits[0]["name"] == "alerts.txt"
        await c.close()


def _doc(i: int) -> bytes:
    return "\n\n".join(f"Paragraph {i}-{p}: service {i} restarts worker pool {p} at night. " * 3
                       for p in range(6)).encode()


async def test_max_total_chunks_refuses_at_upload_end(tmp_path):
    async with kb_server(tmp_path, {"max_total_chunks": 12, "chunk_target_chars": 200,
                                    "chunk_overlap_chars": 40}) as (srv, addr):
        a, b = await connect(addr, "alice"), await connect(addr, "bob")
        first = (await raw_upload(a, "a.md", _doc(1)))["document"]
        assert first["chunks"] <= 12
        with pytest.raises(ReplyError) as exc:
            for i in range(2, 6):
                await raw_upload(b, f"b{i}.md", _doc(i))
        assert exc.value.code == "QUOTA_EXCEEDED" and "max_total_chunks" in exc.value.body["message"]
        assert len(srv.services.knowledge.index) <= 12
        await a.call(MsgType.PING)
        await a.close(), await b.close()


async def test_the_uploaders_delete_keeps_a_group_document_for_the_other_uploader(tmp_path):
    data = b"# Matrix\n\nThe escalation matrix: on-call first, then the team lead.\n"
    async with kb_server(tmp_path) as (srv, addr):
        alice, carol = await connect(addr, "alice"), await connect(addr, "carol")    # both in group red
        mine = (await raw_upload(alice, "matrix.txt", data, collection="group:red"))["document"]
        dup = (await raw_upload(carol, "carols_matrix.txt", data, collection="group:red"))["document"]
        assert dup["duplicate"] and dup["doc_id"] == mine["doc_id"]
        await alice.call(MsgType.KB_DELETE, doc_id=mine["doc_id"])
        docs = (await carol.call(MsgType.KB_LIST, collection="group:red"))["documents"]
        assert [(d["doc_id"], d["uploader"]) for d in docs] == [(mine["doc_id"], "carol")]   # before: []
        assert (await carol.call(MsgType.KB_SEARCH, query="escalation matrix on-call"))["hits"]
        await carol.call(MsgType.KB_DELETE, doc_id=mine["doc_id"])
        assert (await alice.call(MsgType.KB_LIST, collection="group:red"))["documents"] == []
        await alice.close(), await carol.close()
