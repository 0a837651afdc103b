"""v2 uploads that have fully arrived are never refused for a passing condition: with the user's ingests
all in progress (``max_ingests_per_user``; every v2 connection is user ``local``) the connection waits
for one to end. Permanent limits (quota, size) are answered at FILE_METADATA, before any byte."""
from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path

import pytest

from protocol import ErrorCode
from server.auth import LOCAL_USER
from server.errors import HandlerError
from testkit.server import poll
from v2files_testlib import FILE_METADATA, connect, files_server, send_file

OK = re.compile(r"^文件上传成功: (?P<name>.+) \(ID: (?P<id>[0-9a-f]+)\)$")


def _incoming(tmp_path: Path) -> list[Path]:
    d = tmp_path / "history" / "v2-uploads"
    return list(d.iterdir()) if d.exists() else []


def _hold_the_slot(kb, gate: threading.Event) -> asyncio.Task:
    """An ingest of user ``local`` whose thread holds until ``gate`` is set (the user's only slot)."""
    return asyncio.get_running_loop().create_task(
        kb.ingest(LOCAL_USER, (), None, "blocker.txt", b"the blocker document\n", cancelled=lambda: not gate.wait(30)))


def _waiting(kb) -> int:
    return len(kb._slot_waiters.get(LOCAL_USER, ()))


async def test_complete_uploads_wait_for_an_ingest_slot_instead_of_being_refused(tmp_path: Path) -> None:
    async with files_server(tmp_path, knowledge={"max_ingests_per_user": 1}) as (srv, addr):
        kb = srv.services.knowledge
        gate = threading.Event()
        blocker = _hold_the_slot(kb, gate)
        try:
            await poll(lambda: kb.ingests_in_progress(LOCAL_USER) == 1)
            clients = [await connect(addr) for _ in range(3)]
            for k, v2 in enumerate(clients):
                send_file(v2, f"waiting-{k}.txt", f"document {k} waited for its turn\n".encode(), piece=65535)
            await poll(lambda: _waiting(kb) == 3, what="three complete uploads waiting for the slot")
        finally:
            gate.set()
        assert (await blocker).name == "blocker.txt"
        names = set()
        for v2 in clients:
            m = OK.match(await v2.recv_text())
            assert m, "a complete upload was refused"
            names.add(m["name"])
        assert names == {"waiting-0.txt", "waiting-1.txt", "waiting-2.txt"}
        assert len(await kb.list(LOCAL_USER, ())) == 4
        assert _incoming(tmp_path) == [] and _waiting(kb) == 0
        for v2 in clients:
            await v2.close()


async def test_a_connection_that_closes_while_waiting_gives_its_file_up(tmp_path: Path) -> None:
    async with files_server(tmp_path, knowledge={"max_ingests_per_user": 1}) as (srv, addr):
        kb = srv.services.knowledge
        gate = threading.Event()
        blocker = _hold_the_slot(kb, gate)
        try:
            await poll(lambda: kb.ingests_in_progress(LOCAL_USER) == 1)
            leaver, stayer = await connect(addr), await connect(addr)
            send_file(leaver, "left.txt", b"nobody will read the answer\n")
            await poll(lambda: _waiting(kb) == 1)
            send_file(stayer, "stayed.txt", b"this one is answered\n")
            await poll(lambda: _waiting(kb) == 2)
            # the server closes the leaver's connection (as on CLIENT_KILL or IDLE_TIMEOUT; a client's
            # EOF alone is a half-close: what it sent is still answered)
            host, port = leaver.writer.get_extra_info("sockname")[:2]
            [conn] = [c for c in srv.services.connections if c.peer == f"{host}:{port}"]
            conn.close()
            await poll(lambda: _waiting(kb) == 1 and len(_incoming(tmp_path)) == 1, what="the leaver's file removed")
        finally:
            gate.set()
        await blocker
        assert OK.match(await stayer.recv_text())["name"] == "stayed.txt"
        assert sorted(d.name for d in await kb.list(LOCAL_USER, ())) == ["blocker.txt", "stayed.txt"]
        assert _incoming(tmp_path) == []
        await stayer.close()
        await leaver.close()


async def test_waiters_answer_shutting_down_when_the_knowledge_base_closes(tmp_path: Path) -> None:
    async with files_server(tmp_path, knowledge={"max_ingests_per_user": 1}) as (srv, addr):
        kb = srv.services.knowledge
        gate = threading.Event()
        blocker = _hold_the_slot(kb, gate)
        await poll(lambda: kb.ingests_in_progress(LOCAL_USER) == 1)
        waiter = asyncio.get_running_loop().create_task(kb.wait_for_ingest_slot(LOCAL_USER))
        await poll(lambda: _waiting(kb) == 1)
        gone = asyncio.get_running_loop().create_future()
        given_up = asyncio.get_running_loop().create_task(kb.wait_for_ingest_slot(LOCAL_USER, gone))
        await poll(lambda: _waiting(kb) == 2)
        gone.set_result(None)
        assert await given_up is False
        closing = asyncio.get_running_loop().create_task(kb.close())
        with pytest.raises(HandlerError) as info:
            await waiter
        assert info.value.code == ErrorCode.SHUTTING_DOWN
        gate.set()
        with pytest.raises(HandlerError):
            await blocker                     # (cancelled by the close: SHUTTING_DOWN)
        await closing


async def test_the_quota_and_the_size_are_refused_at_the_metadata(tmp_path: Path) -> None:
    async with files_server(tmp_path, knowledge={"user_quota_bytes": 100, "max_upload_bytes": 1000}) as (srv, addr):
        v2 = await connect(addr)
        # the metadata alone is answered: no byte has to be sent (and those announced are swallowed)
        v2.send(FILE_METADATA, json.dumps({"filename": "over-quota.txt", "size": 150}))
        assert await v2.recv_text() == "文件保存失败: over-quota.txt: quota of 100 bytes reached (0 used)"
        v2.send(FILE_METADATA, json.dumps({"filename": "over-size.txt", "size": 1500}))
        assert await v2.recv_text() == "文件保存失败: over-size.txt: 1500 bytes is over the upload limit (1000 bytes)"
        send_file(v2, "fits.txt", b"sixty bytes of text, within the quota of one hundred bytes\n")
        assert OK.match(await v2.recv_text())["name"] == "fits.txt"
        v2.send(FILE_METADATA, json.dumps({"filename": "second.txt", "size": 50}))   # 59 used + 50 > 100
        assert await v2.recv_text() == "文件保存失败: second.txt: quota of 100 bytes reached (59 used)"
        v2.send(0x0D, b"x" * 50)              # the announced bytes are swallowed without a reply
        v2.send(0x01, "HEARTBEAT")
        assert await v2.recv_text() == "HEARTBEAT"
        assert [d.name for d in await srv.services.knowledge.list(LOCAL_USER, ())] == ["fits.txt"]
        await v2.close()
