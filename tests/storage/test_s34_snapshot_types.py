"""Snapshot fields of the wrong type are neither coerced silently (``"deleted": "no"`` read as True
sent the session to the trash, ``"title": 123`` became "123", ``"created_at": "yesterday"`` and
``"updated_at": null`` were accepted) nor a reason to quarantine the whole session (a bad
``cleared_through_id`` did): each is replaced by a safe value with a WARNING naming the session and
the field, the original file is copied to quarantine/ once and the session is rewritten repaired."""
from __future__ import annotations

import json
import logging
import os
from datetime import datetime, timezone

import pytest

from storage import HistoryStore, StorageConfig
from storage.ids import snapshot_name
from storage.models import DEFAULT_TITLE, SessionRecord


def open_store(root) -> HistoryStore:
    return HistoryStore(StorageConfig(root=str(root)))


def edit(root, sid: str, change) -> None:
    path = root / snapshot_name(sid)
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def field_warnings(caplog, sid: str) -> dict[str, str]:
    out = {}
    for r in caplog.records:
        msg = r.getMessage()
        if r.levelno == logging.WARNING and f"session {sid}: snapshot field " in msg:
            out[msg.split("snapshot field ", 1)[1].split(":", 1)[0]] = msg
    return out


def test_wrong_types_are_repaired_with_a_warning_not_coerced_or_quarantined(tmp_path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="storage")
    root = tmp_path / "history"
    store = open_store(root)
    sid = store.create("alice").session_id
    first = store.append(sid, "user", "How do I rotate   nginx logs?\nsecond line")
    last = store.append(sid, "assistant", "Use logrotate.")
    store.clear(sid)                                   # cleared_through_id = 2: both hidden
    store.append(sid, "user", "after the clear")
    store.close()

    def damage(doc):
        doc["session"].update(title=123, deleted="no", created_at="yesterday", updated_at=None, title_auto="yes",
                              model=7, summaries="none")
        doc["cleared_through_id"] = "zero"
    edit(root, sid, damage)

    store = open_store(root)
    try:
        listed = store.list("alice")[0]
        assert [r.session_id for r in listed] == [sid]                    # not in the trash
        assert store.list("alice", deleted=True)[0] == []
        rec = store.get(sid)
        assert rec.deleted is False
        assert rec.title == "How do I rotate nginx logs? second line" and rec.title_auto is True
        assert rec.created_at == first.timestamp
        assert rec.updated_at == store.messages(sid)[-1].timestamp
        assert rec.model is None and rec.summaries == []
        # the counter that decides visibility: 0, every message visible, rather than the session lost
        assert [m.content for m in store.messages(sid)] == [first.content, last.content, "after the clear"]
    finally:
        store.close()
    warned = field_warnings(caplog, sid)
    assert set(warned) == {"title", "deleted", "created_at", "updated_at", "title_auto", "model", "summaries",
                           "cleared_through_id"}
    assert "'no' is not true or false, replaced by False" in warned["deleted"]
    assert "'yesterday' is not an ISO 8601 date" in warned["created_at"]
    [original] = (root / "quarantine").iterdir()                       # kept, once
    assert json.loads(original.read_text())["session"]["deleted"] == "no"
    fixed = json.loads((root / snapshot_name(sid)).read_text())
    assert fixed["session"]["deleted"] is False and fixed["cleared_through_id"] == 0

    caplog.clear()
    os.unlink(root / "index.json")                                     # read every file again
    store = open_store(root)
    try:
        assert [m.content for m in store.messages(sid)] == [first.content, last.content, "after the clear"]
    finally:
        store.close()
    assert field_warnings(caplog, sid) == {} and len(list((root / "quarantine").iterdir())) == 1


def test_an_empty_session_gets_its_dates_from_the_file(tmp_path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="storage")
    root = tmp_path / "history"
    store = open_store(root)
    sid = store.create("bob").session_id
    store.close()
    edit(root, sid, lambda doc: doc["session"].update(title=["x"], created_at=20261127, updated_at="soon"))
    mtime = datetime.fromtimestamp(os.stat(root / snapshot_name(sid)).st_mtime, timezone.utc).isoformat()
    os.unlink(root / "index.json")
    store = open_store(root)
    try:
        rec = store.get(sid)
        assert (rec.title, rec.title_auto, rec.created_at, rec.updated_at) == (DEFAULT_TITLE, False, mtime, mtime)
    finally:
        store.close()
    assert set(field_warnings(caplog, sid)) == {"title", "created_at", "updated_at"}


def test_bad_counters_keep_the_session(tmp_path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="storage")
    root = tmp_path / "history"
    store = open_store(root)
    sid = store.create("carol").session_id
    for i in range(3):
        store.append(sid, "user", f"m{i}")
    store.close()
    edit(root, sid, lambda doc: doc.update(next_id="four", last_seq=None))
    os.unlink(root / "index.json")
    store = open_store(root)
    try:
        assert store.append(sid, "user", "m3").id == 4
        assert [m.content for m in store.messages(sid)] == ["m0", "m1", "m2", "m3"]
    finally:
        store.close()
    assert set(field_warnings(caplog, sid)) == {"next_id", "last_seq"}
    assert not list((root / "quarantine").glob("*.journal.*"))


def test_an_edited_index_entry_is_not_trusted(tmp_path) -> None:
    root = tmp_path / "history"
    store = open_store(root)
    sid = store.create("dave").session_id
    store.close()
    doc = json.loads((root / "index.json").read_text())
    doc["sessions"][sid]["deleted"] = "no"
    (root / "index.json").write_text(json.dumps(doc))
    store = open_store(root)                       # rebuilt from the session files
    try:
        assert [r.session_id for r in store.list("dave")[0]] == [sid]
    finally:
        store.close()


@pytest.mark.parametrize("field,value", [("deleted", "no"), ("title", 123), ("created_at", "yesterday"),
                                         ("updated_at", None), ("message_count", "2"), ("title_auto", 1)])
def test_session_record_from_dict_is_strict(field, value) -> None:
    d = {"session_id": "s_20261127_aaaaaaaaaaaa", "user_id": "u", "title": "t",
         "created_at": "2026-11-27T10:00:00+00:00", "updated_at": "2026-11-27T10:00:00+00:00"}
    assert SessionRecord.from_dict(d).deleted is False
    with pytest.raises(ValueError, match=field):
        SessionRecord.from_dict({**d, field: value})
