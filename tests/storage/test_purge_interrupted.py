"""A purging clear cut short by a crash (its journal line written, the files not rewritten yet) is
finished when the session is next read: the snapshot is rewritten without the purged messages and
the journal emptied, so their text does not stay on disk. The on-disk states a crash leaves are
built directly here (test_purge_files.py covers the uninterrupted clear)."""
from __future__ import annotations

import logging
from pathlib import Path

import orjson
from storage_testlib import journal_line, journal_path, last_seq, msg_dict, snap_path

SECRET = "wombat-7731"


def files_with(root: Path, needle: str) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_file() and needle.encode() in p.read_bytes())


def crashed_mid_clear(open_store, root: Path) -> str:
    """Two messages in the snapshot, a third and the purging clear of all three in the journal:
    what a crash right after the clear's journal line leaves."""
    store = open_store()
    sid = store.create("u", "plain").session_id
    store.append(sid, "user", f"one {SECRET}")
    store.append(sid, "assistant", f"two {SECRET}")
    store.close()
    seq = last_seq(root, sid)
    journal_path(root, sid).write_bytes(journal_line(seq + 1, "append", msg=msg_dict(3, f"three {SECRET}"))
                                        + journal_line(seq + 2, "clear", through=3, purge=True))
    return sid


def test_an_interrupted_purge_is_finished_at_startup(open_store, root, caplog) -> None:
    sid = crashed_mid_clear(open_store, root)
    caplog.set_level(logging.INFO, "storage")
    store = open_store()                                 # the journal changed: read at startup
    assert store.recovery_stats["reloaded"] == 1
    assert files_with(root, SECRET) == []
    assert journal_path(root, sid).stat().st_size == 0
    assert "finishing a purging clear" in caplog.text
    assert store.messages(sid) == [] and store.get(sid).message_count == 0
    assert store.append(sid, "user", "after").id == 4   # ids never go back
    store.close()
    store = open_store()
    assert [m.content for m in store.messages(sid)] == ["after"]


def test_an_interrupted_purge_is_finished_when_the_session_is_loaded(open_store, root) -> None:
    sid = crashed_mid_clear(open_store, root)
    index = orjson.loads((root / "index.json").read_bytes())
    entry = index["sessions"][sid]                      # the index was written after the clear's line
    entry["files"][3], entry["preview"], entry["message_count"] = journal_path(root, sid).stat().st_size, "", 0
    (root / "index.json").write_bytes(orjson.dumps(index))
    store = open_store()
    assert store.recovery_stats["reloaded"] == 0 and files_with(root, SECRET)
    assert store.get(sid).message_count == 0           # the first read finishes it
    assert files_with(root, SECRET) == []
    assert store.messages(sid) == [] and store.search("u", SECRET) == []


def test_a_crash_after_the_new_snapshot_before_the_journal_was_emptied(open_store, root) -> None:
    """The snapshot already went through the purge (all journal lines are older than its last_seq,
    so replay skips them), but the journal still holds the purged text: it is emptied."""
    store = open_store()
    sid = store.create("u", "plain").session_id
    store.append(sid, "user", f"one {SECRET}")
    store.clear(sid, purge=True)
    store.close()
    assert orjson.loads(snap_path(root, sid).read_bytes())["last_seq"] == 2
    journal_path(root, sid).write_bytes(journal_line(1, "append", msg=msg_dict(1, f"one {SECRET}"))
                                        + journal_line(2, "clear", through=1, purge=True))
    store = open_store()
    assert files_with(root, SECRET) == []
    assert store.messages(sid) == [] and store.append(sid, "user", "next").id == 2
