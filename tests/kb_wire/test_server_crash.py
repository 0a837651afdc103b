"""Crash safety at the server level: a real ``nplt-server`` process is SIGKILLed while it ingests an
upload (after KB_UPLOAD_END: while parsing, while indexing, as indexing ends), then restarted. The
document exists whole (listed, searchable, downloaded with the same MD5) or not at all (not listed,
not found, nothing of it in the store), and uploading it again works.

The kill is synchronised on the server's own KB_PROGRESS events, never on time: the document is
large enough (~0.9 MB, 5,000 chunks) that the ingest is still running when its event arrives.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from protocol import MsgType
from protocol.binary import decode_data
from testkit.process import ServerProcess
from testkit.server import V3Client

from kb_wire.kbwire import md5, raw_upload, send_data

NAME = "fleet-manual.md"
DOC = ("# Fleet manual\n\n" + "".join(
    f"## Host {i}\n\nHost {i} runs the ingest worker {i % 17} and keeps {i % 30 + 1} days of logs. "
    f"Its maintenance window opens at {i % 24:02d}:00 and the on-call rota is team {i % 9}.\n\n"
    for i in range(5_000))).encode()
PROBE = "Host 4321 maintenance window"        # a passage only this document holds


def at(stage: str):
    """The KB_PROGRESS event to kill on."""
    def match(m) -> bool:
        if m.type != MsgType.KB_PROGRESS:
            return False
        b = m.body
        if stage == "indexing-done":
            return b["stage"] == "indexing" and b["done"] == b["total"]
        if stage == "indexing":
            return b["stage"] == "indexing" and 0 < b["done"] < b["total"]
        return b["stage"] == stage
    return match


def store_entries(data_dir: Path) -> tuple[list[str], list[str]]:
    """(document directories under any collection, leftovers under tmp/)."""
    root = data_dir / "knowledge"
    docs = sorted(p.name for p in (root / "c").glob("*/*")) if (root / "c").exists() else []
    tmp = sorted(p.name for p in (root / "tmp").iterdir()) if (root / "tmp").exists() else []
    return docs, tmp


async def download(c: V3Client, doc_id: str) -> bytes:
    c.inbox.clear()
    reply = await c.call(MsgType.KB_DOWNLOAD, doc_id=doc_id, handle=7, offset=0, timeout=60)
    frames = [decode_data(m.body) for m in c.inbox if m.type == MsgType.KB_DOWNLOAD_DATA]
    data = b"".join(bytes(d) for _, _, d in sorted(frames, key=lambda f: f[1]))
    assert reply["length"] == len(data)
    return data


async def check_whole(c: V3Client, doc: dict) -> None:
    assert doc["name"] == NAME and doc["md5"] == md5(DOC) and doc["size"] == len(DOC)
    hits = (await c.call(MsgType.KB_SEARCH, query=PROBE, limit=3))["hits"]
    assert hits and hits[0]["doc_id"] == doc["doc_id"] and "Host 4321 " in hits[0]["text"]
    assert hashlib.md5(await download(c, doc["doc_id"])).hexdigest() == md5(DOC)


@pytest.mark.parametrize("stage", ["parsing", "indexing", "indexing-done"])
async def test_sigkill_while_the_server_ingests_an_upload(tmp_path, stage):
    data_dir = tmp_path / "data"
    server = await ServerProcess.start(data_dir)
    try:
        c = await V3Client.connect(server.addr)
        begin = await c.call(MsgType.KB_UPLOAD_BEGIN, name=NAME, size=len(DOC), md5=md5(DOC))
        send_data(c, begin["handle"], 0, DOC)
        c.send(MsgType.KB_UPLOAD_END, {"id": c.next_id(), "upload_id": begin["upload_id"]})
        await c.wait_for(at(stage), timeout=120)
        server.kill()                                        # SIGKILL, mid-ingest
        assert server.proc.returncode == -9
        await c.close()
    finally:
        server.kill()

    server = await ServerProcess.start(data_dir)
    try:
        c = await V3Client.connect(server.addr)
        listed = (await c.call(MsgType.KB_LIST))["documents"]
        docs, tmp = store_entries(data_dir)
        assert tmp == []                                     # crash debris removed at start
        if listed:                                           # whole
            [doc] = listed
            assert docs == [doc["doc_id"]]
            await check_whole(c, doc)
        else:                                                # or not at all
            assert docs == []
            assert (await c.call(MsgType.KB_SEARCH, query=PROBE, limit=3))["hits"] == []
        again = (await raw_upload(c, NAME, DOC))["document"]   # a re-upload works
        assert again["duplicate"] is bool(listed)
        if listed:
            assert again["doc_id"] == listed[0]["doc_id"]
        [doc] = (await c.call(MsgType.KB_LIST))["documents"]
        assert doc["doc_id"] == again["doc_id"] and store_entries(data_dir) == ([doc["doc_id"]], [])
        await check_whole(c, doc)
        await c.close()
    finally:
        await server.stop()
