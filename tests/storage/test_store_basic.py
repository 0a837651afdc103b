"""Session and message operations: create/get/list, append/update, clear/delete/restore/purge,
summaries, exports. Everything is checked again after reopening the store."""
from __future__ import annotations

import threading

import orjson
import pytest
from storage_testlib import journal_path, snap_path

from storage import (ChatMessage, InvalidArgument, MessageTooLarge, NotFound, StorageClosed, SummaryRecord,
                     ToolCall)


def test_create_get_and_list_pages(open_store) -> None:
    store = open_store()
    made = [store.create("alice", f"chat {i}") for i in range(7)]
    bob = store.create("bob", model="gpt-x")
    assert bob.title == "New chat" and bob.model == "gpt-x" and bob.message_count == 0
    store.append(made[2].session_id, "user", "bump")      # most recently updated now
    got = store.get(made[2].session_id)
    assert (got.user_id, got.title, got.message_count, got.preview) == ("alice", "chat 2", 1, "bump")
    seen, cursor = [], None
    while True:
        page, cursor = store.list("alice", before=cursor, limit=3)
        assert len(page) <= 3
        seen += [r.session_id for r in page]
        if cursor is None:
            break
    assert len(seen) == 7 and len(set(seen)) == 7 and seen[0] == made[2].session_id
    assert [r.session_id for r in store.list("bob")[0]] == [bob.session_id]
    assert store.list("nobody") == ([], None)
    for bad in ("garbage", "x|../../etc", 17):
        with pytest.raises(InvalidArgument, match="invalid session list cursor"):
            store.list("alice", before=bad)
    with pytest.raises(NotFound) as ei:
        store.get("s_20200101_0123456789ab")
    assert ei.value.code == "NOT_FOUND"


def test_append_roundtrip_and_ids(open_store) -> None:
    store = open_store()
    sid = store.create("u").session_id
    call = ToolCall("call_1", "sys_monitor", {"metric": "cpu"}, "cpu 12%", "success", 0.25, step=1)
    m1 = store.append(sid, "user", "how busy is the cpu?")
    m2 = store.append(sid, "assistant", "12 %", tool_calls=[call], metadata={"model": "m", "usage": {"t": 3}},
                      timestamp="2026-11-22T10:15:00+00:00")
    m3 = store.append(sid, "tool", "raw", tool_calls=[{"id": "c2", "tool_name": "x", "arguments": {}}])
    assert [m1.id, m2.id, m3.id] == [1, 2, 3]
    assert m2.tool_calls == [call] and m2.metadata["usage"] == {"t": 3}
    assert m2.timestamp == "2026-11-22T10:15:00+00:00"
    store.close()
    store = open_store()
    msgs = store.messages(sid)
    assert [m.to_dict() for m in msgs] == [m1.to_dict(), m2.to_dict(), m3.to_dict()]
    assert store.append(sid, "user", "next").id == 4
    assert [m.id for m in store.messages(sid, after_id=2)] == [3, 4]


def test_append_validation(open_store) -> None:
    store = open_store(max_message_bytes=2048)
    sid = store.create("u").session_id
    with pytest.raises(InvalidArgument, match="role: expected one of user, assistant, system, tool"):
        store.append(sid, "robot", "x")
    with pytest.raises(InvalidArgument, match="content: expected a string"):
        store.append(sid, "user", None)
    with pytest.raises(InvalidArgument, match="metadata: expected a dict"):
        store.append(sid, "user", "x", metadata=[1])
    with pytest.raises(InvalidArgument, match="not JSON-serializable"):
        store.append(sid, "user", "x", metadata={"o": object()})
    with pytest.raises(MessageTooLarge, match=r"over max_message_bytes \(2048\)") as ei:
        store.append(sid, "user", "x" * 3000)
    assert ei.value.code == "MESSAGE_TOO_LARGE"
    assert store.append(sid, "user", "fits").id == 1       # nothing was half-written
    with pytest.raises(InvalidArgument, match="title"):
        store.rename(sid, "   ")
    with pytest.raises(InvalidArgument, match="max_title_chars"):
        store.rename(sid, "t" * 201)
    with pytest.raises(InvalidArgument, match="user_id"):
        store.create("")


def test_update_finalizes_a_streamed_answer(open_store) -> None:
    store = open_store()
    sid = store.create("u").session_id
    store.append(sid, "user", "q")
    partial = store.append(sid, "assistant", "half an ans", metadata={"partial": True})
    store.append(sid, "user", "q2")
    final = ChatMessage(partial.id, "assistant", "the whole answer", partial.timestamp,
                        [ToolCall("c", "t", {"a": 1}, "r")], {"partial": False, "model": "m"})
    assert store.update(sid, final).to_dict() == final.to_dict()
    assert store.get(sid).preview == "q2"
    with pytest.raises(NotFound, match="message 99 not found"):
        store.update(sid, ChatMessage(99, "assistant", "x"))
    store.close()
    store = open_store()
    assert store.messages(sid)[1].to_dict() == final.to_dict()
    assert [m.id for m in store.messages(sid)] == [1, 2, 3]


def test_clear_hides_keeps_and_restores(open_store, root) -> None:
    store = open_store()
    sid = store.create("u").session_id
    for i in range(5):
        store.append(sid, "user", f"old {i}")
    assert store.clear(sid) == 5
    assert store.clear(sid) == 0
    page = store.page(sid)
    assert (page.messages, page.total, page.has_more, page.next_before) == ([], 0, False, None)
    assert store.get(sid).message_count == 0 and store.get(sid).preview == ""
    new = store.append(sid, "user", "fresh")
    assert new.id == 6                                     # ids continue after clear
    assert [m.id for m in store.messages(sid)] == [6]
    assert store.search("u", "old") == []
    store.close()
    snapshot = orjson.loads(snap_path(root, sid).read_bytes())
    assert snapshot["cleared_through_id"] == 5 and len(snapshot["messages"]) == 6   # still on disk
    store = open_store()
    assert [m.id for m in store.messages(sid)] == [6]
    store.restore(sid)
    assert [m.id for m in store.messages(sid)] == [1, 2, 3, 4, 5, 6]


def test_delete_restore_purge(open_store, root) -> None:
    store = open_store()
    keep = store.create("u", "keep").session_id
    sid = store.create("u", "doomed").session_id
    store.append(sid, "user", "needle in here")
    rec = store.delete(sid)
    assert rec.deleted and store.get(sid).deleted
    assert [r.session_id for r in store.list("u")[0]] == [keep]
    assert store.search("u", "needle") == []
    with pytest.raises(NotFound):
        store.search("u", "needle", session_id=sid)
    assert not store.restore(sid).deleted
    assert {r.session_id for r in store.list("u")[0]} == {keep, sid}
    store.delete(sid)
    store.close()
    store = open_store()
    assert store.get(sid).deleted and [r.session_id for r in store.list("u")[0]] == [keep]
    store.purge(sid)
    assert not snap_path(root, sid).exists() and not journal_path(root, sid).exists()
    with pytest.raises(NotFound):
        store.get(sid)
    with pytest.raises(NotFound):
        store.purge(sid)
    store.close()
    store = open_store()
    with pytest.raises(NotFound):
        store.get(sid)
    assert store.get(keep).title == "keep"


def test_rename_model_and_summaries(open_store) -> None:
    store = open_store()
    sid = store.create("u").session_id
    assert store.rename(sid, "  Disk check  ").title == "Disk check"
    assert store.set_model(sid, "gpt-4o").model == "gpt-4o"
    s1 = SummaryRecord("they talked about disks", 1, 10, model="m")
    s2 = SummaryRecord("disks, then memory", 1, 20, model="m")
    store.add_summary(sid, s1)
    rec = store.add_summary(sid, s2)
    assert rec.summaries == [s1, s2] and rec.summary == s2
    with pytest.raises(InvalidArgument):
        store.add_summary(sid, {"text": "x"})
    store.close()
    store = open_store()
    rec = store.get(sid)
    assert (rec.title, rec.model, rec.summaries) == ("Disk check", "gpt-4o", [s1, s2])
    assert store.list("u")[0][0].summaries == []          # listings come from the index


def test_rename_model_and_summaries_do_not_move_a_session_up_the_list(open_store) -> None:
    store = open_store()
    old = store.create("u", "old").session_id
    store.append(old, "user", "first question")
    new = store.create("u", "new").session_id
    stamp = store.get(old).updated_at
    store.rename(old, "renamed")
    store.set_model(old, "gpt-4o")
    store.add_summary(old, SummaryRecord("a summary", 1, 1))
    assert store.get(old).updated_at == stamp
    assert [r.session_id for r in store.list("u")[0]] == [new, old]
    store.append(old, "user", "second question")  # activity does
    assert [r.session_id for r in store.list("u")[0]] == [old, new]
    stamp = store.get(old).updated_at
    store.rename(old, "renamed again")
    store.close()
    store = open_store()                          # and so it stays when the journal is replayed
    assert store.get(old).updated_at == stamp and store.get(old).title == "renamed again"
    assert [r.session_id for r in store.list("u")[0]] == [old, new]


def test_returned_records_are_copies_and_summaries_immutable(open_store) -> None:
    store = open_store()
    sid = store.create("alice", "t").session_id
    store.add_summary(sid, SummaryRecord("first", 1, 2))
    got = store.get(sid)
    got.title = "changed"
    got.summaries.append(SummaryRecord("injected", 1, 3))
    got.summaries.clear()
    with pytest.raises(AttributeError):
        store.get(sid).summaries[0].text = "changed"  # type: ignore[misc]
    again = store.get(sid)
    assert again.title == "t" and [s.text for s in again.summaries] == ["first"]


def test_export_json_and_markdown(open_store) -> None:
    store = open_store()
    sid = store.create("u", "Ops <chat>").session_id
    store.append(sid, "user", "hidden")
    store.clear(sid)
    store.append(sid, "user", "what is the load?")
    store.append(sid, "assistant", "load is ```1.5```", metadata={"partial": True},
                 tool_calls=[ToolCall("c1", "sys_monitor", {"metric": "load"}, "out ``` with fence", "error", 0.5)])
    doc = orjson.loads(store.export(sid, "json"))
    assert doc["schema_version"] == 1 and doc["session"]["session_id"] == sid
    assert [m["id"] for m in doc["messages"]] == [2, 3]
    assert doc["messages"][1]["tool_calls"][0]["status"] == "error"
    md = store.export(sid, "markdown")
    assert md.startswith("# Ops <chat>\n")
    assert f"- Session: `{sid}`" in md and "- Messages: 2" in md
    assert "### User #2" in md and "### Assistant #3 (partial)" in md and "hidden" not in md
    assert "<details><summary>Tool call: sys_monitor (error, 0.500 s)</summary>" in md
    assert "````\nout ``` with fence\n````" in md           # the fence outgrows the content
    with pytest.raises(InvalidArgument, match="expected one of json, markdown"):
        store.export(sid, "pdf")


def test_closed_store_refuses_calls(open_store) -> None:
    store = open_store()
    sid = store.create("u").session_id
    store.close()
    store.close()
    with pytest.raises(StorageClosed):
        store.get(sid)
    with pytest.raises(StorageClosed):
        store.create("u")


def test_get_loaded_answers_only_without_waiting_or_io(open_store, root) -> None:
    store = open_store(lru_size=1)
    a = store.create("u", "a").session_id
    assert store.get_loaded(a).title == "a"                 # loaded: answered in place
    b = store.create("u", "b").session_id                   # evicts a (lru_size=1)
    assert store.get_loaded(a) is None                      # not loaded: the caller must use get()
    assert store.get(a).title == "a"
    sess = store.cache.get(a)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with sess.lock:
            held.set()
            release.wait(30)
    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(30)
    assert store.get_loaded(a) is None                      # busy: never blocks
    release.set()
    t.join(30)
    assert store.get_loaded(a).title == "a" and store.get_loaded(b) is None


def test_lru_is_bounded_by_the_bytes_of_loaded_sessions(open_store) -> None:
    store = open_store(lru_size=100, lru_mib=1)             # the count bound is far away
    big = store.create("u", "big").session_id
    for _ in range(3):
        store.append(big, "user", "x" * 200_000)            # ~600 kB of journal
    small = [store.create("u", f"s{i}").session_id for i in range(3)]
    assert store.cache.get(big) is not None                 # under 1 MiB so far
    store.append(small[0], "user", "y" * 500_000)           # over 1 MiB: the least recently used goes
    store.cache.trim()
    assert store.cache.get(big) is None
    assert all(store.cache.get(s) is not None for s in small)
    assert sum(s.nbytes() for s in store.cache.sessions()) <= 1 << 20
    assert store.get(big).message_count == 3                # reloaded on demand, nothing lost


def test_read_loaded_reads_in_place_only_when_small_loaded_and_idle(open_store) -> None:
    store = open_store(lru_size=1)
    a = store.create("u", "a").session_id
    for i in range(5):
        store.append(a, "user", f"m{i}")
    rec, msgs = store.read_loaded(a, 3, max_messages=10)
    assert rec.message_count == 5 and [m.content for m in msgs] == ["m3", "m4"]
    assert store.read_loaded(a, 0, max_messages=4) is None          # more than asked for: use a thread
    store.add_summary(a, SummaryRecord(text="s", covers_from_id=1, covers_to_id=4))
    _, msgs = store.read_loaded(a, None, max_messages=10)            # None: after the summary
    assert [m.id for m in msgs] == [5]
    store.create("u", "b")                                           # evicts a
    assert store.read_loaded(a, 0, max_messages=10) is None          # not loaded: no I/O here


def test_read_loaded_memo_reuses_conversions_of_unchanged_messages_only(open_store) -> None:
    store = open_store()
    a = store.create("u", "a").session_id
    for i in range(3):
        store.append(a, "user", f"m{i}")
    memo: dict = {}
    _, first = store.read_loaded(a, 0, 10, memo)
    store.update(a, ChatMessage(first[1].id, "user", "changed", first[1].timestamp))
    store.append(a, "user", "m3")
    _, again = store.read_loaded(a, 0, 10, memo)
    assert [m.content for m in again] == ["m0", "changed", "m2", "m3"]
    assert again[0] is first[0] and again[2] is first[2]           # unchanged: the same objects
    assert again[1] is not first[1] and first[1].content == "m1"   # updated: converted anew
    assert len(memo) == 4
    _, tail = store.read_loaded(a, 3, 10, memo)                    # the memo keeps the last read only
    assert tail == [again[3]] and tail[0] is again[3] and len(memo) == 1
    assert store.read_loaded(a, 0, 10)[1] == again and store.read_loaded(a, 0, 10)[1][0] is not again[0]


def test_record_copies_keep_every_field() -> None:
    """store._copy builds the copy field by field: a field added to SessionRecord must be copied too."""
    import dataclasses

    from storage.models import SessionRecord, SummaryRecord
    from storage.store import _copy
    values = {f.name: f"v_{f.name}" for f in dataclasses.fields(SessionRecord)}
    values.update(message_count=7, deleted=True, summaries=[SummaryRecord("s", 1, 2, "2026-01-01T00:00:00+00:00")])
    rec = SessionRecord(**values)
    copy = _copy(rec)
    assert copy == rec and copy is not rec and copy.summaries is not rec.summaries
