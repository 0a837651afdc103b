"""Paging cursors and search (English and Chinese), including bounded memory during search."""
from __future__ import annotations

import pytest

from storage import InvalidArgument, NotFound


def walk(store, sid: str, limit: int) -> list[list[int]]:
    pages, before = [], None
    while True:
        page = store.page(sid, before=before, limit=limit)
        ids = [m.id for m in page.messages]
        assert ids == sorted(ids)
        assert page.next_before == (ids[0] if page.has_more else None)
        pages.append(ids)
        if not page.has_more:
            return pages
        before = page.next_before


@pytest.mark.parametrize("limit", [1, 7, 50, 500])
def test_page_cursors_walk_history_exactly_once(open_store, limit: int) -> None:
    store = open_store()
    sid = store.create("u").session_id
    for i in range(237):
        store.append(sid, "user" if i % 2 == 0 else "assistant", f"m{i}")
    pages = walk(store, sid, limit)
    flat = [i for p in reversed(pages) for i in p]
    assert flat == list(range(1, 238))
    assert all(len(p) == limit for p in pages[:-1])
    assert store.page(sid, limit=limit).total == 237


def test_paging_after_clear_and_reload(open_store) -> None:
    store = open_store(compact_threshold=40)
    sid = store.create("u").session_id
    for i in range(30):
        store.append(sid, "user", f"a{i}")
    store.clear(sid)
    for i in range(45):
        store.append(sid, "user", f"b{i}")
    expected = list(range(31, 76))
    assert [i for p in reversed(walk(store, sid, 10)) for i in p] == expected
    store.close()
    store = open_store()
    assert [i for p in reversed(walk(store, sid, 10)) for i in p] == expected
    page = store.page(sid, before=31, limit=10)           # nothing visible below the clear
    assert (page.messages, page.has_more, page.total) == ([], False, 45)
    assert [m.id for m in store.page(sid, before=36, limit=3).messages] == [33, 34, 35]
    assert [m.id for m in store.page(sid, before=10_000, limit=2).messages] == [74, 75]
    for bad in (0, -1, "5", True):
        with pytest.raises(InvalidArgument, match="before"):
            store.page(sid, before=bad)
    with pytest.raises(InvalidArgument, match="limit"):
        store.page(sid, limit=0)


def test_search_english_scoring_and_order(open_store) -> None:
    store = open_store()
    a = store.create("u", "alpha").session_id
    b = store.create("u", "beta").session_id
    other = store.create("someone-else").session_id
    store.append(a, "user", "Disk usage is HIGH on /var")                     # 1 phrase
    store.append(a, "assistant", "the disk is fine, usage normal")           # 2 both tokens
    store.append(a, "user", "only the disk here")                            # 3 one token
    store.append(b, "user", "disk usage again; disk usage twice")            # 1 phrase x2
    store.append(b, "user", "Disk Usage, newest phrase")                     # 2 phrase, newest
    store.append(other, "user", "disk usage of another user")
    hits = store.search("u", "disk usage")
    assert [(h.session_id, h.message_id) for h in hits] == [(b, 1), (b, 2), (a, 1), (a, 2), (a, 3)]
    assert [h.score for h in hits] == [1.6, 1.5, 1.5, 1.0, 0.5]
    assert hits[0].title == "beta" and hits[0].role == "user" and "disk usage" in hits[0].snippet
    assert [h.message_id for h in store.search("u", "disk usage", limit=2)] == [1, 2]
    assert [(h.session_id, h.message_id) for h in store.search("u", "DISK USAGE", session_id=a)] == \
        [(a, 1), (a, 2), (a, 3)]
    assert store.search("u", "nothing like this") == []
    with pytest.raises(NotFound):
        store.search("u", "disk", session_id=other)
    for bad in ("", "   ", None):
        with pytest.raises(InvalidArgument, match="search query"):
            store.search("u", bad)


def test_search_chinese_and_snippets(open_store) -> None:
    store = open_store()
    sid = store.create("u", "中文").session_id
    store.append(sid, "user", "服务器的内存使用率是多少？")
    store.append(sid, "assistant", "当前内存使用率为 40%，磁盘使用率为 71%。" + "很长的内容" * 60)
    store.append(sid, "user", "Ｗide ＬＥＴＴＥＲＳ and ümlaut ÜBER")
    hits = store.search("u", "内存使用率")
    assert [h.message_id for h in hits] == [2, 1]
    assert all("内存使用率" in h.snippet for h in hits)
    assert hits[0].snippet.endswith("…") and len(hits[0].snippet) <= 162
    assert [h.message_id for h in store.search("u", "磁盘")] == [2]
    assert [h.message_id for h in store.search("u", "使用率 磁盘")] == [2, 1]    # tokens: 2 of 2, 1 of 2
    assert [h.message_id for h in store.search("u", "über")] == [3]
    assert [h.message_id for h in store.search("u", "ｗide")] == [3]


def test_search_memory_stays_bounded(open_store) -> None:
    store = open_store(lru_size=2)
    sids = [store.create("u", f"s{i}").session_id for i in range(6)]
    for i, sid in enumerate(sids):
        for j in range(20):
            store.append(sid, "user", f"session {i} line {j}" + (" needle" if j == 5 else ""))
    assert store.loaded_count() <= 2
    store.close()
    store = open_store(lru_size=2)
    assert store.loaded_count() == 0
    hits = store.search("u", "needle", limit=100)
    assert sorted(h.session_id for h in hits) == sorted(sids)
    assert store.loaded_count() == 0                      # streamed, not kept
    store.page(sids[0])
    store.search("u", "needle")
    assert store.loaded_count() == 1                      # an already loaded session stays loaded


def test_encoded_pages_are_the_pages_as_sent_and_follow_changes(open_store) -> None:
    """page_encoded gives each message's JSON exactly as ``page`` + encoding would, from a cache
    that follows updates, clears, purges and restores; the inline variant agrees."""
    import orjson

    from storage import ChatMessage
    from storage.models import encode_page
    store = open_store()
    sid = store.create("u").session_id
    for i in range(30):
        store.append(sid, "user" if i % 2 == 0 else "assistant", f"m{i} 内存", metadata={"i": i})

    def same(before=None, limit=7) -> None:
        want = encode_page(store.page(sid, before=before, limit=limit))
        assert store.page_encoded(sid, before, limit) == want
        assert store.page_encoded_loaded(sid, before, limit) == want
        sess = store.cache.get(sid)                      # the cache weighs what it holds
        assert sess.state.wire_bytes == sum(len(b) for b in sess.state.wire if b is not None) > 0
        assert sess.nbytes() == sess.snap_stat[1] + sess.jdisk + sess.state.wire_bytes

    for before, limit in [(None, 7), (10, 5), (2, 50), (None, 100)]:
        same(before, limit)
    raw = store.page_encoded(sid, None, 1).messages[0]
    assert orjson.loads(raw) == store.page(sid, limit=1).messages[0].to_dict()
    old = store.page(sid, before=6, limit=1).messages[0]
    store.update(sid, ChatMessage(old.id, old.role, "changed", old.timestamp, metadata={"superseded": True}))
    enc = store.page_encoded(sid, before=6, limit=1)
    assert orjson.loads(enc.messages[0])["content"] == "changed" and enc.superseded == [True]
    same(None, 30)
    store.clear(sid)
    assert store.page_encoded(sid).messages == [] and store.page_encoded(sid).total == 0
    store.restore(sid)
    same(None, 30)
    store.append(sid, "user", "after")
    store.clear(sid, purge=True)
    assert store.page_encoded(sid) == encode_page(store.page(sid))
    store.append(sid, "user", "new")
    same(None, 10)
