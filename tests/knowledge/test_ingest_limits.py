"""Ingest threads under load: one user cannot hold every thread, a cancelled ingest (caller gone,
server closing) frees its thread at the next page, and a bad passage id is NOT_FOUND. Real threads,
real (slow but legal) PDFs; over loopback too."""
from __future__ import annotations

import asyncio
import time

import pytest

from bomb_testlib import shared_stream_pdf, text_lines
from protocol import MsgType
from server.errors import HandlerError
from server.knowledge import KnowledgeBase, KnowledgeConfig
from testkit.server import poll

# ~60 ms of pypdf work a page, 1000 pages: a minute of one thread unless it is stopped
SLOW_PAGES, SLOW_LINES = 1000, 2000
ROOMY = {"pdf_max_content_bytes": 1 << 34, "ingest_workers": 2}


def slow_pdf(tag: str) -> bytes:
    return shared_stream_pdf(SLOW_PAGES, text_lines(SLOW_LINES), tag.encode())


class Events:
    """Progress callbacks of one ingest: the stages seen, and an event per stage."""
    def __init__(self) -> None:
        self.stages: list[str] = []
        self.seen = {s: asyncio.Event() for s in ("receiving", "parsing", "chunking", "indexing")}

    def __call__(self, stage: str, done: int, total: int) -> None:
        self.stages.append(stage)
        self.seen[stage].set()


async def code_of(aw) -> str:
    with pytest.raises(HandlerError) as e:
        await aw
    return e.value.code


async def test_one_user_holds_one_thread_others_go_first_and_cancel_frees_it(tmp_path):
    kb = KnowledgeBase(KnowledgeConfig(max_ingests_per_user=2, **ROOMY), tmp_path / "kb")
    await kb.start()
    try:
        first, second = Events(), Events()
        t1 = asyncio.create_task(kb.ingest("alice", [], None, "a1.pdf", slow_pdf("1"), progress=first))
        await asyncio.wait_for(first.seen["parsing"].wait(), 10)
        t2 = asyncio.create_task(kb.ingest("alice", [], None, "a2.pdf", slow_pdf("2"), progress=second))
        await poll(lambda: kb.ingests_in_progress("alice") == 2, timeout=10, what="alice's second ingest waiting")
        # a third of alice's ingests is refused at once: two are running or waiting
        assert await code_of(kb.ingest("alice", [], None, "a3.txt", b"third")) == "QUOTA_EXCEEDED"
        # bob's small upload does not wait behind alice's minute-long job
        t0 = time.monotonic()
        info = await asyncio.wait_for(kb.ingest("bob", [], None, "tiny.txt", b"hello tiny document\n"), 10)
        assert info.chunks == 1 and time.monotonic() - t0 < 10
        assert "receiving" not in second.stages          # alice's second waits its turn without a thread
        assert not t1.done() and not t2.done()
        # alice's first caller goes away: its thread stops at the next page, her second starts
        t1.cancel()
        await asyncio.wait_for(second.seen["parsing"].wait(), 10)
        with pytest.raises(asyncio.CancelledError):
            await t1
        # closing the knowledge base stops the running ingest within its grace, not after a minute
        t0 = time.monotonic()
        await asyncio.wait_for(kb.close(), 10)
        assert time.monotonic() - t0 < 10
        assert await code_of(t2) == "SHUTTING_DOWN"
        assert [d.name for d in await kb.list("alice", [])] == [] and not list(kb.store.tmp.iterdir())
    finally:
        await kb.close()


async def test_bad_passage_ids_are_not_found(kb):
    info = await kb.ingest("alice", [], None, "a.md", b"# T\n\nsome text here\n")
    assert (await kb.get_passage("alice", [], f"{info.doc_id}:0")).text == "some text here"
    for n in ("\u00b2", "\u0663", "\u2460", "9" * 5000, "-1", "", "0x1", " 0"):
        assert await code_of(kb.get_passage("alice", [], f"{info.doc_id}:{n}")) == "NOT_FOUND", n


async def test_over_loopback_a_users_big_jobs_leave_room_and_shutdown_keeps_its_grace(tmp_path):
    from kb_wire.kbwire import connect, kb_server, md5, raw_upload, send_data
    async with kb_server(tmp_path, {**ROOMY, "max_ingests_per_user": 4}) as (srv, addr):
        alice = [await connect(addr, "alice") for _ in range(2)]
        for i, c in enumerate(alice):                        # two uploads, END sent, not awaited
            data = slow_pdf(f"tcp{i}")
            begin = await c.call(MsgType.KB_UPLOAD_BEGIN, name=f"big{i}.pdf", size=len(data), md5=md5(data))
            send_data(c, begin["handle"], 0, data)
            c.send(MsgType.KB_UPLOAD_END, {"id": "end", "upload_id": begin["upload_id"]})

        def parsing(c) -> bool:
            return any(m.type == MsgType.KB_PROGRESS and m.body.get("stage") == "parsing" for m in c.inbox)
        await poll(lambda: any(parsing(c) for c in alice), timeout=10, what="alice's ingest parsing")
        bob = await connect(addr, "bob")
        t0 = time.monotonic()
        reply = await raw_upload(bob, "tiny.txt", b"hello tiny document\n")
        assert reply["document"]["chunks"] == 1 and time.monotonic() - t0 < 10
        assert [parsing(c) for c in alice].count(True) == 1    # alice's other ingest holds no thread
        await bob.close()
        for c in alice:                                      # alice leaves; her jobs are still running
            await c.close()
        t0 = time.monotonic()
        await srv.stop(grace_s=0.5)
        assert time.monotonic() - t0 < 8                     # not the minute her ingests would take
