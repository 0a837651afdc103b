"""KnowledgeBase: ingest with progress, dedupe, limits, bad input, delete, passages, downloads, restart."""
from __future__ import annotations

import hashlib
import threading

import pytest

from kb_testlib import make_docx, make_pdf
from server.errors import HandlerError
from server.knowledge import KnowledgeBase, KnowledgeConfig
from server.knowledge import kb as kb_module

RUNBOOK = ("# Backup\n\nThe backup job runs nightly at 02:00 and keeps 14 days.\n\n"
           "# 数据库\n\n主库位于杭州机房。从库位于上海机房，每五分钟同步一次。\n").encode()


async def code_of(coro) -> str:
    with pytest.raises(HandlerError) as e:
        await coro
    return e.value.code


async def test_ingest_reports_stages_and_search_cites(kb):
    events: list[tuple[str, int, int]] = []
    info = await kb.ingest("alice", [], None, "runbook.md", RUNBOOK, md5=hashlib.md5(RUNBOOK).hexdigest(),
                           progress=lambda *e: events.append(e))
    assert (info.name, info.size, info.chunks, info.collection, info.duplicate) == \
        ("runbook.md", len(RUNBOOK), 2, "user:alice", False)
    assert info.sha256 == hashlib.sha256(RUNBOOK).hexdigest()
    stages = [e[0] for e in events]
    assert [s for i, s in enumerate(stages) if s not in stages[:i]] == ["receiving", "parsing", "chunking", "indexing"]
    assert events[-1] == ("indexing", 2, 2) and ("receiving", len(RUNBOOK), len(RUNBOOK)) in events
    hits = await kb.search("alice", [], "从库在哪个机房", 3)
    assert hits[0].citation == "[runbook.md §数据库, line 7]" and "上海" in hits[0].text
    hits = await kb.search("alice", [], "when does the backup run?", 3)
    assert hits[0].chunk_id == f"{info.doc_id}:0" and hits[0].location == {"heading": ["Backup"], "lines": [3, 3]}
    assert (await kb.get_passage("alice", [], hits[0].chunk_id)).text == hits[0].text


async def test_parsing_and_indexing_run_off_the_event_loop(kb, monkeypatch):
    threads = []
    real = kb_module.parse

    def spy(*a):
        threads.append(threading.current_thread())
        return real(*a)
    monkeypatch.setattr(kb_module, "parse", spy)
    await kb.ingest("alice", [], None, "a.md", RUNBOOK)
    assert threads and threads[0] is not threading.main_thread()


async def test_same_bytes_are_one_document_per_collection(kb):
    a = await kb.ingest("alice", ["ops"], None, "a.md", RUNBOOK)
    b = await kb.ingest("alice", ["ops"], None, "renamed.md", RUNBOOK)
    assert b.duplicate and b.doc_id == a.doc_id and b.name == "a.md"
    assert len(kb.index) == a.chunks                                    # nothing re-indexed
    c = await kb.ingest("alice", ["ops"], "group:ops", "a.md", RUNBOOK)    # another collection: its own copy
    assert not c.duplicate and c.doc_id != a.doc_id
    assert [d.doc_id for d in await kb.list("alice", ["ops"])] == [c.doc_id, a.doc_id]
    assert not list((kb.store.tmp).iterdir())


async def test_bad_input_is_refused_with_stable_codes_and_keeps_nothing(tmp_path):
    cfg = KnowledgeConfig(max_upload_bytes=1000, user_quota_bytes=300, max_chunks_per_document=3,
                          chunk_target_chars=100, chunk_overlap_chars=10)
    kb = KnowledgeBase(cfg, tmp_path / "kb")
    await kb.start()
    try:
        assert await code_of(kb.ingest("u", [], None, "a.md", RUNBOOK, md5="0" * 32)) == "CHECKSUM_MISMATCH"
        assert await code_of(kb.ingest("u", [], None, "a.md", b"x" * 1001)) == "QUOTA_EXCEEDED"
        assert await code_of(kb.ingest("u", [], None, "a.md", ("word " * 199).encode())) == "QUOTA_EXCEEDED"  # chunks
        assert await code_of(kb.ingest("u", [], None, "a.exe", b"MZ")) == "UNSUPPORTED_MEDIA"
        assert await code_of(kb.ingest("u", [], None, "a.txt", b"")) == "UNSUPPORTED_MEDIA"
        assert await code_of(kb.ingest("u", [], None, "a.pdf", b"%PDF-1.7 broken")) == "UNSUPPORTED_MEDIA"
        assert await code_of(kb.ingest("u", [], None, "a.docx", b"PK\x03\x04junk")) == "UNSUPPORTED_MEDIA"
        for hostile in ("a\0.txt", "x" * 10_000 + ".txt", "..", "", "a\nb.txt"):
            assert await code_of(kb.ingest("u", [], None, hostile, b"text")) == "INVALID_MESSAGE"
        assert await code_of(kb.ingest("u", ["g"], "group:other", "a.md", b"text")) == "FORBIDDEN"
        assert await kb.list("u", []) == [] and len(kb.index) == 0
        assert not list(kb.store.tmp.iterdir()) and not list(kb.store.collections.iterdir())
        # a traversal name is only a name: stored under its base name, inside the data dir
        info = await kb.ingest("u", [], None, "../../etc/passwd.txt", b"root:x:0:0")
        assert info.name == "passwd.txt" and not (tmp_path / "etc").exists()
        first = await kb.ingest("u", [], None, "b.txt", b"y" * 250)
        assert await code_of(kb.ingest("u", [], None, "c.txt", b"z" * 250)) == "QUOTA_EXCEEDED"  # per-user quota
        await kb.delete("u", [], first.doc_id)
        await kb.ingest("u", [], None, "c.txt", b"z" * 250)                                    # room again
    finally:
        await kb.close()


async def test_a_document_repeating_one_word_is_indexed_and_found(kb):
    info = await kb.ingest("alice", [], None, "w.txt", ("spam " * 20_000).encode())
    assert info.chunks > 10
    hits = await kb.search("alice", [], "spam", 5)
    assert len(hits) == 5 and all(h.doc_id == info.doc_id for h in hits)


async def test_formats_ingest_from_paths(kb, tmp_path):
    files = {"m.pdf": make_pdf(["Failover takes 30 seconds"]), "d.docx": make_docx([("Failover", 1), ("Use the switch.", 0)]),
             "c.csv": b"service,port\npostgres,5432\n", "y.yaml": b"redis:\n  port: 6379\n",
             "h.html": b"<h1>Cache</h1><p>Memcached listens on 11211</p>", "j.json": b'{"kafka": {"port": 9092}}',
             "g.txt": "日志目录在/var/log/app下。".encode("gbk"), "l.log": b"ERROR disk full on db1\n"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        info = await kb.ingest("alice", [], None, name, tmp_path / name)
        assert info.size == len(data) and info.chunks >= 1
    for query, name in [("failover seconds", "m.pdf"), ("switch", "d.docx"), ("postgres port", "c.csv"),
                        ("redis", "y.yaml"), ("memcached", "h.html"), ("kafka", "j.json"), ("日志目录", "g.txt"),
                        ("disk full", "l.log")]:
        assert (await kb.search("alice", [], query, 1))[0].name == name, query
    [pdf_hit] = await kb.search("alice", [], "failover seconds", 1)
    assert pdf_hit.citation == "[m.pdf §p. 1]"


async def test_download_resumes_from_an_offset_and_md5_matches(kb):
    info = await kb.ingest("alice", [], None, "a.md", RUNBOOK)
    _, f = await kb.open_document("alice", [], info.doc_id)
    with f:
        head = f.read(10)
    _, f = await kb.open_document("alice", [], info.doc_id, offset=10)
    with f:
        rest = f.read()
    assert hashlib.md5(head + rest).hexdigest() == info.md5
    assert await code_of(kb.open_document("alice", [], info.doc_id, offset=info.size + 1)) == "INVALID_MESSAGE"


async def test_delete_only_by_uploader_or_admin(kb):
    info = await kb.ingest("alice", ["ops"], "group:ops", "a.md", RUNBOOK)
    assert await code_of(kb.delete("bob", ["ops"], info.doc_id)) == "FORBIDDEN"
    assert len(await kb.list("bob", ["ops"])) == 1
    await kb.delete("carol", ["ops"], info.doc_id, admin=True)
    assert await kb.list("alice", ["ops"]) == [] and len(kb.index) == 0
    assert await code_of(kb.delete("alice", ["ops"], info.doc_id)) == "NOT_FOUND"
    info = await kb.ingest("alice", ["ops"], "group:ops", "a.md", RUNBOOK)      # re-upload after delete: new
    assert not info.duplicate


async def test_documents_survive_a_restart(tmp_path, kb_config):
    kb = KnowledgeBase(kb_config, tmp_path / "kb")
    await kb.start()
    info = await kb.ingest("alice", [], None, "a.md", RUNBOOK)
    before = await kb.search("alice", [], "backup nightly", 2)
    await kb.close()
    kb = KnowledgeBase(kb_config, tmp_path / "kb")
    await kb.start()
    try:
        assert await kb.list("alice", []) == [info]
        assert await kb.search("alice", [], "backup nightly", 2) == before
        assert (await kb.ingest("alice", [], None, "b.md", RUNBOOK)).duplicate
    finally:
        await kb.close()


async def test_concurrent_uploads_of_the_same_bytes_make_one_document(kb):
    import asyncio
    results = await asyncio.gather(*(kb.ingest("alice", [], None, f"r{i}.md", RUNBOOK) for i in range(4)))
    assert len({r.doc_id for r in results}) == 1 and sum(not r.duplicate for r in results) == 1
    assert len(await kb.list("alice", [])) == 1 and len(kb.index) == results[0].chunks
    assert not list(kb.store.tmp.iterdir())


async def test_a_duplicate_is_reported_even_at_the_quota(tmp_path):
    kb = KnowledgeBase(KnowledgeConfig(user_quota_bytes=len(RUNBOOK)), tmp_path / "kb")
    await kb.start()
    try:
        first = await kb.ingest("alice", [], None, "a.md", RUNBOOK)
        assert (await kb.ingest("alice", [], None, "a.md", RUNBOOK)).duplicate     # no new bytes: no quota
        assert await code_of(kb.ingest("alice", [], None, "b.md", RUNBOOK + b"x")) == "QUOTA_EXCEEDED"
        assert await kb.list("alice", []) == [first]
    finally:
        await kb.close()


async def test_a_cancelled_ingest_leaves_nothing_behind(kb, monkeypatch):
    import asyncio
    started, release = threading.Event(), threading.Event()
    real = kb_module.parse

    def slow(*a):
        started.set()
        release.wait(30)
        return real(*a)
    monkeypatch.setattr(kb_module, "parse", slow)
    task = asyncio.create_task(kb.ingest("alice", [], None, "a.md", RUNBOOK))
    await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)
    task.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    from testkit.server import poll
    await poll(lambda: not list(kb.store.tmp.iterdir()))     # the staging thread ran on, then was cleaned
    assert await kb.list("alice", []) == []


async def test_a_document_whose_text_alone_makes_too_many_chunks_is_refused_before_chunking(tmp_path, monkeypatch):
    cfg = KnowledgeConfig(max_chunks_per_document=3, chunk_target_chars=100, chunk_overlap_chars=10)
    kb = KnowledgeBase(cfg, tmp_path / "kb")
    await kb.start()
    chunked = []
    monkeypatch.setattr(kb_module, "chunk_blocks", lambda *a: chunked.append(1) or [])
    try:
        with pytest.raises(HandlerError) as exc:
            await kb.ingest("u", [], None, "a.txt", ("word " * 80 + "\n\n").encode())   # 400 characters of text
        assert exc.value.code == "QUOTA_EXCEEDED" and "at least 4 chunks (limit 3)" in exc.value.message
        assert chunked == []
    finally:
        await kb.close()
