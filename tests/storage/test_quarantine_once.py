"""A journal with unreadable lines is copied to quarantine/ once: the first read keeps its bytes
there and folds the journal into a new snapshot, so later reads (searches of a session that is not
loaded, reloads after an eviction, restarts) find nothing to copy again."""
from __future__ import annotations

import logging

from storage_testlib import journal_line, journal_path, last_seq, msg_dict, quarantined

BAD = b"\x00\x00 this line is not json\n"


def damaged(open_store, root) -> str:
    """A session whose journal holds, after three stored messages, a bad line among good ones."""
    store = open_store()
    sid = store.create("u", "plain").session_id
    for c in ("alpha one", "alpha two", "alpha three"):
        store.append(sid, "user", c)
    store.close()
    seq = last_seq(root, sid)
    journal_path(root, sid).write_bytes(
        journal_line(seq + 1, "append", msg=msg_dict(4, "alpha four"))
        + BAD
        + journal_line(seq + 2, "update", msg=msg_dict(77, "update of a missing message"))
        + journal_line(seq + 3, "rename", title="after the bad line"))
    return sid


def test_unreadable_lines_are_copied_once_whatever_the_number_of_reads(open_store, root, caplog) -> None:
    sid = damaged(open_store, root)
    caplog.set_level(logging.ERROR, "storage")
    store = open_store()                                 # (no index entry matches: read at start)
    for _ in range(5):
        assert len(store.search("u", "alpha")) == 4     # transient loads
    for _ in range(3):
        store.evict_idle(now=float("inf"))
        assert store.get(sid).title == "after the bad line"
    store.close()
    store = open_store()
    assert [m.content for m in store.messages(sid)] == ["alpha one", "alpha two", "alpha three", "alpha four"]
    store.close()
    [kept] = quarantined(root)
    assert kept.startswith(journal_path(root, sid).name)
    assert BAD in (root / "quarantine" / kept).read_bytes()            # kept once for the operator
    assert b"missing message" in (root / "quarantine" / kept).read_bytes()
    assert BAD not in journal_path(root, sid).read_bytes()
    assert caplog.text.count("journal with unreadable lines") == 1


def test_a_journal_damaged_while_the_store_runs_is_copied_once(open_store, root) -> None:
    """The session is not loaded: each search reads it from its files again (the reviewer's case:
    ten searches made ten copies, each with an ERROR line)."""
    store = open_store()
    sid = store.create("u", "plain").session_id
    store.append(sid, "user", "alpha one")
    store.close()
    store = open_store()
    store.append(sid, "user", "alpha two")
    store.evict_idle(now=float("inf"))
    jp = journal_path(root, sid)
    jp.write_bytes(BAD + jp.read_bytes())
    for _ in range(10):
        assert [h.snippet for h in store.search("u", "alpha")] == ["alpha two", "alpha one"]
    assert store.loaded_count() == 0
    store.close()
    assert len(quarantined(root)) == 1
