"""A v3 KB_UPLOAD_END whose bytes are all there is never refused, nor its upload lost, because the user's
ingests are all in progress (``max_ingests_per_user``): it waits for one to end. In single-user mode v2
and v3 clients are all user ``local``, so a few parallel uploads reach that limit. A connection that
closes while its END waits (or a server that stops) keeps the partial upload: BEGIN again resumes it
at its end, and END stores it. Over loopback TCP."""
from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

from protocol import MsgType
from server.auth import LOCAL_USER
from testkit.server import V3Client, poll, running_server

from kb_wire.kbwire import md5, send_data

KNOWLEDGE = {"max_ingests_per_user": 1, "max_uploads_per_user": 8}


def _doc(i: int) -> bytes:
    return f"runbook {i}: restart the relay on port {7100 + i} after the nightly backup.\n".encode() * 40


def _hold_the_slot(kb, gate: threading.Event) -> asyncio.Task:
    """An ingest of user ``local`` whose thread holds until ``gate`` is set (the user's only slot)."""
    return asyncio.get_running_loop().create_task(
        kb.ingest(LOCAL_USER, (), None, "blocker.txt", b"the blocker document\n", cancelled=lambda: not gate.wait(30)))


def _waiting(kb) -> int:
    return len(kb._slot_waiters.get(LOCAL_USER, ()))


def _partials(srv) -> set[str]:
    root = srv.services.uploads.root
    return {p.name for p in root.iterdir()} if root.exists() else set()


async def _send_all(c: V3Client, name: str, data: bytes) -> str:
    """BEGIN and every byte, written (KB_PROGRESS says so); the upload id."""
    begin = await c.call(MsgType.KB_UPLOAD_BEGIN, name=name, size=len(data), md5=md5(data))
    send_data(c, begin["handle"], begin["offset"], data[begin["offset"]:])
    await c.wait_for(lambda m: m.type == MsgType.KB_PROGRESS and m.body["upload_id"] == begin["upload_id"]
                     and m.body["stage"] == "receiving" and m.body["done"] == len(data))
    return begin["upload_id"]


def _end(c: V3Client, upload_id: str) -> asyncio.Task:
    return asyncio.get_running_loop().create_task(c.request(MsgType.KB_UPLOAD_END, upload_id=upload_id))


async def _end_waiting(kb, addr, name: str, data: bytes) -> tuple[V3Client, str, asyncio.Task]:
    """A client that sent all of ``name`` and whose KB_UPLOAD_END now waits for an ingest slot."""
    await poll(lambda: kb.ingests_in_progress(LOCAL_USER) == 1)
    c = await V3Client.connect(addr, new_session=False)
    uid = await _send_all(c, name, data)
    end = _end(c, uid)
    await poll(lambda: _waiting(kb) == 1 or end.done(), what="the END waiting")
    assert not end.done(), end.result().body
    return c, uid, end


async def test_parallel_uploads_beyond_the_ingest_limit_all_end_stored(tmp_path: Path) -> None:
    async with running_server(tmp_path, sections={"knowledge": KNOWLEDGE}) as (srv, addr):
        kb = srv.services.knowledge
        gate = threading.Event()
        blocker = _hold_the_slot(kb, gate)
        try:
            await poll(lambda: kb.ingests_in_progress(LOCAL_USER) == 1)
            clients = [await V3Client.connect(addr, new_session=False) for _ in range(4)]
            ids = await asyncio.gather(*(_send_all(c, f"runbook-{i}.txt", _doc(i)) for i, c in enumerate(clients)))
            ends = [_end(c, uid) for c, uid in zip(clients, ids)]
            await poll(lambda: _waiting(kb) == 4 or any(t.done() for t in ends), what="four ENDs waiting")
            assert not [t.result().body for t in ends if t.done()]      # (was: QUOTA_EXCEEDED, upload deleted)
            assert srv.services.uploads.reserved(LOCAL_USER)[0] == 4   # still counted while they wait
        finally:
            gate.set()
        assert (await blocker).name == "blocker.txt"
        for i, end in enumerate(ends):
            msg = await end
            assert msg.type == MsgType.RESPONSE, msg.body
            assert msg.body["document"]["name"] == f"runbook-{i}.txt" and msg.body["document"]["md5"] == md5(_doc(i))
        assert len(await kb.list(LOCAL_USER, ())) == 5 and _waiting(kb) == 0
        assert _partials(srv) == set() and srv.services.uploads.reserved(LOCAL_USER) == (0, 0)
        for c in clients:
            await c.close()


async def test_a_connection_closed_while_its_end_waits_keeps_the_upload_for_a_resume(tmp_path: Path) -> None:
    async with running_server(tmp_path, sections={"knowledge": KNOWLEDGE}) as (srv, addr):
        kb, uploads = srv.services.knowledge, srv.services.uploads
        gate = threading.Event()
        blocker = _hold_the_slot(kb, gate)
        try:
            leaver, uid, end = await _end_waiting(kb, addr, "left.txt", _doc(1))
            # the server closes the connection (as on CLIENT_KILL or IDLE_TIMEOUT)
            host, port = leaver.writer.get_extra_info("sockname")[:2]
            [conn] = [c for c in srv.services.connections if c.peer == f"{host}:{port}"]
            conn.close()
            await poll(lambda: _waiting(kb) == 0 and not uploads._ending, what="the END gave up")
            assert _partials(srv) == {f"{uid}.part", f"{uid}.json"}           # kept, still counted
            assert uploads.reserved(LOCAL_USER) == (1, len(_doc(1)))
        finally:
            gate.set()
        await blocker
        c = await V3Client.connect(addr, new_session=False)
        again = await c.call(MsgType.KB_UPLOAD_BEGIN, name="left.txt", size=len(_doc(1)), md5=md5(_doc(1)))
        assert again["upload_id"] == uid and again["offset"] == len(_doc(1))     # nothing to send again
        doc = (await c.call(MsgType.KB_UPLOAD_END, upload_id=uid))["document"]
        assert doc["name"] == "left.txt" and doc["md5"] == md5(_doc(1)) and _partials(srv) == set()
        await c.close()
        with contextlib.suppress(ConnectionError):           # (its END is never answered)
            await end
        await leaver.close()


async def test_a_server_stopping_while_an_end_waits_keeps_the_upload(tmp_path: Path) -> None:
    async with running_server(tmp_path, sections={"knowledge": KNOWLEDGE}) as (srv, addr):
        kb, uploads = srv.services.knowledge, srv.services.uploads
        gate = threading.Event()
        blocker = _hold_the_slot(kb, gate)
        try:
            c, uid, end = await _end_waiting(kb, addr, "late.txt", _doc(2))
            stopping = asyncio.get_running_loop().create_task(srv.stop(grace_s=5))
            await poll(lambda: not uploads._ending, what="the END gave up")
        finally:
            gate.set()
        await stopping
        with contextlib.suppress(Exception):
            await blocker
        with contextlib.suppress(ConnectionError):           # (its END is never answered)
            await end
        await c.close()
    async with running_server(tmp_path, sections={"knowledge": KNOWLEDGE}) as (srv, addr):
        c = await V3Client.connect(addr, new_session=False)
        again = await c.call(MsgType.KB_UPLOAD_BEGIN, name="late.txt", size=len(_doc(2)), md5=md5(_doc(2)))
        assert again["upload_id"] == uid and again["offset"] == len(_doc(2))
        doc = (await c.call(MsgType.KB_UPLOAD_END, upload_id=uid))["document"]
        assert doc["name"] == "late.txt" and _partials(srv) == set()
        await c.close()
