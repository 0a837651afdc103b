"""Uploads over real TCP: the happy path with progress, and every bad input of issue 14 (empty,
over the limit, wrong checksum, disconnect then resume, hostile names, unsupported and corrupt files,
one repeated word), each with a stable code and nothing kept."""
from __future__ import annotations

import os
import random

import pytest

from knowledge.kb_testlib import make_docx, make_pdf
from protocol import MsgType
from protocol.binary import encode_data
from testkit.server import ReplyError, poll

from kb_wire.kbwire import connect, kb_server, md5, raw_upload, send_data

RUNBOOK = ("# Backup\n\nThe nightly backup runs at 02:00 and keeps 14 copies.\n\n"
           "## Restore\n\nRestore with `nplt-restore --from latest`; its default timeout is 90 seconds.\n").encode()


def leftovers(srv) -> list[str]:
    root = srv.services.uploads.root
    return sorted(os.listdir(root)) if root.exists() else []


async def test_upload_reports_progress_and_indexes_the_document(tmp_path):
    async with kb_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        reply = await raw_upload(c, "runbook.md", RUNBOOK)
        doc = reply["document"]
        assert doc["name"] == "runbook.md" and doc["md5"] == md5(RUNBOOK) and doc["chunks"] >= 2
        assert doc["collection"] == "user:alice" and doc["duplicate"] is False
        stages = [m.body["stage"] for m in c.inbox if m.type == MsgType.KB_PROGRESS]
        assert stages[0] == "receiving" and stages[-1] == "indexing"
        assert [s for i, s in enumerate(stages) if i == 0 or stages[i - 1] != s] == \
            ["receiving", "parsing", "chunking", "indexing"]
        last = [m.body for m in c.inbox if m.type == MsgType.KB_PROGRESS][-1]
        assert last["done"] == last["total"] == doc["chunks"]
        again = await raw_upload(c, "copy.md", RUNBOOK)
        assert again["document"]["duplicate"] is True and again["document"]["doc_id"] == doc["doc_id"]
        assert leftovers(srv) == []
        listed = await c.call(MsgType.KB_LIST)
        assert [d["doc_id"] for d in listed["documents"]] == [doc["doc_id"]]
        hits = (await c.call(MsgType.KB_SEARCH, query="restore timeout", limit=3))["hits"]
        assert hits[0]["citation"].startswith("[runbook.md §Backup > Restore")
        passage = (await c.call(MsgType.KB_PASSAGE, chunk_id=hits[0]["chunk_id"]))["passage"]
        assert "90 seconds" in passage["text"]
        await c.close()


@pytest.mark.parametrize("name, data, code, message", [
    ("empty.txt", b"", "UNSUPPORTED_MEDIA", "empty file"),
    ("big.txt", b"x" * 5000, "QUOTA_EXCEEDED", "over the upload limit"),
    ("tool.exe", b"MZ\x90\x00", "UNSUPPORTED_MEDIA", ""),
    ("a\x00b.txt", b"hello", "INVALID_MESSAGE", "control characters"),
    ("x" * 10_000 + ".txt", b"hello", "INVALID_MESSAGE", "field 'name'"),
    ("../..", b"hello", "INVALID_MESSAGE", "invalid file name"),
    ("foo/..", b"hello", "INVALID_MESSAGE", "invalid file name"),
    ("a\u202etxt.exe", b"hello", "INVALID_MESSAGE", "U+202E"),           # shows as "aexe.txt"
    ("x\u2028y.txt", b"hello", "INVALID_MESSAGE", "U+2028"),
])
async def test_refused_at_begin_before_any_byte(tmp_path, name, data, code, message):
    async with kb_server(tmp_path, {"max_upload_bytes": 4096}) as (srv, addr):
        c = await connect(addr, "alice")
        with pytest.raises(ReplyError) as exc:
            await c.call(MsgType.KB_UPLOAD_BEGIN, name=name, size=len(data), md5=md5(data))
        assert exc.value.code == code and message in exc.value.body["message"]
        assert leftovers(srv) == [] and (await c.call(MsgType.KB_LIST))["documents"] == []
        await c.call(MsgType.PING)                     # the connection is still fine
        await c.close()


@pytest.mark.parametrize("name, data, code", [
    ("binary.txt", bytes(range(256)) * 8, "UNSUPPORTED_MEDIA"),
    ("broken.pdf", b"%PDF-1.4\n" + random.Random(1).randbytes(400), "UNSUPPORTED_MEDIA"),
    ("broken.docx", b"PK\x03\x04" + random.Random(2).randbytes(400), "UNSUPPORTED_MEDIA"),
    ("truncated.pdf", make_pdf(["page one text"])[:120], "UNSUPPORTED_MEDIA"),
], ids=lambda v: v if isinstance(v, str) else "data")   # the same ids in every pytest-xdist worker
async def test_refused_after_the_bytes_keeps_nothing(tmp_path, name, data, code):
    async with kb_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        with pytest.raises(ReplyError) as exc:
            await raw_upload(c, name, data)
        assert exc.value.code == code
        assert leftovers(srv) == [] and (await c.call(MsgType.KB_LIST))["documents"] == []
        await c.close()


async def test_wrong_checksum_is_refused_and_nothing_is_kept(tmp_path):
    async with kb_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        with pytest.raises(ReplyError) as exc:
            await raw_upload(c, "runbook.md", RUNBOOK, checksum=md5(b"something else"))
        assert exc.value.code == "CHECKSUM_MISMATCH" and "nothing was kept" in exc.value.body["message"]
        assert leftovers(srv) == [] and (await c.call(MsgType.KB_LIST))["documents"] == []
        begin = await c.call(MsgType.KB_UPLOAD_BEGIN, name="runbook.md", size=len(RUNBOOK), md5=md5(RUNBOOK),
                             sha256="0" * 64)            # the md5 matches, the announced sha256 does not
        send_data(c, begin["handle"], 0, RUNBOOK)
        with pytest.raises(ReplyError) as exc:
            await c.call(MsgType.KB_UPLOAD_END, upload_id=begin["upload_id"])
        assert exc.value.code == "CHECKSUM_MISMATCH" and "sha256" in exc.value.body["message"]
        assert leftovers(srv) == [] and (await c.call(MsgType.KB_LIST))["documents"] == []
        await c.close()


async def test_real_pdf_and_docx_and_a_single_repeated_word(tmp_path):
    async with kb_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        pdf = (await raw_upload(c, "manual.pdf", make_pdf(["Install the agent", "Configure the port 8443"])))["document"]
        docx = (await raw_upload(c, "notes.docx", make_docx([("Design", 1), ("The cache holds 512 entries", 0)])))["document"]
        word = (await raw_upload(c, "word.txt", ("spam " * 20_000).encode()))["document"]
        assert pdf["chunks"] >= 1 and docx["chunks"] >= 1 and word["chunks"] >= 1
        hits = (await c.call(MsgType.KB_SEARCH, query="port 8443"))["hits"]
        assert hits[0]["doc_id"] == pdf["doc_id"] and "§p. " in hits[0]["citation"]
        hits = (await c.call(MsgType.KB_SEARCH, query="spam", limit=100))["hits"]
        assert hits and all(h["doc_id"] == word["doc_id"] for h in hits)
        await c.close()


async def test_hostile_path_is_only_a_name(tmp_path):
    async with kb_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        doc = (await raw_upload(c, "../../../etc/passwd.txt", b"root:x:0:0\n"))["document"]
        assert doc["name"] == "passwd.txt"
        assert not (tmp_path / "etc").exists() and not any(p.name == "passwd.txt" for p in tmp_path.rglob("*"))
        await c.close()


async def test_disconnect_mid_upload_then_resume_from_the_reported_offset(tmp_path):
    data = ("line of the big log file, number {}\n" * 1).encode() * 0 + b"".join(
        f"log line {i}: service started with pid {i * 7}\n".encode() for i in range(20_000))
    half = len(data) // 2
    async with kb_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        begin = await c.call(MsgType.KB_UPLOAD_BEGIN, name="service.log", size=len(data), md5=md5(data))
        assert begin["offset"] == 0
        send_data(c, begin["handle"], 0, data[:half])
        await c.wait_for(lambda m: m.type == MsgType.KB_PROGRESS and m.body["done"] == half)
        await c.close()
        await poll(lambda: srv.services.uploads.in_progress() == 0)
        c2 = await connect(addr, "alice")
        again = await c2.call(MsgType.KB_UPLOAD_BEGIN, name="service.log", size=len(data), md5=md5(data))
        assert again["upload_id"] == begin["upload_id"] and again["offset"] == half
        send_data(c2, again["handle"], half, data[half:])
        doc = (await c2.call(MsgType.KB_UPLOAD_END, upload_id=again["upload_id"]))["document"]
        assert doc["md5"] == md5(data) and doc["size"] == len(data)
        assert leftovers(srv) == []
        await c2.close()


async def test_bad_data_frames_and_early_end(tmp_path):
    async with kb_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        begin = await c.call(MsgType.KB_UPLOAD_BEGIN, name="a.txt", size=10, md5=md5(b"0123456789"))
        c.send_bytes(c.codec.send_raw(MsgType.KB_UPLOAD_DATA, encode_data(begin["handle"] + 99, 0, b"01")))
        err = await c.wait_type(MsgType.ERROR)
        assert err.body["re"] is None and "no upload with handle" in err.body["message"]
        c.send_bytes(c.codec.send_raw(MsgType.KB_UPLOAD_DATA, encode_data(begin["handle"], 5, b"56789")))
        err = await c.wait_type(MsgType.ERROR)
        assert "offset 5, expected 0" in err.body["message"]
        send_data(c, begin["handle"], 0, b"01234")
        with pytest.raises(ReplyError) as exc:
            await c.call(MsgType.KB_UPLOAD_END, upload_id=begin["upload_id"])
        assert exc.value.code == "INVALID_MESSAGE" and "continue from offset 5" in exc.value.body["message"]
        again = await c.call(MsgType.KB_UPLOAD_BEGIN, name="a.txt", size=10, md5=md5(b"0123456789"))
        assert again["offset"] == 5
        send_data(c, again["handle"], 5, b"56789")
        assert (await c.call(MsgType.KB_UPLOAD_END, upload_id=again["upload_id"]))["document"]["size"] == 10
        await c.close()


async def test_concurrent_upload_limits(tmp_path):
    async with kb_server(tmp_path, {"max_uploads_per_user": 1, "max_uploads": 2}) as (srv, addr):
        a, b, d = await connect(addr, "alice"), await connect(addr, "bob"), await connect(addr, "dave")
        await a.call(MsgType.KB_UPLOAD_BEGIN, name="1.txt", size=3, md5=md5(b"one"))
        with pytest.raises(ReplyError) as exc:
            await a.call(MsgType.KB_UPLOAD_BEGIN, name="2.txt", size=3, md5=md5(b"two"))
        assert exc.value.code == "QUOTA_EXCEEDED" and "max_uploads_per_user" in exc.value.body["message"]
        await b.call(MsgType.KB_UPLOAD_BEGIN, name="1.txt", size=3, md5=md5(b"one"))
        with pytest.raises(ReplyError) as exc:
            await d.call(MsgType.KB_UPLOAD_BEGIN, name="1.txt", size=3, md5=md5(b"one"))
        assert exc.value.code == "SERVER_BUSY"
        await a.close()                               # a disconnect frees the slot
        await poll(lambda: srv.services.uploads.in_progress() == 1)
        await d.call(MsgType.KB_UPLOAD_BEGIN, name="1.txt", size=3, md5=md5(b"one"))
        for c in (b, d):
            await c.close()


async def test_quota_and_expiry(tmp_path):
    async with kb_server(tmp_path, {"user_quota_bytes": 100, "upload_expiry_s": 60}) as (srv, addr):
        c = await connect(addr, "alice")
        await raw_upload(c, "a.txt", b"a" * 10 + b" words here" * 5)
        with pytest.raises(ReplyError) as exc:
            await c.call(MsgType.KB_UPLOAD_BEGIN, name="b.txt", size=60, md5=md5(b"b" * 60))
        assert exc.value.code == "QUOTA_EXCEEDED" and "user_quota_bytes" in exc.value.body["message"]
        begin = await c.call(MsgType.KB_UPLOAD_BEGIN, name="c.txt", size=20, md5=md5(b"c" * 20))
        await c.close()
        await poll(lambda: srv.services.uploads.in_progress() == 0)
        old = srv.services.uploads.root / f"{begin['upload_id']}.part"
        for p in (old, old.with_suffix(".json")):
            os.utime(p, (1, 1))                      # last touched in 1970: expired
        c = await connect(addr, "alice")
        fresh = await c.call(MsgType.KB_UPLOAD_BEGIN, name="d.txt", size=5, md5=md5(b"ddddd"))
        assert not old.exists() and fresh["offset"] == 0
        await c.close()


async def test_download_streams_within_a_small_output_buffer_and_resumes_by_offset(tmp_path):
    from protocol.binary import decode_data
    data = b"".join(f"row {i}, value {i * 3}\n".encode() for i in range(40_000))   # ~0.8 MB
    async with kb_server(tmp_path, max_output_buffer=65536) as (srv, addr):
        c = await connect(addr, "alice")
        doc = (await raw_upload(c, "rows.csv.txt", data))["document"]
        c.inbox.clear()
        reply = await c.call(MsgType.KB_DOWNLOAD, doc_id=doc["doc_id"], handle=5, offset=1000, timeout=30)
        assert reply["offset"] == 1000 and reply["length"] == len(data) - 1000
        frames = [decode_data(m.body) for m in c.inbox if m.type == MsgType.KB_DOWNLOAD_DATA]
        assert all(h == 5 for h, _, _ in frames)
        assert [o for _, o, _ in frames] == sorted(o for _, o, _ in frames) and frames[0][1] == 1000
        assert b"".join(bytes(d) for _, _, d in frames) == data[1000:]
        assert srv.slow_consumers == 0
        with pytest.raises(ReplyError) as exc:
            await c.call(MsgType.KB_DOWNLOAD, doc_id=doc["doc_id"], handle=6, offset=len(data) + 1)
        assert exc.value.code == "INVALID_MESSAGE"
        await c.close()
