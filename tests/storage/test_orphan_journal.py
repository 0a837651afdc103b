"""A journal without a snapshot at startup: an empty one is what a create killed before its snapshot
was renamed in leaves (nothing was acknowledged), and is deleted with an INFO line; one with data
is still moved to quarantine/ with an ERROR line."""
from __future__ import annotations

import logging
import textwrap

from storage_testlib import journal_line, journal_path, msg_dict, quarantined

from storage.ids import new_session_id
from testkit.process import kill_at_point

CHILD = """
import sys, threading
from storage import HistoryStore, StorageConfig
from storage.flusher import JournalFlusher

def stalled(self, item):                 # the round that would rename the snapshot in never runs
    print("created", flush=True)
    threading.Event().wait()

store = HistoryStore(StorageConfig(root=sys.argv[1]))
JournalFlusher.request_file = stalled
store.create("u")
"""


def test_a_create_killed_midway_leaves_nothing_behind(open_store, root, tmp_path, caplog) -> None:
    store = open_store()
    kept = store.create("u", "kept").session_id
    store.close()
    child = tmp_path / "create_child.py"
    child.write_text(textwrap.dedent(CHILD))
    for _ in range(3):                                    # (each start cleans up after the last kill)
        kill_at_point(child, str(root), point="created")
        orphans = [p for p in root.glob("session_*.journal") if p != journal_path(root, kept)]
        assert len(orphans) == 1 and orphans[0].stat().st_size == 0
    caplog.set_level(logging.INFO, "storage")
    store = open_store()
    assert [r.session_id for r in store.list("u")[0]] == [kept]
    assert quarantined(root) == []
    assert sorted(p.name for p in root.glob("session_*")) == sorted(
        p.name for p in root.glob(f"session_*{kept}.*"))
    assert caplog.text.count("an empty journal without a snapshot") == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_an_orphan_journal_with_data_or_a_link_is_still_quarantined(open_store, root, tmp_path, caplog) -> None:
    open_store().close()
    full, linked = new_session_id(), new_session_id()
    journal_path(root, full).write_bytes(journal_line(1, "append", msg=msg_dict(1, "acknowledged once")))
    target = tmp_path / "empty-target"
    target.write_bytes(b"")
    journal_path(root, linked).symlink_to(target)
    caplog.set_level(logging.INFO, "storage")
    open_store().close()
    names = quarantined(root)
    assert len(names) == 2 and "journal without snapshot" in caplog.text
    [q_full] = [n for n in names if n.startswith(journal_path(root, full).name)]
    assert b"acknowledged once" in (root / "quarantine" / q_full).read_bytes()
    [q_link] = [n for n in names if n.startswith(journal_path(root, linked).name)]
    assert (root / "quarantine" / q_link).is_symlink() and target.exists()
