"""v2 uploads: FILE_METADATA + FILE_DATA pieces -> the user's knowledge-base collection, one CHAT_TEXT."""
from __future__ import annotations

import json
import re
from pathlib import Path

from server.auth import LOCAL_USER
from testkit.server import poll
from v2files_testlib import FILE_DATA, FILE_METADATA, connect, files_server, send_file

RUNBOOK = ("# Backup runbook\n\n## Nightly\n\nThe nightly backup of the billing database runs at 02:30 and "
           "writes to the bucket zebra-archive-7.\n\n## 恢复\n\n恢复数据库时先停止写入服务，然后执行 restore 脚本。\n")
OK = re.compile(r"^文件上传成功: (?P<name>.+) \(ID: (?P<id>[0-9a-f]+)\)$")


def _incoming(tmp_path: Path) -> list[Path]:
    d = tmp_path / "history" / "v2-uploads"
    return list(d.iterdir()) if d.exists() else []


async def test_upload_in_200_byte_pieces_is_stored_indexed_and_searchable(tmp_path: Path) -> None:
    async with files_server(tmp_path) as (srv, addr):
        v2 = await connect(addr, udp_port=40000)
        data = RUNBOOK.encode()
        send_file(v2, "runbook.md", data)          # 200-byte pieces, as the deployed client sends them
        m = OK.match(await v2.recv_text())
        assert m and m["name"] == "runbook.md"
        kb = srv.services.knowledge
        [doc] = await kb.list(LOCAL_USER, ())
        assert doc.doc_id == m["id"] and doc.size == len(data) and doc.collection == f"user:{LOCAL_USER}"
        hits = await kb.search(LOCAL_USER, (), "zebra-archive-7 bucket")
        assert hits and hits[0].doc_id == doc.doc_id and "zebra-archive-7" in hits[0].text
        assert (await kb.search(LOCAL_USER, (), "恢复数据库"))[0].doc_id == doc.doc_id
        # the same bytes again: the same document (deduplicated), confirmed the same way
        send_file(v2, "runbook.md", data, piece=65535)
        assert OK.match(await v2.recv_text())["id"] == doc.doc_id
        assert len(await kb.list(LOCAL_USER, ())) == 1
        assert _incoming(tmp_path) == []           # the temporary file is gone
        # the connection still serves requests in order
        v2.send(0x01, "HEARTBEAT")
        assert await v2.recv_text() == "HEARTBEAT"
        assert v2.only_v2_codes()
        await v2.close()


async def test_refusals_are_one_text_and_the_announced_bytes_are_swallowed(tmp_path: Path) -> None:
    async with files_server(tmp_path, knowledge={"max_upload_bytes": 1000}) as (srv, addr):
        v2 = await connect(addr)
        send_file(v2, "big.txt", b"x" * 1500)
        assert await v2.recv_text() == "文件保存失败: big.txt: 1500 bytes is over the upload limit (1000 bytes)"
        send_file(v2, "tool.exe", b"MZ" * 100)
        text = await v2.recv_text()
        assert text.startswith("文件保存失败: tool.exe: ") and "unsupported" in text.lower()
        send_file(v2, "../../etc/passwd\x00.txt", b"root")
        assert (await v2.recv_text()).startswith("文件保存失败: ")
        v2.send(FILE_METADATA, b"not json")
        assert await v2.recv_text() == '文件保存失败: FILE_METADATA is not JSON {"filename", "size"}'
        v2.send(FILE_METADATA, json.dumps({"filename": "a.txt", "size": -1}))
        assert await v2.recv_text() == "文件保存失败: field 'size': expected a non-negative integer"
        send_file(v2, "empty.txt", b"")
        assert (await v2.recv_text()).startswith("文件保存失败: empty.txt: ")
        send_file(v2, "empty.exe", b"")                            # refused at the metadata: one answer only
        assert (await v2.recv_text()).startswith("文件保存失败: empty.exe: ")
        send_file(v2, "bin.txt", b"\x00\x01\x02" * 50)            # binary content in a text format
        assert (await v2.recv_text()).startswith("文件保存失败: bin.txt: ")
        send_file(v2, "short.txt", b"0123456789", size=5)   # more than announced: the first 5 bytes are the file
        assert OK.match(await v2.recv_text())["name"] == "short.txt"
        v2.send(FILE_DATA, b"stray")                               # after an upload: swallowed, no reply
        v2.send(FILE_DATA, b"stray again")
        v2.send(0x01, "HEARTBEAT")
        assert await v2.recv_text() == "HEARTBEAT"
        assert [d.name for d in await srv.services.knowledge.list(LOCAL_USER, ())] == ["short.txt"]
        await poll(lambda: _incoming(tmp_path) == [])
        await v2.close()


async def test_a_stalled_upload_times_out_and_a_new_metadata_replaces_an_open_upload(tmp_path: Path) -> None:
    async with files_server(tmp_path, transfer={"v2_upload_timeout_s": 0.3}) as (srv, addr):
        v2 = await connect(addr)
        send_file(v2, "notes.txt", b"half of it", size=100)
        text = await v2.recv_text()
        assert text == ("文件保存失败: notes.txt: upload timed out after 0.3 s without data "
                        "(10 of 100 bytes arrived)")
        await poll(lambda: _incoming(tmp_path) == [])
        send_file(v2, "first.txt", b"abc", size=100)
        send_file(v2, "second.txt", b"the second file is complete")
        assert await v2.recv_text() == "文件保存失败: first.txt: a new upload started after 3 of 100 bytes"
        assert OK.match(await v2.recv_text())["name"] == "second.txt"
        await v2.close()


async def test_a_disconnect_mid_upload_keeps_nothing(tmp_path: Path) -> None:
    async with files_server(tmp_path, transfer={"v2_upload_timeout_s": 0.2}) as (srv, addr):
        v2 = await connect(addr)
        send_file(v2, "cut.txt", b"a" * 600, size=10_000)
        await poll(lambda: len(_incoming(tmp_path)) == 1)
        await v2.close()
        await poll(lambda: _incoming(tmp_path) == [])
        assert await srv.services.knowledge.list(LOCAL_USER, ()) == []


async def test_memory_stays_bounded_the_bytes_go_to_disk(tmp_path: Path) -> None:
    size = 3 * 1024 * 1024
    async with files_server(tmp_path, transfer={"v2_upload_buffer_bytes": 65536}) as (srv, addr):
        v2 = await connect(addr)
        line = b"log line with some words about the cache warmup\n"
        data = (line * (size // len(line) + 1))[:size]
        v2.send(FILE_METADATA, json.dumps({"filename": "big.log", "size": size}))
        sent = 0
        for off in range(0, size, 60000):
            v2.send(FILE_DATA, data[off:off + 60000])
            sent += len(data[off:off + 60000])
            if sent == 1_200_000:
                await poll(lambda: any(p.stat().st_size >= 1_000_000 for p in _incoming(tmp_path)))
                from server.legacy_v2_files import _STATE
                [state] = [s for s in _STATE.values() if s.upload is not None]
                assert len(state.upload.buffer) < 65536 + 60000
        m = OK.match(await v2.recv_text(timeout=60))
        assert m and m["name"] == "big.log"
        await v2.close()


async def test_paced_pieces_like_the_deployed_client_never_time_out(tmp_path: Path) -> None:
    """200-byte pieces 10 ms apart for longer than the stall timeout: each piece restarts the clock."""
    import asyncio
    async with files_server(tmp_path, transfer={"v2_upload_timeout_s": 0.25}) as (srv, addr):
        v2 = await connect(addr)
        data = (RUNBOOK * 4).encode()[:12_000]          # 60 pieces: ~0.6 s at the client's pace
        v2.send(FILE_METADATA, json.dumps({"filename": "paced.md", "size": len(data)}))
        for off in range(0, len(data), 200):
            v2.send(FILE_DATA, data[off:off + 200])
            await asyncio.sleep(0.01)                   # the deployed client's pacing, not synchronisation
        m = OK.match(await v2.recv_text())
        assert m and m["name"] == "paced.md"
        await v2.close()


async def test_a_v2_chat_after_the_upload_answers_from_the_document_with_a_citation(tmp_path: Path) -> None:
    """The v2 upload reaches the user's collection, and the user's next chat is answered from it
    (offline agent: the knowledge route quotes the passage with a [name §location] citation)."""
    async with files_server(tmp_path) as (_srv, addr):
        v2 = await connect(addr, udp_port=40000)
        send_file(v2, "runbook.md", RUNBOOK.encode())
        assert OK.match(await v2.recv_text())
        v2.send(0x01, "知识库里说恢复数据库时要先做什么？")
        _thoughts, answer, _n = await v2.read_answer()
        assert "停止写入服务" in answer and "[runbook.md §" in answer, answer
        v2.send(0x01, "what does the knowledge base say about the nightly backup bucket?")
        _thoughts, answer, _n = await v2.read_answer()
        assert "zebra-archive-7" in answer and "[runbook.md §" in answer, answer
        assert v2.only_v2_codes()
        await v2.close()
