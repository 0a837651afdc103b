"""Knowledge-base fixes of review s32, in process:

- a coloured log (ANSI escape sequences) is read, its escapes removed (before: refused as "binary
  content in a text file", each "\\x1b[32m" counting as a control character); UTF-16 without a BOM is
  read by its NUL pattern (before: refused as binary for its NUL bytes);
- ``max_total_chunks`` bounds the whole index (before: only per document, user and collection; one
  user within the default 1 GiB quota could make ~10 GB of index);
- copies of one file under other names no longer fill the top k with the same passage;
- a group document another member uploaded too is kept for them when its uploader deletes it
  (before: the uploader's delete removed the other member's upload, who had been told it was stored).
"""
from __future__ import annotations

import pytest

from server.errors import HandlerError
from server.knowledge import KnowledgeBase, KnowledgeConfig
from server.knowledge.encodings import decode_text

COLOURED = b"".join(b"2026-11-01 10:00:%02d \x1b[32mINFO\x1b[0m served request %d ok\n" % (i, i) for i in range(40)) + \
    b"2026-11-01 10:01:00 \x1b[1;31mERROR\x1b[0m disk quota on /srv/vault exceeded\n" + \
    b"\x1b]0;tail -f app.log\x07\x1b]8;;https://ops.example/runbook\x1b\\runbook link\x1b]8;;\x1b\\\n"


def test_a_coloured_log_is_read_without_its_escape_sequences():
    text = decode_text(COLOURED)
    assert "\x1b" not in text
    assert "2026-11-01 10:00:00 INFO served request 0 ok" in text
    assert "ERROR disk quota on /srv/vault exceeded" in text
    assert text.splitlines()[-1] == "runbook link"
    assert text.count("\n") == COLOURED.count(b"\n")          # line numbers unchanged


def test_stray_control_characters_still_make_a_file_binary():
    with pytest.raises(HandlerError) as exc:
        decode_text(b"\x1b\x01\x02\x03 not text" * 50)
    assert exc.value.code == "UNSUPPORTED_MEDIA"


@pytest.mark.parametrize("text", [
    "backup window: Saturday 02:00-04:00\nretention: 30 days\n",
    "无BOM的小端序文件，内容是监控配置说明。告警阈值为百分之八十。\n",      # mostly Chinese: NULs only in "\n"
    "一二三 维护窗口 maintenance 周六 02:00\n",                            # U+4E00 has a NUL low byte
])
@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be"])
def test_utf16_without_a_bom_is_read(text, codec):
    assert decode_text(text.encode(codec)) == text


@pytest.mark.parametrize("data", [b"\x00" * 64, b"ab\x00\x00cd\x00\x00", bytes(range(256)) * 8,
                                  b"\x01\x00\x02\x00\x03\x00" * 30])
def test_binary_with_nul_bytes_is_still_refused(data):
    with pytest.raises(HandlerError) as exc:
        decode_text(data)
    assert exc.value.code == "UNSUPPORTED_MEDIA"


async def test_a_coloured_log_is_ingested_and_cited_without_escapes(kb):
    info = await kb.ingest("alice", [], None, "app.log", COLOURED)
    [hit] = await kb.search("alice", [], "disk quota vault exceeded", top_k=1)
    assert hit.doc_id == info.doc_id and "\x1b" not in hit.text and "ERROR disk quota" in hit.text


def _doc(i: int) -> bytes:
    return "\n\n".join(f"Paragraph {i}-{p}: the service number {i} restarts its worker pool {p} at night. " * 3
                       for p in range(6)).encode()


async def test_max_total_chunks_bounds_the_whole_index(tmp_path):
    cfg = KnowledgeConfig(chunk_target_chars=200, chunk_overlap_chars=40, max_total_chunks=20)
    kb = KnowledgeBase(cfg, tmp_path / "kb")
    await kb.start()
    try:
        first = await kb.ingest("alice", [], None, "a.md", _doc(1))
        assert 0 < first.chunks <= 20
        with pytest.raises(HandlerError) as exc:          # another user, another collection: the same bound
            for i in range(2, 10):
                await kb.ingest(f"user{i}", [], None, "b.md", _doc(i))
        assert exc.value.code == "QUOTA_EXCEEDED" and "max_total_chunks = 20" in exc.value.message
        assert len(kb.index) <= 20
        assert sum(d.chunks for d in await kb.list("alice", [])) == first.chunks
        await kb.delete("alice", [], first.doc_id)         # room again
        assert (await kb.ingest("zed", [], None, "c.md", _doc(42))).chunks > 0
    finally:
        await kb.close()


async def test_the_bound_counts_commits_in_flight(tmp_path):
    import asyncio
    cfg = KnowledgeConfig(chunk_target_chars=200, chunk_overlap_chars=40, max_total_chunks=20,
                          ingest_workers=4, max_running_ingests_per_user=4)
    kb = KnowledgeBase(cfg, tmp_path / "kb")
    await kb.start()
    try:
        results = await asyncio.gather(*(kb.ingest(f"u{i}", [], None, "d.md", _doc(i)) for i in range(6)),
                                       return_exceptions=True)
        refused = [r for r in results if isinstance(r, HandlerError)]
        assert refused and all(r.code == "QUOTA_EXCEEDED" for r in refused)
        assert len(kb.index) <= 20 and kb._committing == {}
    finally:
        await kb.close()


RUNBOOK = ("# Backup\n\nThe nightly backup copies /srv/data to the vault at 02:00.\n\n"
           "# Restore\n\nRun restore.sh with the snapshot id; the vault keeps 30 snapshots.\n").encode()


async def test_copies_under_other_names_take_one_place_in_the_top_k(kb):
    for i in range(6):                                  # the same bytes under six names
        await kb.ingest("alice", [], None, f"copy{i}.md", RUNBOOK + b"\n" + b" " * i)
    other = await kb.ingest("alice", [], None, "vault.md", b"# Vault\n\nThe vault is checked for snapshots weekly.\n")
    hits = await kb.search("alice", [], "vault snapshots backup restore", top_k=5)
    texts = [h.text for h in hits]
    assert len(texts) == len(set(texts)), texts           # before: the same passage five times
    assert other.doc_id in {h.doc_id for h in hits}


async def test_without_copies_the_top_k_is_unchanged(kb):
    docs = [f"# Note {i}\n\nThe vault rotates key {i} every {i + 2} days.\n".encode() for i in range(8)]
    for i, d in enumerate(docs):
        await kb.ingest("alice", [], None, f"n{i}.md", d)
    with kb.lock:
        raw = kb.index.search("vault rotates key", ["user:alice"], 5, None, visible=["user:alice"])
    hits = await kb.search("alice", [], "vault rotates key", top_k=5)
    assert [(h.chunk_id, h.score) for h in hits] == [(f"{k[0]}:{k[1]}", round(s, 6)) for k, s in raw]


async def test_the_uploaders_delete_keeps_a_group_document_another_member_uploaded(kb):
    a = await kb.ingest("alice", ["ops"], "group:ops", "matrix.txt", RUNBOOK)
    b = await kb.ingest("bob", ["ops"], "group:ops", "bobs_matrix.txt", RUNBOOK)
    assert b.duplicate and b.doc_id == a.doc_id
    assert kb.co_uploaders(a.doc_id) == ("bob",)
    kept = await kb.delete("alice", ["ops"], a.doc_id)
    assert kept is not None and kept.uploader == "bob"        # before: None, and the document gone
    [doc] = await kb.list("bob", ["ops"])
    assert doc.doc_id == a.doc_id and doc.uploader == "bob"
    assert await kb.search("bob", ["ops"], "nightly backup vault")
    assert kb.usage("bob") == a.size and kb.usage("alice") == 0
    with pytest.raises(HandlerError) as exc:                  # no longer alice's
        await kb.delete("alice", ["ops"], a.doc_id)
    assert exc.value.code == "FORBIDDEN"
    assert await kb.delete("bob", ["ops"], a.doc_id) is None  # the last uploader's delete removes it
    assert await kb.list("bob", ["ops"]) == []


async def test_a_co_uploaders_delete_withdraws_their_upload_only(kb):
    a = await kb.ingest("alice", ["ops"], "group:ops", "m.txt", RUNBOOK)
    await kb.ingest("bob", ["ops"], "group:ops", "m2.txt", RUNBOOK)
    await kb.ingest("carol", ["ops"], "group:ops", "m3.txt", RUNBOOK)
    assert kb.co_uploaders(a.doc_id) == ("bob", "carol")
    kept = await kb.delete("bob", ["ops"], a.doc_id)
    assert kept is not None and kept.uploader == "alice" and kb.co_uploaders(a.doc_id) == ("carol",)
    assert (await kb.delete("alice", ["ops"], a.doc_id)).uploader == "carol"
    with pytest.raises(HandlerError) as exc:                  # dave never uploaded it
        await kb.delete("dave", ["ops"], a.doc_id)
    assert exc.value.code == "FORBIDDEN"
    assert await kb.delete("root", ["ops"], a.doc_id, admin=True) is None   # an admin removes it for all
    assert await kb.list("carol", ["ops"]) == []


async def test_personal_duplicates_and_the_same_uploader_record_nobody(kb):
    a = await kb.ingest("alice", ["ops"], None, "m.txt", RUNBOOK)
    await kb.ingest("alice", ["ops"], None, "again.txt", RUNBOOK)
    g = await kb.ingest("alice", ["ops"], "group:ops", "m.txt", RUNBOOK)
    await kb.ingest("alice", ["ops"], "group:ops", "again.txt", RUNBOOK)
    assert kb.co_uploaders(a.doc_id) == () and kb.co_uploaders(g.doc_id) == ()
    assert await kb.delete("alice", ["ops"], g.doc_id) is None
