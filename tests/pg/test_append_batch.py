"""Group commit of appends on PostgreSQL (``storage/pg/appends.py``, migration 0010): appends that
arrive together go in one statement, and each caller still gets exactly its own outcome."""
from __future__ import annotations

import asyncio
from datetime import datetime, timezone

import pytest

from storage import StorageConfig
from storage.errors import InvalidArgument, NotFound
from storage.ids import new_session_id
from storage.pg.store import PgHistoryStore


@pytest.fixture
async def store(pg_url, tmp_path):
    s = await PgHistoryStore.open(StorageConfig(root=str(tmp_path), url=pg_url))
    try:
        yield s
    finally:
        await s.close()


async def _ids(store: PgHistoryStore, sid: str) -> list[tuple[int, str]]:
    return [(m.id, m.content) for m in await store.messages(sid)]


async def test_appends_that_arrive_together_share_one_statement(store):
    sessions = [(await store.create("alice")).session_id for _ in range(20)]
    before = store.appends.statements
    got = await asyncio.gather(*(store.append(sid, "user", f"hello {n}") for n, sid in enumerate(sessions)))
    assert store.appends.statements - before == 1          # 20 appends, 1 round trip, 1 commit
    assert [m.id for m in got] == [1] * 20
    for n, sid in enumerate(sessions):
        assert await _ids(store, sid) == [(1, f"hello {n}")]
        rec = await store.get(sid)
        assert rec.message_count == 1 and rec.preview == f"hello {n}"


async def test_appends_to_one_session_in_one_batch_keep_their_order(store):
    sid = (await store.create("alice")).session_id
    await store.append(sid, "user", "first")
    got = await asyncio.gather(*(store.append(sid, "user", f"m{n}") for n in range(6)))
    assert [m.id for m in got] == [2, 3, 4, 5, 6, 7]
    assert await _ids(store, sid) == [(1, "first")] + [(n + 2, f"m{n}") for n in range(6)]
    assert (await store.get(sid)).message_count == 7


async def test_a_refused_append_fails_alone(store):
    """PostgreSQL refuses one append of a batch (a NUL in the search text: the store never sends
    one, so the batcher is called directly): the batch wrote nothing, and it is sent again one
    append at a time, so only that append fails."""
    sessions = [(await store.create("alice")).session_id for _ in range(4)]
    before = store.appends.statements

    async def one(n: int, sid: str):
        text = "bad\x00text" if n == 2 else f"ok {n}"
        return await store.appends.append(sid, "2026-11-27T00:00:00+00:00", b"p", b'{"role":"user"}', text, None)
    got = await asyncio.gather(*(one(n, sid) for n, sid in enumerate(sessions)), return_exceptions=True)
    assert isinstance(got[2], InvalidArgument)
    assert [len(r) for i, r in enumerate(got) if i != 2] == [1, 1, 1]
    assert store.appends.statements - before == 1 + 4       # the batch, then each alone
    for n, sid in enumerate(sessions):
        assert (await store.get(sid)).message_count == (0 if n == 2 else 1)


async def test_an_unknown_session_fails_only_its_own_append(store):
    a = (await store.create("alice")).session_id
    b = new_session_id(datetime.now(timezone.utc))        # well formed, never created
    got = await asyncio.gather(store.append(a, "user", "kept"), store.append(b, "user", "lost"),
                               return_exceptions=True)
    assert got[0].content == "kept" and isinstance(got[1], NotFound)
    assert await _ids(store, a) == [(1, "kept")]


async def test_reads_after_in_one_batch_are_each_sessions_own(store):
    a = (await store.create("alice")).session_id
    b = (await store.create("bob")).session_id
    for n in range(3):
        await store.append(a, "user", f"a{n}")
        await store.append(b, "assistant", f"b{n}")
    await store.append(a, "assistant", "a-answer")
    before = store.appends.statements
    ma, mb, mb2 = await asyncio.gather(store.append(a, "user", "a-new", read_after=2),
                                       store.append(b, "user", "b-new", read_after=0),
                                       store.append(b, "assistant", "b-plain"))
    assert store.appends.statements - before == 1
    rec_a, msgs_a = await store.record_and_messages(a, 2)     # answered from what the batch read
    assert [(m.id, m.content) for m in msgs_a] == [(3, "a2"), (4, "a-answer"), (5, "a-new")]
    assert rec_a.user_id == "alice" and rec_a.message_count == 5 and ma.id == 5
    rec_b, msgs_b = await store.record_and_messages(b, 0)     # b-plain came after b-new: read again
    assert [m.content for m in msgs_b] == ["b0", "b1", "b2", "b-new", "b-plain"]
    assert rec_b.user_id == "bob" and (mb.id, mb2.id) == (4, 5)


async def test_a_queued_append_cancelled_before_it_is_sent_is_not_made(store):
    a = (await store.create("alice")).session_id
    b = (await store.create("alice")).session_id
    first = asyncio.ensure_future(store.append(a, "user", "sent"))
    second = asyncio.ensure_future(store.append(b, "user", "withdrawn"))
    third = asyncio.ensure_future(store.append(b, "user", "sent too"))
    await asyncio.sleep(0)           # all three queued, the first batch not yet sent
    second.cancel()
    assert (await first).content == "sent" and (await third).content == "sent too"
    with pytest.raises(asyncio.CancelledError):
        await second
    assert await _ids(store, b) == [(1, "sent too")]


async def test_batch_size_one_sends_each_append_alone(pg_url, tmp_path):
    s = await PgHistoryStore.open(StorageConfig(root=str(tmp_path), url=pg_url, pg_append_batch=1))
    try:
        sessions = [(await s.create("alice")).session_id for _ in range(5)]
        before = s.appends.statements
        await asyncio.gather(*(s.append(sid, "user", "x") for sid in sessions))
        assert s.appends.statements - before == 5
    finally:
        await s.close()


async def test_an_append_without_a_read_drops_an_earlier_appends_read(store):
    """What an append with ``read_after`` read stands for the session only until the next append:
    a plain append after it (one at a time, no batch) must not be hidden from the next read."""
    sid = (await store.create("alice")).session_id
    await store.append(sid, "user", "question", read_after=0)
    await store.append(sid, "assistant", "answer")
    _, msgs = await store.record_and_messages(sid, 0)
    assert [m.content for m in msgs] == ["question", "answer"]
