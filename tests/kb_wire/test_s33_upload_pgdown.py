"""A KB_UPLOAD_END that fails for a passing reason keeps the received upload for a resume
(docs/protocol.md §5.8): with PostgreSQL down at END (STORAGE_UNAVAILABLE), the partial upload stays,
so a BEGIN after PostgreSQL is back answers offset = size and END stores it without the bytes being
sent again. Before, END removed the upload whatever ingest raised, and the BEGIN answered offset 0.
A refusal (here: a file of a kind not accepted) still removes it. A server on the session's
restartable PostgreSQL (tests/conftest.py), over loopback."""
from __future__ import annotations

import asyncio

import pytest

from pg.dbs import drop_database, fresh_database
from protocol import MsgType as T
from testkit.server import ReplyError

from kb_wire.kbwire import connect, kb_server, md5, send_data

#: PostgreSQL's retry policy of the server: 10 ms doubled twice, so an END with PostgreSQL down fails fast
STORAGE = {"pg_retry_backoff_ms": 10, "pg_retry_attempts": 2, "pg_connect_timeout_s": 2}


@pytest.fixture
async def url(restartable_server):
    restartable_server.start()                   # (running already, unless a test stopped half-way)
    u = await fresh_database(restartable_server)
    try:
        yield u
    finally:
        restartable_server.start()
        await drop_database(restartable_server, u)


def _text(n: int) -> bytes:
    return "".join(f"row {i} alpha beta gamma delta\n" for i in range(n)).encode()


async def test_an_upload_whose_end_finds_postgres_down_is_kept_for_a_resume(tmp_path, restartable_server, url):
    data = _text(4000)
    body = {"name": "pgdown.md", "size": len(data), "md5": md5(data)}
    async with kb_server(tmp_path, storage={"url": url, **STORAGE}) as (srv, addr):
        c = await connect(addr, "alice")
        try:
            begin = await c.call(T.KB_UPLOAD_BEGIN, **body)
            assert begin["offset"] == 0
            send_data(c, begin["handle"], 0, data)
            await asyncio.to_thread(restartable_server.stop)
            try:
                with pytest.raises(ReplyError) as failed:
                    await c.call(T.KB_UPLOAD_END, upload_id=begin["upload_id"], timeout=60)
            finally:
                restartable_server.start()
            assert failed.value.code == "STORAGE_UNAVAILABLE", failed.value.body
            again = await c.call(T.KB_UPLOAD_BEGIN, **body)           # (before: offset 0, the bytes gone)
            assert again["upload_id"] == begin["upload_id"] and again["offset"] == len(data)
            done = await c.call(T.KB_UPLOAD_END, upload_id=again["upload_id"], timeout=60)
            assert done["document"]["name"] == "pgdown.md" and done["document"]["chunks"] >= 1
            listed = await c.call(T.KB_LIST)
            assert [d["name"] for d in listed["documents"]] == ["pgdown.md"]
            fresh = await c.call(T.KB_UPLOAD_BEGIN, **body)           # stored: nothing of it is kept
            assert fresh["offset"] == 0
        finally:
            await c.close()


async def test_an_upload_refused_at_end_is_still_removed(tmp_path, url):
    data = b"MZ\x90\x00" + bytes(range(256)) * 8                     # not text, not a known document
    body = {"name": "tool.md", "size": len(data), "md5": md5(data)}
    async with kb_server(tmp_path, storage={"url": url, **STORAGE}) as (srv, addr):
        c = await connect(addr, "alice")
        try:
            begin = await c.call(T.KB_UPLOAD_BEGIN, **body)
            send_data(c, begin["handle"], 0, data)
            with pytest.raises(ReplyError) as refused:
                await c.call(T.KB_UPLOAD_END, upload_id=begin["upload_id"], timeout=60)
            assert refused.value.code == "UNSUPPORTED_MEDIA", refused.value.body
            again = await c.call(T.KB_UPLOAD_BEGIN, **body)
            assert again["offset"] == 0                                # refused: nothing kept
        finally:
            await c.close()
