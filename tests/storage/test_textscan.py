"""SessionText.scan gives exactly what Query.match gives message by message, and the store's cached
folded text follows every change of the session."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from storage import ChatMessage
from storage.search import compile_query
from storage.textscan import SEP, SessionText, session_text

ALPHABET = "abcß ẞİı\u0130 日本語の運用\x00-_1"
contents = st.one_of(st.text(alphabet=ALPHABET, max_size=40), st.none(), st.integers(0, 9), st.just(""))
queries = st.text(alphabet=ALPHABET.replace(SEP, ""), min_size=1, max_size=8).filter(lambda q: q.strip())


def reference(msgs: list[dict], vis: int, query: str) -> list[tuple[int, float, int]]:
    q = compile_query(query)
    out = []
    for i in range(vis, len(msgs)):
        hit = q.match(msgs[i].get("content"))
        if hit is not None:
            out.append((i, hit[0], hit[1]))
    return out


@given(texts=st.lists(contents, max_size=12), vis=st.integers(0, 12), query=queries)
def test_property_scan_equals_match_message_by_message(texts: list, vis: int, query: str) -> None:
    msgs = [{"id": i + 1, "content": c} for i, c in enumerate(texts)]
    vis = min(vis, len(msgs))
    got = SessionText(1, vis, msgs).scan(compile_query(query))
    assert got == reference(msgs, vis, query)


def test_repeated_and_overlapping_occurrences_count_like_str_count() -> None:
    msgs = [{"id": 1, "content": "aaaa aa"}, {"id": 2, "content": "xaax"}, {"id": 3, "content": "AA aa Aa aA aa aa"}]
    for query in ("aa", "a", "aa aa", "x"):
        assert SessionText(0, 0, msgs).scan(compile_query(query)) == reference(msgs, 0, query)


def test_the_cache_is_reused_until_the_session_changes() -> None:
    msgs = [{"id": 1, "content": "disk full"}]
    first = session_text(None, 3, 0, msgs)
    assert session_text(first, 3, 0, msgs) is first
    assert session_text(first, 4, 0, msgs) is not first and session_text(first, 3, 1, msgs) is not first


def test_store_search_sees_every_change(open_store) -> None:
    store = open_store()
    sid = store.create("alice", "ops").session_id
    store.append(sid, "user", "nginx is down")
    assert [h.message_id for h in store.search("alice", "nginx")] == [1]      # builds the cache
    store.append(sid, "assistant", "restart nginx")
    assert sorted(h.message_id for h in store.search("alice", "nginx")) == [1, 2]
    store.update(sid, ChatMessage(2, "assistant", "restart the proxy", "2026-11-22T10:00:00+00:00"))
    assert [h.message_id for h in store.search("alice", "nginx")] == [1]
    assert [h.message_id for h in store.search("alice", "proxy")] == [2]
    store.clear(sid)
    assert store.search("alice", "nginx") == []
    store.restore(sid)
    assert [h.message_id for h in store.search("alice", "nginx")] == [1]
    hits = store.search("alice", "nginx\x00down")                               # NUL: message by message
    assert [h.message_id for h in hits] == [1] and hits[0].score == 1.0        # both tokens, not the whole
