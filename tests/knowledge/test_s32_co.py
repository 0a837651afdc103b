"""Group co-uploaders kept by the file store (review s32, kb-co), in process:

- a member's duplicate upload into a group is recorded in the document's ``meta.json``
  (``co_uploaders``, rewritten atomically), so the uploader's delete after a restart still keeps the
  document for them (before: kept in memory only; after a restart alice's delete removed bob's upload);
- a ``meta.json`` written before the field (no ``co_uploaders``) still loads.
"""
from __future__ import annotations

import json

import pytest

from server.knowledge import KnowledgeBase, KnowledgeConfig
from server.knowledge.store import info_of

RUNBOOK = b"# Backup\n\nThe nightly backup writes to the vault at 02:00; restores take 40 minutes.\n"


def _config() -> KnowledgeConfig:
    return KnowledgeConfig(chunk_target_chars=200, chunk_overlap_chars=40)


async def _started(root) -> KnowledgeBase:
    kb = KnowledgeBase(_config(), root)
    await kb.start()
    return kb


def _meta_path(root, doc_id: str):
    [path] = list((root / "c").glob(f"*/{doc_id}/meta.json"))
    return path


async def test_co_uploaders_survive_a_restart_and_the_uploaders_delete_keeps_the_document(tmp_path):
    root = tmp_path / "kb"
    kb = await _started(root)
    try:
        a = await kb.ingest("alice", ["ops"], "group:ops", "backup.md", RUNBOOK)
        dup = await kb.ingest("bob", ["ops"], "group:ops", "bobs_backup.md", RUNBOOK)
        assert dup.duplicate and dup.doc_id == a.doc_id
        await kb.ingest("carol", ["ops"], "group:ops", "c.md", RUNBOOK)
    finally:
        await kb.close()
    meta_path = _meta_path(root, a.doc_id)
    meta = json.loads(meta_path.read_bytes())
    assert (meta["uploader"], meta["co_uploaders"]) == ("alice", ["bob", "carol"])
    assert not (meta_path.parent / "meta.json.tmp").exists()          # renamed over meta.json

    kb = await _started(root)                                         # a restart
    try:
        assert kb.co_uploaders(a.doc_id) == ("bob", "carol")          # before: () (memory only)
        kept = await kb.delete("alice", ["ops"], a.doc_id)
        assert kept is not None and kept.uploader == "bob"            # before: None, the document gone
        assert kb.co_uploaders(a.doc_id) == ("carol",)
        withdrawn = await kb.delete("carol", ["ops"], a.doc_id)
        assert withdrawn is not None and withdrawn.uploader == "bob" and kb.co_uploaders(a.doc_id) == ()
    finally:
        await kb.close()
    meta = json.loads(_meta_path(root, a.doc_id).read_bytes())
    assert (meta["uploader"], meta["co_uploaders"]) == ("bob", [])

    kb = await _started(root)
    try:
        [doc] = await kb.list("bob", ["ops"])
        assert (doc.doc_id, doc.uploader, doc.co_uploaders) == (a.doc_id, "bob", ())
        assert kb.usage("bob") == a.size and kb.usage("alice") == 0
        assert await kb.search("bob", ["ops"], "nightly backup vault")
        assert await kb.delete("bob", ["ops"], a.doc_id) is None      # the last uploader's delete removes it
        assert await kb.list("bob", ["ops"]) == []
    finally:
        await kb.close()


async def test_a_meta_json_without_co_uploaders_still_loads(tmp_path):
    root = tmp_path / "kb"
    kb = await _started(root)
    try:
        a = await kb.ingest("alice", ["ops"], "group:ops", "backup.md", RUNBOOK)
    finally:
        await kb.close()
    meta_path = _meta_path(root, a.doc_id)
    meta = json.loads(meta_path.read_bytes())
    del meta["co_uploaders"]                                           # as written before the field
    meta_path.write_bytes(json.dumps(meta).encode())
    kb = await _started(root)
    try:
        [doc] = await kb.list("alice", ["ops"])
        assert (doc.doc_id, doc.co_uploaders) == (a.doc_id, ())
        await kb.ingest("bob", ["ops"], "group:ops", "again.md", RUNBOOK)
        assert (await kb.delete("alice", ["ops"], a.doc_id)).uploader == "bob"
    finally:
        await kb.close()
    assert json.loads(meta_path.read_bytes())["co_uploaders"] == []
    assert json.loads(meta_path.read_bytes())["uploader"] == "bob"


def test_info_of_defaults_co_uploaders_and_reads_a_list_as_a_tuple():
    base = {"doc_id": "d" * 24, "name": "a.md", "md5": "m", "sha256": "s", "size": 1, "chunks": 1,
            "collection": "group:ops", "uploaded_at": "2026-11-27T00:00:00+00:00", "uploader": "alice"}
    assert info_of(base).co_uploaders == ()
    assert info_of({**base, "co_uploaders": ["bob"]}).co_uploaders == ("bob",)
    with pytest.raises(TypeError):
        info_of({**base, "co_uploaders": "bob"})
    with pytest.raises(TypeError):                                     # a required field missing
        info_of({k: v for k, v in base.items() if k != "uploader"})
