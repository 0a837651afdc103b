"""Purging rewrites the files: no purged text is left in the snapshot, the journal or index.json,
also when a background compaction is running at the same time."""
from __future__ import annotations

from pathlib import Path

from storage_testlib import journal_path, snap_path

SECRET = "quokka-5521"


def files_with(root: Path, needle: str) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_file() and needle.encode() in p.read_bytes())


def test_clear_purge_rewrites_snapshot_and_journal(open_store, root) -> None:
    store = open_store(durability="fsync")
    sid = store.create("alice", "plain").session_id
    store.append(sid, "user", f"the word is {SECRET}")
    store.compact(sid)                                   # the text is in the snapshot now
    store.append(sid, "assistant", f"noted: {SECRET}")   # and in the journal
    assert files_with(root, SECRET)
    assert store.clear(sid, purge=True) == 2
    assert files_with(root, SECRET) == []
    assert Path(journal_path(root, sid)).stat().st_size == 0
    store.append(sid, "user", "kept")
    store.close()
    store = open_store()
    assert [m.content for m in store.messages(sid)] == ["kept"]
    assert SECRET not in Path(snap_path(root, sid)).read_text()


def test_clear_purge_waits_for_a_background_compaction(open_store, root) -> None:
    store = open_store(compact_threshold=2, durability="batched", batch_ms=1)
    sid = store.create("alice", "plain").session_id
    for i in range(50):                                  # background compactions keep being queued
        store.append(sid, "user", f"{SECRET} {i}")
    store.clear(sid, purge=True)
    store.compactor.barrier()
    store.flush()
    assert files_with(root, SECRET) == []
    assert store.messages(sid) == []


def test_purge_rewrites_the_index_at_once(open_store, root) -> None:
    store = open_store(index_flush_ms=3_600_000)         # no periodic index write would come
    sid = store.create("alice", f"title {SECRET}").session_id
    store.append(sid, "user", f"preview {SECRET}")
    store.index.save()
    assert "index.json" in files_with(root, SECRET)
    store.delete(sid)
    store.purge(sid)
    assert files_with(root, SECRET) == []
