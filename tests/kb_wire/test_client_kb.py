"""The client library's resumable upload and download over real TCP."""
from __future__ import annotations

import asyncio

import hashlib

import pytest

from client import kb as kbclient
from client.connection import Backoff, Client
from client.errors import ClientError
from protocol import MsgType

from kb_wire.kbwire import connect, kb_server, token

LOG = b"".join(f"{i:06d} worker heartbeat ok, queue depth {i % 17}\n".encode() for i in range(60_000))


async def test_upload_then_download_with_progress(tmp_path):
    src = tmp_path / "worker.log"
    src.write_bytes(LOG)
    async with kb_server(tmp_path) as (srv, addr):
        async with Client(*addr, token=token("alice")) as c:
            seen: list[tuple[str, int, int]] = []
            doc = await kbclient.upload(c, src, progress=lambda *a: seen.append(a))
            assert doc.md5 == hashlib.md5(LOG).hexdigest() and doc.size == len(LOG)
            assert ("receiving", len(LOG), len(LOG)) in seen and seen[-1][0] == "indexing"
            out = tmp_path / "out" / "copy.log"
            out.parent.mkdir()
            got = await kbclient.download(c, doc.doc_id, out)
            assert got.doc_id == doc.doc_id and out.read_bytes() == LOG
            assert not out.with_name("copy.log.part").exists()
            # a .part of unknown origin (no sidecar: the user's own file?) is neither trusted nor removed
            part = out.with_name("again.log.part")
            part.write_bytes(LOG[:100_000])
            with pytest.raises(ClientError) as exc:
                await kbclient.download(c, doc.doc_id, out.with_name("again.log"))
            assert exc.value.code == "FILE_EXISTS" and part.read_bytes() == LOG[:100_000]
            assert not out.with_name("again.log.part.json").exists()
            await kbclient.download(c, doc.doc_id, out.with_name("again.log"), replace_part=True)
            assert out.with_name("again.log").read_bytes() == LOG and not part.exists()
            # nor is a .part whose sidecar is not ours
            bad = out.with_name("bad.log.part")
            bad.write_bytes(b"X" * 1000)
            out.with_name("bad.log.part.json").write_text("my notes")
            with pytest.raises(ClientError) as exc:
                await kbclient.download(c, doc.doc_id, out.with_name("bad.log"))
            assert exc.value.code == "FILE_EXISTS" and out.with_name("bad.log.part.json").read_text() == "my notes"
            with pytest.raises(ClientError) as exc:
                await kbclient.download(c, "nope", tmp_path / "x")
            assert exc.value.code == "NOT_FOUND"


async def test_a_failing_progress_display_does_not_end_the_connection(tmp_path):
    """The server's KB_PROGRESS reaches the callback in the link's reader task: an exception there
    (a TUI panel closed meanwhile) is logged, and the upload and the connection go on."""
    src = tmp_path / "worker.log"
    src.write_bytes(LOG)
    failed: list[str] = []

    def broken(stage: str, done: int, total: int) -> None:
        if stage != "receiving":
            failed.append(stage)
            raise LookupError("the panel is gone")
    async with kb_server(tmp_path) as (srv, addr):
        async with Client(*addr, token=token("alice"), reconnect=False) as c:   # a lost connection fails it
            doc = await asyncio.wait_for(kbclient.upload(c, src, progress=broken), 60)
            assert failed and doc.size == len(LOG)
            assert [d.doc_id for d in await kbclient.list_documents(c)] == [doc.doc_id]


async def test_upload_resumes_after_the_connection_drops(tmp_path):
    src = tmp_path / "worker.log"
    src.write_bytes(LOG)
    async with kb_server(tmp_path) as (srv, addr):
        async with Client(*addr, token=token("alice"), backoff=Backoff(initial=0.01, maximum=0.05)) as c:
            dropped: list[int] = []
            third = asyncio.Event()

            def progress(stage: str, done: int, total: int) -> None:
                if stage == "receiving" and done >= len(LOG) // 3 and not third.is_set():
                    dropped.append(done)
                    third.set()
            send_data = c.send_data

            async def cutting(msg_type, handle, offset, block):
                if offset >= len(LOG) // 2 and len(dropped) < 2:
                    await third.wait()          # the server has a third: cut the connection under the
                    dropped.append(offset)      # upload, before its KB_UPLOAD_END is sent
                    c.link._writer.transport.abort()
                await send_data(msg_type, handle, offset, block)
            c.send_data = cutting
            begins: list[dict] = []
            request = c.request

            async def recording(msg_type, body=None, timeout=None):
                reply = await request(msg_type, body, timeout)
                if msg_type == MsgType.KB_UPLOAD_BEGIN:
                    begins.append(reply)
                return reply
            c.request = recording
            doc = await kbclient.upload(c, src, progress=progress)
            assert len(dropped) == 2 and doc.md5 == hashlib.md5(LOG).hexdigest()
            assert len(begins) == 2 and begins[0].offset == 0 and dropped[0] <= begins[1].offset < len(LOG)
        a = await connect(addr, "alice")
        assert [d["doc_id"] for d in (await a.call(MsgType.KB_LIST))["documents"]] == [doc.doc_id]
        assert list(srv.services.uploads.root.iterdir()) == []
        await a.close()


async def test_a_connection_cut_while_its_end_is_stored_gets_the_document_once(tmp_path):
    src = tmp_path / "worker.log"
    src.write_bytes(LOG)
    async with kb_server(tmp_path) as (srv, addr):
        async with Client(*addr, token=token("alice"), backoff=Backoff(initial=0.01, maximum=0.05)) as c:
            request, cut, begins = c.request, [], []

            async def cutting(msg_type, body=None, timeout=None):
                if msg_type == MsgType.KB_UPLOAD_END and not cut:
                    cut.append(True)             # the END reaches the server, then the connection goes
                    pending = asyncio.ensure_future(request(msg_type, body, timeout))
                    await asyncio.sleep(0)       # one loop step: the request task writes its frame (no
                    #                              await before the write), then we flush and cut
                    await c.link._writer.drain()
                    c.link._writer.transport.abort()
                    return await pending
                reply = await request(msg_type, body, timeout)
                if msg_type == MsgType.KB_UPLOAD_BEGIN:
                    begins.append(reply)
                return reply
            c.request = cutting
            doc = await kbclient.upload(c, src)   # the BEGIN again waits for that END, then: a duplicate
        assert cut and len(begins) == 2 and doc.md5 == hashlib.md5(LOG).hexdigest()
        a = await connect(addr, "alice")
        assert [d["doc_id"] for d in (await a.call(MsgType.KB_LIST))["documents"]] == [doc.doc_id]
        assert list(srv.services.uploads.root.iterdir()) == []
        await a.close()


async def test_a_refused_file_raises_the_servers_code(tmp_path):
    src = tmp_path / "program.bin"
    src.write_bytes(b"\x7fELF" + bytes(100))
    async with kb_server(tmp_path) as (srv, addr):
        async with Client(*addr, token=token("alice")) as c:
            with pytest.raises(ClientError) as exc:
                await kbclient.upload(c, src)
            assert exc.value.code == "UNSUPPORTED_MEDIA"

