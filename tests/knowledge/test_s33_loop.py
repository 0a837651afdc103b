"""The knowledge base and the event loop: a staged document's term bags are freed off the loop after
its ingest; the stored documents load in the background (knowledge requests answer SERVER_BUSY
"still loading" meanwhile), with progress logged."""
from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from protocol import ErrorCode
from server.errors import HandlerError
from server.knowledge import KnowledgeBase
from server.knowledge import kb as kb_module
from server.tools.knowledge import KnowledgeSource, search_knowledge
from server.tools.units import ToolFailure

TEXT = "\n\n".join(f"Section {i}: the nightly backup of node {i} restores the nginx config after a timeout."
                   for i in range(40)).encode()


class _Tracked(dict):
    """A term bag that records the thread it is freed in."""
    freed: list[int] = []

    def __del__(self) -> None:
        _Tracked.freed.append(threading.get_ident())


async def test_term_bags_are_freed_off_the_event_loop(kb, monkeypatch):
    real = kb_module.chunk_terms
    monkeypatch.setattr(kb_module, "chunk_terms", lambda *a: _Tracked(real(*a)))
    _Tracked.freed = []
    loop_thread = threading.get_ident()
    info = await kb.ingest("alice", (), None, "notes.md", TEXT)
    assert info.chunks > 5
    assert len(_Tracked.freed) == info.chunks             # every bag freed by the time ingest returns
    assert loop_thread not in _Tracked.freed              # ... none of them on the event loop
    assert [h.doc_id for h in await kb.search("alice", (), "nginx timeout")][:1] == [info.doc_id]


async def _gated(tmp_path, kb_config):
    """A knowledge base over a store holding two documents, whose load waits for the gate."""
    first = KnowledgeBase(kb_config, tmp_path / "kb")
    await first.start()
    docs = [await first.ingest("alice", (), None, f"doc{i}.md", TEXT + f"\n\nunique{i}".encode()) for i in range(2)]
    await first.close()
    kb = KnowledgeBase(kb_config, tmp_path / "kb")
    gate = asyncio.Event()
    load = kb.store.load

    async def gated_load(each):
        await gate.wait()
        await load(each)
    kb.store.load = gated_load
    await kb.open()
    kb.load_in_background()
    return kb, gate, docs


async def test_requests_answer_still_loading_until_the_load_ends(tmp_path, kb_config):
    kb, gate, docs = await _gated(tmp_path, kb_config)
    try:
        calls = [kb.list("alice", ()), kb.search("alice", (), "nginx"), kb.get("alice", (), docs[0].doc_id),
                 kb.get_passage("alice", (), f"{docs[0].doc_id}:0"), kb.delete("alice", (), docs[0].doc_id),
                 kb.open_document("alice", (), docs[0].doc_id),
                 kb.ingest("alice", (), None, "new.md", b"some new text")]
        for call in calls:
            with pytest.raises(HandlerError) as err:
                await call
            assert err.value.code == ErrorCode.SERVER_BUSY and "still loading" in err.value.message
        with pytest.raises(HandlerError) as err:     # (an upload's BEGIN asks the usage: refused at once)
            kb.usage("alice")
        assert err.value.code == ErrorCode.SERVER_BUSY
        # the agent's knowledge search says so too
        with pytest.raises(ToolFailure, match="SERVER_BUSY: the knowledge base is still loading"):
            await search_knowledge(KnowledgeSource(kb, lambda _u: ()), {"query": "nginx", "top_k": 3}, "alice")
        assert kb.load_state == "loading"
        gate.set()
        await asyncio.wait_for(kb.wait_loaded(), 10)
        assert kb.load_state == "ready"
        assert {d.doc_id for d in await kb.list("alice", ())} == {d.doc_id for d in docs}
        assert await kb.search("alice", (), "unique1")
    finally:
        gate.set()
        await kb.close()


async def test_the_load_logs_its_progress_and_its_end(tmp_path, kb_config, monkeypatch, caplog):
    monkeypatch.setattr(kb_module, "LOAD_PROGRESS_S", 0.0)       # (a progress line after every document)
    caplog.set_level(logging.INFO, logger="nplt.knowledge")
    kb, gate, docs = await _gated(tmp_path, kb_config)
    try:
        gate.set()
        await asyncio.wait_for(kb.wait_loaded(), 10)
        text = caplog.text
        assert "knowledge base: loading the stored documents" in text
        assert "loading: 1 documents" in text and "loading: 2 documents" in text
        chunks = sum(d.chunks for d in docs)
        assert f"knowledge base: loaded 2 documents ({chunks} chunks) in " in text
    finally:
        await kb.close()


async def test_close_stops_a_load_under_way(tmp_path, kb_config):
    kb, gate, _docs = await _gated(tmp_path, kb_config)
    closing = asyncio.create_task(kb.close())
    asyncio.get_running_loop().call_soon(gate.set)     # (after close's first step: the load is at the gate)
    await asyncio.wait_for(closing, 10)
    assert kb.load_state == "failed" and len(kb.index) == 0
