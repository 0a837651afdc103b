"""Shared storage suite, messages: append/update, paging, tool calls and metadata, size limit,
search, export, concurrent appends. Every test runs on the JSON and the PostgreSQL backend."""
from __future__ import annotations

from dataclasses import replace

import asyncio

import orjson
import pytest

from storage import ChatMessage, InvalidArgument, MessageTooLarge, NotFound, ToolCall


async def test_append_round_trip(store):
    rec = await store.create("alice")
    call = ToolCall("c1", "grep", {"pattern": "x", "n": [1, 2]}, "found", "success", 0.25, step=1)
    m = await store.append(rec.session_id, "assistant", "héllo 世界 \x00 nul", tool_calls=[call],
                           metadata={"partial": False, "k": {"n": 1}}, timestamp="2025-01-02T03:04:05+00:00")
    assert m.id == 1 and m.timestamp == "2025-01-02T03:04:05+00:00"
    assert m.tool_calls == [call] and m.metadata == {"partial": False, "k": {"n": 1}}
    stored = (await store.messages(rec.session_id))[0]
    assert stored == m
    got = await store.get(rec.session_id)
    assert got.message_count == 1 and got.preview == "héllo 世界 \x00 nul"[:80]
    assert got.updated_at >= rec.updated_at
    d = await store.append(rec.session_id, "user", "dict call", tool_calls=[call.to_dict()])
    assert d.id == 2 and d.tool_calls == [call]


async def test_append_rejects_bad_messages(store):
    rec = await store.create("alice")
    with pytest.raises(InvalidArgument):
        await store.append(rec.session_id, "robot", "x")
    with pytest.raises(InvalidArgument):
        await store.append(rec.session_id, "user", 5)
    with pytest.raises(InvalidArgument):
        await store.append(rec.session_id, "user", "x", metadata=[1])
    with pytest.raises(InvalidArgument):
        await store.append(rec.session_id, "user", "x", tool_calls=[object()])
    with pytest.raises(MessageTooLarge):
        await store.append(rec.session_id, "user", "x" * (1 << 20))
    assert (await store.get(rec.session_id)).message_count == 0     # nothing half-written
    assert (await store.append(rec.session_id, "user", "ok")).id == 1


async def test_update_replaces_and_refreshes_preview(store):
    rec = await store.create("alice")
    first = await store.append(rec.session_id, "user", "question")
    draft = await store.append(rec.session_id, "assistant", "partial ans", metadata={"partial": True})
    final = ChatMessage(draft.id, "assistant", "final answer", draft.timestamp, [], {})
    assert await store.update(rec.session_id, final) == final
    assert [m.content for m in await store.messages(rec.session_id)] == ["question", "final answer"]
    assert (await store.get(rec.session_id)).preview == "final answer"
    await store.update(rec.session_id, ChatMessage(first.id, "user", "edited question", first.timestamp))
    assert (await store.get(rec.session_id)).preview == "final answer"
    with pytest.raises(NotFound):
        await store.update(rec.session_id, ChatMessage(99, "user", "x"))
    with pytest.raises(InvalidArgument):
        await store.update(rec.session_id, {"id": 1})


async def test_paging_newest_first(store):
    rec = await store.create("alice")
    for i in range(1, 26):
        await store.append(rec.session_id, "user", f"m{i}")
    page = await store.page(rec.session_id, limit=10)
    assert [m.id for m in page.messages] == list(range(16, 26))
    assert (page.has_more, page.next_before, page.total) == (True, 16, 25)
    ids = [m.id for m in page.messages]
    while page.has_more:
        page = await store.page(rec.session_id, before=page.next_before, limit=10)
        ids = [m.id for m in page.messages] + ids
    assert ids == list(range(1, 26)) and page.next_before is None and page.total == 25
    assert [m.id for m in await store.messages(rec.session_id, after_id=22)] == [23, 24, 25]
    assert await store.messages(rec.session_id, after_id=10 ** 30) == []
    empty = await store.page(rec.session_id, before=1)
    assert empty.messages == [] and not empty.has_more
    for bad in (dict(before=0), dict(before=True), dict(limit=0)):
        with pytest.raises(InvalidArgument):
            await store.page(rec.session_id, **bad)
    with pytest.raises(InvalidArgument):
        await store.messages(rec.session_id, after_id="3")


async def test_search_scoring_isolation_and_scope(store):
    a = await store.create("alice", "Alpha")
    b = await store.create("alice", "Beta")
    other = await store.create("bob", "Bob's")
    await store.append(a.session_id, "user", "The Quick brown fox")
    await store.append(a.session_id, "assistant", "QUICK brown and quick  brown, quick brown fox")
    await store.append(b.session_id, "user", "a brown dog, not so quick_ly")
    await store.append(b.session_id, "user", "数据库迁移 完成了")
    await store.append(b.session_id, "user", "100% sure")
    await store.append(other.session_id, "user", "quick brown fox of bob")
    hits = await store.search("alice", "quick brown")
    assert [(h.session_id, h.message_id) for h in hits[:2]] == [(a.session_id, 2), (a.session_id, 1)]
    assert hits[0].score > hits[1].score >= 1.5 and hits[0].title == "Alpha"
    assert all(h.session_id != other.session_id for h in hits)
    partial = [h for h in hits if h.session_id == b.session_id]
    assert len(partial) == 1 and partial[0].score == 1.0               # both tokens, not the phrase
    assert [h.message_id for h in await store.search("alice", "迁移")] == [2]
    assert [h.message_id for h in await store.search("alice", "100%")] == [3]
    assert await store.search("alice", "_ly") != []
    scoped = await store.search("alice", "brown", session_id=b.session_id)
    assert [h.session_id for h in scoped] == [b.session_id]
    assert len(await store.search("alice", "brown", limit=1)) == 1
    with pytest.raises(NotFound):
        await store.search("alice", "fox", session_id=other.session_id)
    with pytest.raises(InvalidArgument):
        await store.search("alice", "   ")


async def test_search_folds_case_beyond_ascii(store):
    rec = await store.create("alice")
    await store.append(rec.session_id, "user", "ÉCOLE Straße")
    assert [h.message_id for h in await store.search("alice", "école")] == [1]
    hit = (await store.search("alice", "straße"))[0]
    assert hit.snippet == "ÉCOLE Straße"


async def test_search_skips_canned_replies(store):
    """The offline agent's fixed texts (help, "not understood") are marked canned: never a hit."""
    rec = await store.create("alice")
    await store.append(rec.session_id, "user", "help")
    await store.append(rec.session_id, "assistant", "I can show disk usage, CPU usage, ...",
                       metadata={"canned": True})
    await store.append(rec.session_id, "assistant", "your disk usage is 40%")
    for query in ("disk usage", "disk usage\x00"):        # the folded-text scan and message by message
        assert [h.message_id for h in await store.search("alice", query)] == [3]
    assert [h.message_id for h in await store.search("alice", "CPU", session_id=rec.session_id)] == []
    assert [h.message_id for h in await store.search("alice", "usage")] == [3]


async def test_search_skips_listings_of_earlier_messages(store):
    """The offline agent's answer to "what did I say about X" lists earlier messages: a copy of what
    search finds anyway, so it is no hit (asked six times, the listings crowded out the statement)."""
    rec = await store.create("alice")
    await store.append(rec.session_id, "user", "the staging server is stage-7")
    await store.append(rec.session_id, "user", "what did I say about the staging server?")
    await store.append(rec.session_id, "assistant", "Found 1 earlier message: the staging server is stage-7",
                       metadata={"history_listing": True})
    for query in ("staging server", "staging server\x00"):   # the folded-text scan and message by message
        assert [h.message_id for h in await store.search("alice", query)] == [2, 1]


async def test_search_skips_superseded_messages(store):
    """A message a regenerate or an edit superseded is no hit, once the update marks it (the
    folded-text scan sees the change too)."""
    rec = await store.create("alice")
    old = await store.append(rec.session_id, "user", "deploy with token abc123")
    await store.append(rec.session_id, "user", "deploy build 42")
    for query in ("deploy", "deploy zzz\x00"):       # the folded-text scan and message by message
        assert [h.message_id for h in await store.search("alice", query)] == [2, 1]
    await store.update(rec.session_id, replace(old, metadata={"superseded": True}))
    for query in ("deploy", "deploy zzz\x00"):
        assert [h.message_id for h in await store.search("alice", query)] == [2]
    assert await store.search("alice", "abc123") == []


async def test_export_json_and_markdown(store):
    rec = await store.create("alice", "Export me")
    await store.append(rec.session_id, "user", "hidden later")
    await store.clear(rec.session_id)
    await store.append(rec.session_id, "user", "question")
    await store.append(rec.session_id, "assistant", "answer",
                       tool_calls=[ToolCall("c1", "ls", {"path": "/"}, "etc")])
    doc = orjson.loads(await store.export(rec.session_id, "json"))
    assert doc["session"]["title"] == "Export me"
    assert [m["content"] for m in doc["messages"]] == ["question", "answer"]
    md = await store.export(rec.session_id, "markdown")
    assert md.startswith("# Export me\n") and "### Assistant #3" in md and "hidden later" not in md
    with pytest.raises(InvalidArgument):
        await store.export(rec.session_id, "pdf")


async def test_concurrent_appends_get_unique_ascending_ids(store):
    recs = [await store.create("alice") for _ in range(3)]
    n = 40

    async def writer(sid: str, k: int):
        return await store.append(sid, "user", f"msg {k}")
    results = await asyncio.gather(*(writer(r.session_id, k) for r in recs for k in range(n)))
    for r in recs:
        ids = sorted(m.id for m, (rr, _) in zip(results, ((r2, k) for r2 in recs for k in range(n)))
                     if rr is r)
        assert ids == list(range(1, n + 1))
        stored = await store.messages(r.session_id)
        assert [m.id for m in stored] == list(range(1, n + 1))
        assert sorted(m.content for m in stored) == sorted(f"msg {k}" for k in range(n))
        assert (await store.get(r.session_id)).message_count == n
