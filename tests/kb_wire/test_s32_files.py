"""The knowledge base's files when the disk or the data directory misbehaves:

- an upload whose bytes the disk refuses (RLIMIT_FSIZE in a real server process) is STORAGE_ERROR
  for the client library, naming the cause (before: its END answered INVALID_MESSAGE "bytes
  missing", as if the client had not sent them);
- a document whose ``original`` is gone stays listed, and its download is STORAGE_ERROR naming the
  problem (before: NOT_FOUND, contradicting ``kb list``); one whose ``meta.json`` / ``chunks.json``
  is damaged is moved to ``quarantine/`` at start, never over another (before: it stayed under
  ``c/`` forever, invisible and undeletable);
- ``knowledge/`` or ``uploads/`` being a regular file stops the server with a sentence saying so
  (before: ``[Errno 20] Not a directory: '.../knowledge/tmp'``, ``[Errno 17] File exists``).
"""
from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from client import kb as kbclient
from client.connection import Client
from client.errors import ClientError
from protocol import MsgType
from testkit.process import START_DEADLINE_S, ServerProcess

from kb_wire.kbwire import connect, kb_server, raw_upload

FSIZE_LIMIT = 65_536                      # bytes one file of the server may hold (RLIMIT_FSIZE)
BIG = b"".join(f"line {i:05d}: the nightly backup copies /srv/data to the vault\n".encode()
               for i in range(3_800))       # ~240 KB: far over the limit
SMALL = b"# Restore\n\nRun restore.sh with the snapshot id.\n"


def _server_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("NPLT_") and k != "OPENAI_API_KEY"}


async def start_limited(data_dir: Path) -> ServerProcess:
    """A real server process whose disk refuses any file over FSIZE_LIMIT bytes."""
    return await ServerProcess.start(data_dir, file_size_limit=FSIZE_LIMIT)


async def test_an_upload_the_disk_refuses_is_storage_error(tmp_path):
    src = tmp_path / "big.md"
    src.write_bytes(BIG)
    small = tmp_path / "restore.md"
    small.write_bytes(SMALL)
    server = await start_limited(tmp_path / "data")
    try:
        async with Client(*server.addr, reconnect=False) as c:
            with pytest.raises(ClientError) as exc:
                await asyncio.wait_for(kbclient.upload(c, src), 60)
            assert exc.value.code == "STORAGE_ERROR", exc.value
            msg = exc.value.message
            assert "big.md" in msg and "File too large" in msg and f"of {len(BIG)} bytes" in msg
            assert "bytes missing" not in msg and "continue from offset" not in msg
            # the server goes on: a file that fits is stored
            doc = await asyncio.wait_for(kbclient.upload(c, small), 60)
            assert [d.doc_id for d in await kbclient.list_documents(c)] == [doc.doc_id]
    finally:
        assert await server.stop() == 0
    log = server.log_path.read_text()
    assert "the disk refused a write" in log and "File too large" in log


async def _stop_and_damage(tmp_path: Path) -> dict[str, dict]:
    """Four documents stored, the server stopped: their ``list`` entries by name."""
    async with kb_server(tmp_path) as (_srv, addr):
        c = await connect(addr, "alice")
        docs = {}
        for name in ("gone.md", "chunks.md", "folder.md", "meta.md"):
            body = f"# {name}\n\nThe {name} runbook says: restart the worker, then check the queue.\n".encode()
            docs[name] = (await raw_upload(c, name, body))["document"]
        await c.close()
    return docs


async def test_damaged_or_missing_files_of_a_document(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="nplt.knowledge")
    docs = await _stop_and_damage(tmp_path)
    root = tmp_path / "history" / "knowledge"
    where = {name: next((root / "c").glob(f"*/{d['doc_id']}")) for name, d in docs.items()}
    (where["gone.md"] / "original").unlink()
    (where["chunks.md"] / "chunks.json").write_text('[{"text": "half a rec')
    (where["folder.md"] / "chunks.json").unlink()
    (where["folder.md"] / "chunks.json").mkdir()
    (where["meta.md"] / "meta.json").write_bytes(b"\x00\x00garbage")
    taken = root / "quarantine" / docs["chunks.md"]["doc_id"]       # already there: never overwritten
    taken.mkdir(parents=True)
    (taken / "note.txt").write_text("an earlier quarantine")

    async with kb_server(tmp_path) as (_srv, addr):
        c = await connect(addr, "alice")
        listed = (await c.call(MsgType.KB_LIST))["documents"]
        assert [d["name"] for d in listed] == ["gone.md"]          # listed: its passages are intact
        gone = docs["gone.md"]["doc_id"]
        assert (await c.call(MsgType.KB_SEARCH, query="gone.md runbook", limit=3))["hits"][0]["doc_id"] == gone
        with pytest.raises(Exception) as exc:
            await c.call(MsgType.KB_DOWNLOAD, doc_id=gone, handle=3, offset=0)
        assert exc.value.code == "STORAGE_ERROR"
        assert "stored bytes of gone.md" in exc.value.body["message"] and "missing" in exc.value.body["message"]
        await c.call(MsgType.KB_DELETE, doc_id=gone)                 # and it can be deleted
        assert (await c.call(MsgType.KB_LIST))["documents"] == []
        await c.close()

    assert list((root / "c").glob("*/*")) == []                      # nothing damaged left under c/
    moved = {p.name: p for p in (root / "quarantine").iterdir()}
    chunks_id = docs["chunks.md"]["doc_id"]
    assert sorted(moved) == sorted([chunks_id, f"{chunks_id}.1", docs["folder.md"]["doc_id"],
                                    docs["meta.md"]["doc_id"]])
    assert (taken / "note.txt").read_text() == "an earlier quarantine" and not (taken / "original").exists()
    for name, doc_id in (("chunks.md", f"{chunks_id}.1"), ("folder.md", docs["folder.md"]["doc_id"]),
                         ("meta.md", docs["meta.md"]["doc_id"])):
        assert (moved[doc_id] / "original").read_bytes().startswith(f"# {name}".encode())   # the bytes kept
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(gone in e and "stored bytes are missing" in e for e in errors), errors
    for name in ("chunks.md", "folder.md", "meta.md"):
        assert any(str(root / "quarantine") in e and str(where[name]) in e for e in errors), (name, errors)


@pytest.mark.parametrize("which", ["knowledge", "uploads"])
def test_a_file_where_a_data_directory_belongs_is_named(tmp_path, which):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / which).write_text("not a directory\n")
    done = subprocess.run([sys.executable, "-m", "server.main", "--port", "0", "--data-dir", str(data_dir)],
                          env=_server_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=START_DEADLINE_S)
    assert done.returncode == 1, done.stderr
    assert f"cannot start: {data_dir / which} must be a directory (found a regular file)" in done.stderr
    assert "Errno" not in done.stderr
