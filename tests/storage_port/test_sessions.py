"""Shared storage suite, sessions: create/get/list/rename/set_model/delete/restore/purge/clear, ids
and timestamps, list paging. Every test runs on the JSON and the PostgreSQL backend."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from storage import InvalidArgument, InvalidSessionId, NotFound, SummaryRecord, validate_session_id
from storage.port import StoragePort


async def test_both_backends_are_storage_ports(store):
    assert isinstance(store, StoragePort)


async def test_create_get_ids_and_timestamps(store):
    before = datetime.now(timezone.utc)
    rec = await store.create("alice", "First", model="m1")
    after = datetime.now(timezone.utc)
    validate_session_id(rec.session_id)
    assert rec.session_id[2:10] == rec.created_at[:10].replace("-", "")
    created = datetime.fromisoformat(rec.created_at)
    assert created.tzinfo is not None and before <= created <= after
    assert rec.updated_at == rec.created_at
    assert (rec.user_id, rec.title, rec.model, rec.message_count, rec.deleted, rec.preview) == \
        ("alice", "First", "m1", 0, False, "")
    assert await store.get(rec.session_id) == rec
    default = await store.create("alice")
    assert default.title == "New chat" and default.model is None
    assert default.session_id != rec.session_id


async def test_unknown_and_malformed_ids(store):
    with pytest.raises(NotFound):
        await store.get("s_20250101_000000000000")
    with pytest.raises(InvalidSessionId):
        await store.get("../etc/passwd")
    for call in (store.rename("s_20250101_000000000000", "x"), store.delete("s_20250101_000000000000"),
                 store.purge("s_20250101_000000000000"), store.clear("s_20250101_000000000000"),
                 store.append("s_20250101_000000000000", "user", "x"), store.page("s_20250101_000000000000"),
                 store.messages("s_20250101_000000000000")):
        with pytest.raises(NotFound):
            await call


async def test_bad_arguments(store):
    with pytest.raises(InvalidArgument):
        await store.create("")
    with pytest.raises(InvalidArgument):
        await store.create("alice", "   ")
    with pytest.raises(InvalidArgument):
        await store.create("alice", "x" * 201)
    with pytest.raises(InvalidArgument):
        await store.create("alice", model=3)
    with pytest.raises(InvalidArgument):
        await store.list("alice", limit=0)
    with pytest.raises(InvalidArgument):
        await store.list("alice", before="garbage")


async def test_rename_and_model_keep_updated_at(store):
    rec = await store.create("alice", "Old")
    renamed = await store.rename(rec.session_id, "  New name  ")
    assert renamed.title == "New name" and renamed.updated_at == rec.updated_at
    switched = await store.set_model(rec.session_id, "big")
    assert switched.model == "big" and switched.updated_at == rec.updated_at
    assert (await store.set_model(rec.session_id, None)).model is None
    got = await store.get(rec.session_id)
    assert (got.title, got.model) == ("New name", None)


async def test_list_pages_newest_first_per_user(store):
    ids = []
    for i in range(7):
        rec = await store.create("alice", f"s{i}")
        await store.append(rec.session_id, "user", f"hello {i}")
        ids.append(rec.session_id)
    await store.create("bob", "other")
    seen, cursor = [], None
    while True:
        page, cursor = await store.list("alice", before=cursor, limit=3)
        assert len(page) <= 3
        seen += page
        if cursor is None:
            break
    assert [r.session_id for r in seen] == ids[::-1]
    assert all(r.user_id == "alice" and r.summaries == [] for r in seen)
    assert [r.updated_at for r in seen] == sorted((r.updated_at for r in seen), reverse=True)
    # activity moves a session to the top
    await store.append(ids[0], "assistant", "back")
    top, _ = await store.list("alice", limit=1)
    assert top[0].session_id == ids[0] and top[0].message_count == 2 and top[0].preview == "back"


async def test_delete_restore_purge(store):
    rec = await store.create("alice", "doomed")
    await store.append(rec.session_id, "user", "needle one")
    gone = await store.delete(rec.session_id)
    assert gone.deleted
    assert await store.delete(rec.session_id) == gone          # idempotent
    assert (await store.list("alice"))[0] == []
    assert await store.search("alice", "needle") == []
    assert (await store.get(rec.session_id)).deleted
    back = await store.restore(rec.session_id)
    assert not back.deleted and back.message_count == 1
    assert [r.session_id for r in (await store.list("alice"))[0]] == [rec.session_id]
    await store.purge(rec.session_id)
    with pytest.raises(NotFound):
        await store.get(rec.session_id)
    with pytest.raises(NotFound):
        await store.restore(rec.session_id)
    assert (await store.list("alice"))[0] == []


async def test_clear_hides_until_restore(store):
    rec = await store.create("alice")
    for i in range(5):
        await store.append(rec.session_id, "user", f"m{i}")
    assert await store.clear(rec.session_id) == 5
    assert await store.clear(rec.session_id) == 0
    got = await store.get(rec.session_id)
    assert (got.message_count, got.preview) == (0, "")
    assert (await store.page(rec.session_id)).messages == []
    assert await store.messages(rec.session_id) == []
    assert await store.search("alice", "m1") == []
    new = await store.append(rec.session_id, "user", "after clear")
    assert new.id == 6                                           # ids are never reused
    assert [m.content for m in await store.messages(rec.session_id)] == ["after clear"]
    back = await store.restore(rec.session_id)
    assert back.message_count == 6 and back.preview == "after clear"
    assert [m.id for m in await store.messages(rec.session_id)] == [1, 2, 3, 4, 5, 6]


async def test_summaries(store):
    rec = await store.create("alice")
    for i in range(4):
        await store.append(rec.session_id, "user", f"m{i}")
    s1 = SummaryRecord("first two", 1, 2, model="sum")
    s2 = SummaryRecord("all four", 1, 4)
    out = await store.add_summary(rec.session_id, s1)
    assert out.summaries == [s1] and out.updated_at == (await store.get(rec.session_id)).updated_at
    out = await store.add_summary(rec.session_id, s2)
    assert out.summaries == [s1, s2] and out.summary == s2
    assert (await store.get(rec.session_id)).summaries == [s1, s2]
    with pytest.raises(InvalidArgument):
        await store.add_summary(rec.session_id, {"text": "x"})
    # a withdrawal (an edit superseded covered messages): no summary, every visible message uncovered
    out = await store.add_summary(rec.session_id, SummaryRecord.withdrawal())
    assert out.summary is None and (await store.get(rec.session_id)).summary is None
    assert len((await store.get(rec.session_id)).summaries) == 3


async def test_data_survives_reopen(make_config):
    from storage.port import open_store
    st = await open_store(make_config())
    rec = await st.create("alice", "kept")
    await st.append(rec.session_id, "user", "persisted")
    await st.close()
    st = await open_store(make_config())
    try:
        assert (await st.get(rec.session_id)).title == "kept"
        assert [m.content for m in await st.messages(rec.session_id)] == ["persisted"]
    finally:
        await st.close()



async def test_trash_lists_deleted_sessions_and_undelete_keeps_clears(store):
    a = await store.create("alice", "A")
    b = await store.create("alice", "B")
    await store.create("bob", "other user")
    await store.append(a.session_id, "user", "hidden by the clear")
    await store.clear(a.session_id)
    await store.append(a.session_id, "user", "after the clear")
    await store.delete(a.session_id)
    live, _ = await store.list("alice")
    trash, cursor = await store.list("alice", deleted=True)
    assert [r.session_id for r in live] == [b.session_id]
    assert [r.session_id for r in trash] == [a.session_id] and cursor is None and trash[0].deleted
    assert (await store.list("bob", deleted=True))[0] == []
    back = await store.undelete(a.session_id)
    assert not back.deleted and back.message_count == 1
    assert [m.content for m in await store.messages(a.session_id)] == ["after the clear"]
    assert (await store.list("alice", deleted=True))[0] == []
    assert (await store.undelete(a.session_id)).deleted is False      # a live session: unchanged
    with pytest.raises(NotFound):
        await store.undelete("s_20250101_000000000000")


async def test_clear_drops_summaries_and_purge_removes_hidden_messages(store):
    sid = (await store.create("alice")).session_id
    for text in ("one", "two"):
        await store.append(sid, "user", text)
    await store.add_summary(sid, SummaryRecord("about one and two", 1, 2))
    assert await store.clear(sid) == 2
    rec = await store.get(sid)
    assert rec.summaries == [] and rec.message_count == 0
    await store.append(sid, "user", "three")
    assert await store.clear(sid, purge=True) == 1
    await store.restore(sid)                       # nothing hidden is left to bring back
    assert await store.messages(sid) == [] and (await store.get(sid)).message_count == 0
    assert "one" not in await store.export(sid, "json")
    await store.append(sid, "user", "four")
    assert [m.id for m in await store.messages(sid)] == [4]        # ids are never reused


async def test_system_prompt_is_stored_with_the_session(make_config):
    from storage.port import open_store
    st = await open_store(make_config())
    try:
        sid = (await st.create("alice")).session_id
        assert (await st.get(sid)).system_prompt is None
        before = (await st.get(sid)).updated_at
        rec = await st.set_system_prompt(sid, "Be brief.\x00")
        assert rec.system_prompt == "Be brief.\x00" and rec.updated_at == before
        with pytest.raises(InvalidArgument):
            await st.set_system_prompt(sid, "x" * 20_001)
        with pytest.raises(InvalidArgument):
            await st.set_system_prompt(sid, 5)
        other = (await st.create("alice")).session_id
        await st.set_system_prompt(other, "temporary")
        await st.set_system_prompt(other, None)
    finally:
        await st.close()
    st = await open_store(make_config())
    try:
        assert (await st.get(sid)).system_prompt == "Be brief.\x00"
        assert (await st.get(other)).system_prompt is None
    finally:
        await st.close()


async def test_a_clear_resets_an_automatic_title_and_keeps_a_title_the_user_set(make_config):
    from storage.port import open_store
    from storage.models import DEFAULT_TITLE
    st = await open_store(make_config())
    try:
        auto = (await st.create("alice")).session_id
        await st.append(auto, "user", "The vault host is vault-7.")
        rec = await st.rename(auto, "The vault host is vault-7.", auto=True)
        assert rec.title_auto and rec.title == "The vault host is vault-7."
        assert (await st.get(auto)).title_auto
        own = (await st.create("alice")).session_id
        await st.rename(own, "first auto", auto=True)
        assert not (await st.rename(own, "ops notes")).title_auto            # the user's own title
        await st.append(own, "user", "hello")
        assert await st.clear(auto) == 1
        assert await st.clear(own, purge=True) == 1
    finally:
        await st.close()
    st = await open_store(make_config())                                 # what was stored, not a cache
    try:
        cleared = await st.get(auto)
        assert (cleared.title, cleared.title_auto) == (DEFAULT_TITLE, False)
        assert ((await st.get(own)).title, (await st.get(own)).title_auto) == ("ops notes", False)
        listed = {r.session_id: r.title for r in (await st.list("alice"))[0]}
        assert listed == {auto: DEFAULT_TITLE, own: "ops notes"}
        assert "vault-7" not in await st.export(auto, "json") and "vault-7" not in await st.export(auto, "markdown")
        await st.append(auto, "user", "next first message")                # named again by the next one
        assert (await st.rename(auto, "next first message", auto=True)).title_auto
    finally:
        await st.close()


async def test_records_of_several_sessions_in_one_read(store):
    a = await store.create("alice", "Prod DB")
    b = await store.create("bob")
    await store.rename(b.session_id, "Deploy the first build", auto=True)
    c = await store.create("alice", "Old")
    await store.delete(c.session_id)
    await store.append(a.session_id, "user", "hello")
    got = await store.records([a.session_id, b.session_id, c.session_id, "s_20250101_000000000000",
                               "../etc/passwd", a.session_id])
    assert set(got) == {a.session_id, b.session_id, c.session_id}       # unknown and malformed ids: absent
    assert (got[a.session_id].title, got[a.session_id].user_id, got[a.session_id].message_count) == \
        ("Prod DB", "alice", 1)                                          # current, after the append
    assert (got[b.session_id].title, got[b.session_id].title_auto) == ("Deploy the first build", True)
    assert got[c.session_id].deleted and not got[a.session_id].deleted
    assert got[a.session_id].summaries == [] and got[a.session_id].system_prompt is None   # as list's
    assert await store.records([]) == {}
