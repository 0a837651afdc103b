"""Crash leftovers and corruption: torn and garbage journal lines, corrupt/truncated/newer snapshots,
replay idempotence after compaction, index loss and staleness, orphan and temp files, batched mode."""
from __future__ import annotations

import logging
import os
import threading
import time

import orjson
import pytest
from storage_testlib import drain, journal_line, journal_path, last_seq, msg_dict, quarantined, snap_path

from storage import CorruptSession, NotFound


def contents(store, sid: str) -> list[tuple[int, str]]:
    return [(m.id, m.content) for m in store.messages(sid)]


def three(open_store) -> str:
    store = open_store()
    sid = store.create("u").session_id
    for c in ("one", "two", "three"):
        store.append(sid, "user", c)
    store.close()
    return sid


def test_torn_last_journal_line_is_ignored_and_cut(open_store, root, caplog) -> None:
    sid = three(open_store)
    seq = last_seq(root, sid)
    journal_path(root, sid).write_bytes(journal_line(seq + 1, "append", msg=msg_dict(4, "four"))
                                        + b'{"seq": 99, "op": "append", "msg": {"id": 5, "con')
    caplog.set_level(logging.WARNING, "storage")
    store = open_store()
    assert contents(store, sid) == [(1, "one"), (2, "two"), (3, "three"), (4, "four")]
    assert "torn last line" in caplog.text
    assert store.append(sid, "user", "five").id == 5      # appended after the cut, not glued to it
    store.close()
    assert all(orjson.loads(line) for line in journal_path(root, sid).read_bytes().splitlines())
    store = open_store()
    assert contents(store, sid)[-2:] == [(4, "four"), (5, "five")]
    assert quarantined(root) == []


def test_garbage_line_in_the_middle_is_skipped_and_kept_aside(open_store, root, caplog) -> None:
    sid = three(open_store)
    seq = last_seq(root, sid)
    journal_path(root, sid).write_bytes(
        journal_line(seq - 1, "append", msg=msg_dict(2, "stale, already in the snapshot"))
        + journal_line(seq + 1, "append", msg=msg_dict(4, "four"))
        + b"\x00\x00 not json at all\n"
        + journal_line(seq + 3, "update", msg=msg_dict(77, "update of a missing message"))
        + journal_line(seq + 4, "append", msg=msg_dict(5, "five"))
        + journal_line(seq + 5, "rename", title="renamed"))
    caplog.set_level(logging.WARNING, "storage")
    store = open_store()
    assert contents(store, sid) == [(1, "one"), (2, "two"), (3, "three"), (4, "four"), (5, "five")]
    assert store.get(sid).title == "renamed"
    assert "unreadable lines [3]" in caplog.text and f"seq [{seq + 3}]" in caplog.text
    kept = quarantined(root)
    assert kept and kept[0].startswith(journal_path(root, sid).name)
    assert b"not json at all" in (root / "quarantine" / kept[0]).read_bytes()


def test_corrupt_snapshot_is_quarantined_at_startup(open_store, root, caplog) -> None:
    store = open_store()
    bad = store.create("u", "bad").session_id
    good = store.create("u", "good").session_id
    store.append(bad, "user", "x")
    store.append(good, "user", "y")
    store.close()
    snap_path(root, bad).write_bytes(b'{"schema_version": 1, "session": {"trunc')
    caplog.set_level(logging.ERROR, "storage")
    store = open_store()
    assert [r.session_id for r in store.list("u")[0]] == [good]
    with pytest.raises(NotFound):
        store.get(bad)
    assert contents(store, good) == [(1, "y")]
    names = quarantined(root)
    assert any(n.startswith(snap_path(root, bad).name) for n in names)
    assert any(n.startswith(journal_path(root, bad).name) for n in names)
    qsnap = next(n for n in names if n.startswith(snap_path(root, bad).name))
    assert (root / "quarantine" / qsnap).read_bytes() == b'{"schema_version": 1, "session": {"trunc'
    assert not snap_path(root, bad).exists() and "corrupt snapshot" in caplog.text


def test_corrupt_snapshot_found_on_load_does_not_hurt_others(open_store, root) -> None:
    store = open_store()
    bad, good = store.create("u").session_id, store.create("u").session_id
    store.append(bad, "user", "x")
    store.close()
    p = snap_path(root, bad)
    st = p.stat()
    with open(p, "r+b") as f:                              # same inode, size and mtime: index trusts it
        f.write(b"#" * 12)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    store = open_store()
    assert store.recovery_stats["reloaded"] == 0
    with pytest.raises(CorruptSession, match="moved to quarantine/") as ei:
        store.page(bad)
    assert ei.value.code == "NOT_FOUND"
    with pytest.raises(NotFound):
        store.get(bad)
    assert store.append(good, "user", "fine").id == 1
    assert len(quarantined(root)) == 2


@pytest.mark.parametrize("damage", ["truncate", "not_object", "bad_ids", "missing_session"])
def test_damaged_snapshots_are_quarantined(open_store, root, damage: str) -> None:
    sid = three(open_store)
    p = snap_path(root, sid)
    data = p.read_bytes()
    doc = orjson.loads(data)
    if damage == "truncate":
        p.write_bytes(data[: len(data) // 2])
    elif damage == "not_object":
        p.write_bytes(b"[1, 2, 3]")
    elif damage == "bad_ids":
        doc["messages"][2]["id"] = 1
        p.write_bytes(orjson.dumps(doc))
    else:
        del doc["session"]
        p.write_bytes(orjson.dumps(doc))
    store = open_store()
    with pytest.raises(NotFound):
        store.get(sid)
    assert quarantined(root)


def test_newer_schema_is_left_in_place(open_store, root) -> None:
    sid = three(open_store)
    p = snap_path(root, sid)
    doc = orjson.loads(p.read_bytes())
    doc["schema_version"] = 99
    p.write_bytes(orjson.dumps(doc))
    store = open_store()
    with pytest.raises(NotFound):
        store.get(sid)
    assert p.exists() and quarantined(root) == []


def test_replay_after_compaction_crash_does_not_duplicate(open_store, root) -> None:
    store = open_store(compact_threshold=1000)
    sid = store.create("u").session_id
    for i in range(10):
        store.append(sid, "user", f"m{i}")
    store.clear(sid)
    store.append(sid, "user", "after")
    journal = journal_path(root, sid).read_bytes()
    assert journal.count(b"\n") == 12
    store.close()                                          # compacts: snapshot has all, journal empty
    assert journal_path(root, sid).read_bytes() == b""
    journal_path(root, sid).write_bytes(journal)           # as if killed between rename and truncation
    store = open_store()
    assert contents(store, sid) == [(11, "after")]
    store.restore(sid)
    assert [m.id for m in store.messages(sid)] == list(range(1, 12))
    assert store.append(sid, "user", "next").id == 12


def test_background_compaction_keeps_journal_short(open_store, root) -> None:
    store = open_store(compact_threshold=10)
    sid = store.create("u").session_id
    for i in range(35):
        store.append(sid, "user", f"m{i}")
    drain(store)
    snap = orjson.loads(snap_path(root, sid).read_bytes())
    lines = journal_path(root, sid).read_bytes().splitlines()
    assert len(lines) < 10                                 # (a compaction finishing over 10 queues the next)
    assert len(snap["messages"]) + len(lines) == 35
    assert all(orjson.loads(x)["seq"] > snap["last_seq"] for x in lines)
    store.close()
    store = open_store()
    assert [m.id for m in store.messages(sid)] == list(range(1, 36))


def test_journal_refilled_during_compaction_is_compacted_again(open_store, root) -> None:
    """Appends made while a background compaction runs are compacted by a follow-up without a new append."""
    store = open_store(compact_threshold=10)
    sid = store.create("u").session_id
    gate = threading.Event()
    blocker = store.compactor._pool.submit(gate.wait, 30)          # hold the single compaction worker
    for i in range(25):                                       # 10 queue a compaction, 15 more refill
        store.append(sid, "user", f"m{i}")
    gate.set()
    assert blocker.result(timeout=30) is True
    drain(store)
    snap = orjson.loads(snap_path(root, sid).read_bytes())
    assert [m["content"] for m in snap["messages"]] == [f"m{i}" for i in range(25)]
    assert journal_path(root, sid).read_bytes() == b""
    store.close()
    store = open_store()
    assert [m.id for m in store.messages(sid)] == list(range(1, 26))


def test_missing_corrupt_and_misshapen_index_is_rebuilt(open_store, root) -> None:
    store = open_store()
    sids = [store.create("u", f"t{i}").session_id for i in range(3)]
    store.append(sids[1], "user", "hello")
    store.close()
    store = open_store()
    expected = [(r.session_id, r.title, r.message_count) for r in store.list("u")[0]]
    store.close()
    index = root / "index.json"
    for damage in (None, b"garbage{", b'{"schema_version": 1, "sessions": []}', b'{"schema_version": 7}', b"[1]",
                   b'{"schema_version": 1, "sessions": {"s_20261122_000000000000": {"user_id": 5}}}'):
        if damage is None:
            index.unlink()
        else:
            index.write_bytes(damage)
        store = open_store()
        assert store.recovery_stats["reloaded"] == 3
        assert [(r.session_id, r.title, r.message_count) for r in store.list("u")[0]] == expected
        store.close()
        assert orjson.loads(index.read_bytes())["sessions"].keys() == set(sids)


def test_stale_index_is_refreshed_per_session(open_store, root) -> None:
    store = open_store()
    s1, s2, s3, s4 = (store.create("u", f"t{i}").session_id for i in range(4))
    store.close()
    old_index = (root / "index.json").read_bytes()
    store = open_store()
    assert store.recovery_stats["reloaded"] == 0           # fresh index: no history file opened
    store.append(s1, "user", "new message")
    store.rename(s2, "renamed")
    s5 = store.create("u", "new").session_id
    store.purge(s4)
    store.close()
    (root / "index.json").write_bytes(old_index)
    store = open_store()
    assert store.recovery_stats == {"sessions": 4, "reloaded": 3, "dropped": 1, "orphans": 0}
    listed = {r.session_id: (r.title, r.message_count) for r in store.list("u")[0]}
    assert listed == {s1: ("t0", 1), s2: ("renamed", 0), s3: ("t2", 0), s5: ("new", 0)}


def test_orphan_journal_and_temp_files_at_startup(open_store, root) -> None:
    sid = three(open_store)
    orphan = journal_path(root, "s_20200101_00000000abcd")
    orphan.write_bytes(journal_line(1, "append", msg=msg_dict(1, "lost")))
    tmp1 = root / (snap_path(root, sid).name + ".tmp")
    tmp2 = root / "index.json.tmp"
    tmp1.write_bytes(b"half a snapshot")
    tmp2.write_bytes(b"half an index")
    (root / "notes.txt").write_text("not ours")
    store = open_store()
    assert store.recovery_stats["orphans"] == 1
    assert not orphan.exists() and not tmp1.exists() and not tmp2.exists()
    assert (root / "notes.txt").exists()
    assert quarantined(root)[0].startswith(orphan.name)
    assert len(store.messages(sid)) == 3


def test_batched_mode_flushes_in_background(open_store, root) -> None:
    store = open_store(durability="batched", batch_ms=5)
    sid = store.create("u").session_id
    for i in range(50):
        store.append(sid, "user", f"m{i}")
    assert journal_path(root, sid).read_bytes().count(b"\n") == 50   # written before the ack
    writer = store.cache.get(sid).writer
    deadline = time.monotonic() + 10
    while writer.dirty and time.monotonic() < deadline:   # the flusher fsyncs within batch_ms
        time.sleep(0.005)
    assert not writer.dirty
    store.append(sid, "user", "last")
    store.flush()
    assert not writer.dirty
    store.close()
    store = open_store()
    assert [m.id for m in store.messages(sid)] == list(range(1, 52))


def test_hand_edited_message_becomes_a_placeholder(open_store, root, caplog) -> None:
    sid = three(open_store)
    p = snap_path(root, sid)
    doc = orjson.loads(p.read_bytes())
    del doc["messages"][1]["role"]
    doc["messages"][2]["tool_calls"] = "not a list of calls"
    p.write_bytes(orjson.dumps(doc))
    caplog.set_level(logging.WARNING, "storage")
    store = open_store()
    msgs = store.messages(sid)
    assert [(m.id, m.role) for m in msgs] == [(1, "user"), (2, "system"), (3, "system")]
    assert msgs[1].content == "[unreadable message]" and msgs[1].metadata == {"unreadable": True}
    assert "unreadable stored message 2" in caplog.text
    assert store.append(sid, "user", "still writable").id == 4
