"""Recall of older turns through the real store: facts from 100 turns back (English and Chinese),
rebuild on load, exclusions, excerpt format, cross-session search, and optional embeddings."""
from __future__ import annotations

import random
import re

import pytest

from memory_testlib import (CHATTER_EN, CHATTER_ZH, EmbeddingServer, OfflineStub, changes_on_another_node, chatter,
                            store_turn)
from server.memory import MemoryConfig, MemoryManager
from server.memory.recall import RecallIndex, TurnDoc, format_excerpt, turn_docs
from server.memory.tokens import ApproxTokenCounter
from storage.errors import StorageIOError
from storage.models import ChatMessage

USER = "ops"
EXCERPT_RE = re.compile(r"^\[Recalled from \d{4}-\d\d-\d\d \d\d:\d\d UTC\] User: .+ / Assistant: .+$")


def recall_block(ctx) -> str:
    blocks = [m["content"] for m in ctx.messages if m["role"] == "system" and m["content"].startswith("Excerpts recalled")]
    return blocks[0] if blocks else ""


async def long_session(store, mm, fact: str, templates: list[str], seed: int) -> str:
    rng = random.Random(seed)
    sid = (await store.create(USER)).session_id
    await store_turn(store, mm, sid, USER, fact, "Noted.")
    for _ in range(100):
        await store_turn(store, mm, sid, USER, chatter(rng, templates), chatter(rng, templates))
    return sid


async def test_recall_finds_an_english_fact_100_turns_back(store):
    mm = MemoryManager(MemoryConfig(), store, OfflineStub(), None, "SYS")
    fact = "Note for later: my database password rotation day is Thursday."
    sid = await long_session(store, mm, fact, CHATTER_EN, 1)
    ctx, _ = await store_turn(store, mm, sid, USER, "which day do we rotate the database password?", "Thursday")
    block = recall_block(ctx)
    assert fact in block
    assert ctx.metadata["recalled"][0] == 1                     # the fact's turn ranks first
    assert all(EXCERPT_RE.match(line) for line in block.splitlines()[1:])
    recent = {m["content"] for m in ctx.messages[-11:]}
    assert fact not in recent                                   # it came from recall, not the window
    await mm.aclose()


async def test_recall_finds_a_chinese_fact_100_turns_back(store):
    mm = MemoryManager(MemoryConfig.from_dict({"summarization": {"enabled": False}}), store, None, None, "SYS")
    fact = "记一下：我们的备份服务器在杭州机房。"
    sid = await long_session(store, mm, fact, CHATTER_ZH, 2)
    ctx, _ = await store_turn(store, mm, sid, USER, "备份服务器在哪里？", "杭州机房")
    assert fact in recall_block(ctx) and ctx.metadata["recalled"][0] == 1
    # a fresh manager rebuilds the index from storage and finds it too
    fresh = MemoryManager(MemoryConfig.from_dict({"summarization": {"enabled": False}}), store, None, None, "SYS")
    ctx = await fresh.build_context(sid, USER, await store.append(sid, "user", "备份服务器在哪个机房？"), "m")
    assert fact in recall_block(ctx)
    hits = await fresh.search(USER, "杭州 备份")
    assert hits[0]["message_id"] == 1 and hits[0]["session_id"] == sid and "杭州机房" in hits[0]["snippet"]
    await mm.aclose()
    await fresh.aclose()


async def test_turns_in_the_recent_window_are_not_recalled(store):
    mm = MemoryManager(MemoryConfig.from_dict({"summarization": {"enabled": False}}), store, None, None, "SYS")
    sid = (await store.create(USER)).session_id
    await store_turn(store, mm, sid, USER, "the staging host is stg-42", "ok")
    await store_turn(store, mm, sid, USER, "check disk", "fine")
    ctx, _ = await store_turn(store, mm, sid, USER, "which staging host?", "stg-42")
    assert ctx.metadata["recalled"] == [] and recall_block(ctx) == ""
    assert "the staging host is stg-42" in [m["content"] for m in ctx.messages]
    await mm.aclose()


async def test_recall_is_scoped_to_the_session_and_search_to_the_user(store):
    mm = MemoryManager(MemoryConfig.from_dict({"summarization": {"enabled": False},
                                               "context": {"recent_turns": 1}}), store, None, None, "SYS")
    a = (await store.create(USER, "alpha")).session_id
    b = (await store.create(USER, "beta")).session_id
    other = (await store.create("mallory")).session_id
    await store_turn(store, mm, a, USER, "the kafka cluster lives in rack 9", "ok")
    await store_turn(store, mm, a, USER, "filler", "ok")
    await store_turn(store, mm, b, USER, "redis runs on port 6380 here", "ok")
    await store_turn(store, mm, other, "mallory", "the kafka cluster password is hunter2", "ok")
    ctx, _ = await store_turn(store, mm, b, USER, "where is the kafka cluster?", "?")
    assert ctx.metadata["recalled"] == []                       # session a is not recalled into b
    hits = await mm.search(USER, "kafka cluster")
    assert (a, "alpha", "the kafka cluster lives in rack 9 / ok") in [
        (h["session_id"], h["title"], h["snippet"]) for h in hits]
    assert all(h["session_id"] != other for h in hits)          # never another user's turns
    assert set(hits[0]) == {"session_id", "title", "message_id", "role", "time", "snippet", "score"}
    assert await mm.search(USER, "kafka", session_id=other) == []
    scoped = await mm.search(USER, "redis port", session_id=b)
    assert {h["session_id"] for h in scoped} == {b} and scoped[0]["snippet"] == "redis runs on port 6380 here / ok"
    await store.delete(a)
    assert all(h["session_id"] != a for h in await mm.search(USER, "kafka cluster"))
    await store.purge(b)
    assert await mm.search(USER, "redis port") == []
    await mm.aclose()


async def test_new_manager_cross_session_search_indexes_every_session(store):
    mm = MemoryManager(MemoryConfig.from_dict({"summarization": {"enabled": False}}), store, None, None, "SYS")
    sids = []
    for i in range(5):
        sid = (await store.create(USER, f"s{i}")).session_id
        sids.append(sid)
        await store_turn(store, mm, sid, USER, f"topic number {i}: host{i} runs service{i}", "ok")
    fresh = MemoryManager(MemoryConfig(), store, None, None, "SYS")
    for i in range(5):
        [hit, *_] = await fresh.search(USER, f"service{i}")
        assert hit["session_id"] == sids[i]
    await mm.aclose()
    await fresh.aclose()


async def test_what_another_node_changed_reaches_this_nodes_search(store):
    await changes_on_another_node(store, store)          # (tests/pg: two stores on one database)


def test_excerpt_format_and_budget():
    c = ApproxTokenCounter()
    doc = TurnDoc("s", 3, 4, "2026-11-20T10:15:30+00:00", "please remember " * 50, "noted " * 80)
    text = format_excerpt(doc, c, 60)
    assert text.startswith("[Recalled from 2026-11-20 10:15 UTC] User: please remember")
    assert " / Assistant: noted" in text and text.count("…") == 2 and c.count(text) <= 60
    short = TurnDoc("s", 3, None, "bad time", "just a question", "")
    assert format_excerpt(short, c, 60) == "[Recalled from unknown time] User: just a question"


def test_turn_docs_pair_user_and_final_answer():
    msgs = [ChatMessage(1, "assistant", "orphan"), ChatMessage(2, "user", "q1"),
            ChatMessage(3, "assistant", "", tool_calls=[]), ChatMessage(4, "assistant", "final 1"),
            ChatMessage(5, "user", "q2 unanswered"), ChatMessage(6, "user", "q3 in progress")]
    docs, upto = turn_docs("s", msgs, final=False)
    assert [(d.message_id, d.answer_id, d.answer_text) for d in docs] == [(2, 4, "final 1"), (5, None, "")]
    assert upto == 5                                            # the running turn is indexed later
    docs, upto = turn_docs("s", msgs, final=True)
    assert [d.message_id for d in docs] == [2, 5, 6] and upto == 6


def test_turn_docs_leave_canned_replies_out():
    """The offline agent's help text is marked canned: it ends the turn, but is not indexed."""
    msgs = [ChatMessage(1, "user", "help"),
            ChatMessage(2, "assistant", "I can show disk usage, CPU usage, ...", metadata={"canned": True})]
    docs, upto = turn_docs("s", msgs, final=False)
    assert [(d.message_id, d.answer_id, d.text()) for d in docs] == [(1, None, "help")] and upto == 2


def test_neighbour_context_is_updated_as_turns_arrive():
    idx = RecallIndex()
    idx.add_turns("s", [TurnDoc("s", 1, 2, "2026-05-08T10:00:00+00:00", "what colour is the rack?", "")], 2)
    idx.add_turns("s", [TurnDoc("s", 3, 4, "2026-05-08T10:01:00+00:00", "blue", "")], 4)
    [(doc, _)] = idx.search("rack colour blue", 1)
    assert doc.message_id == 3 or doc.message_id == 1
    assert "blue" in "".join(idx.bm25.terms_of(("s", 1)))        # the earlier turn now sees its reply
    assert idx.search("may 2026", 2) and idx.search("may 2026", 2)[0][1] > 0   # dates are indexed
    idx.remove_session("s")
    assert len(idx) == 0 and idx.search("blue", 3) == []


class _FromScratch(RecallIndex):
    """The reference: every (re-)indexed document's bag built from scratch by ``document_terms``."""

    def _reindex(self, order, i):
        from server.memory.recall import WEIGHTS_AFTER, WEIGHTS_BEFORE, date_terms, document_terms
        key, terms = order[i], self._terms
        before = [terms[order[j]] for j in range(i - 1, max(i - 1 - len(WEIGHTS_BEFORE), -1), -1)]
        after = [terms[order[j]] for j in range(i + 1, min(i + 1 + len(WEIGHTS_AFTER), len(order)))]
        self.bm25.add(key, document_terms(terms[key], before, after, date_terms(self.docs[key].time)), key[0])


def test_turns_added_one_by_one_index_exactly_as_built_from_scratch():
    """The incremental re-weighting of the neighbours (a cached head, only the turns after added)
    gives the very bags (values, term order) and scores that building each document again gives."""
    from server.memory.recall import WEIGHTS_AFTER
    rng = random.Random(13)
    words = ["rack", "blue", "disk", "web", "garage", "car", "may", "backup", "colour", "server", "日志", "备份"]
    for _ in range(30):
        ref, inc = _FromScratch(), RecallIndex()
        for sid in ("s", "t"):
            docs = [TurnDoc(sid, 2 * i + 1, 2 * i + 2 if rng.random() < 0.8 else None,
                            f"2026-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}T10:00:00+00:00",
                            " ".join(rng.choices(words, k=rng.randint(1, 9))),
                            " ".join(rng.choices(words, k=rng.randint(0, 6)))) for i in range(rng.randint(1, 12))]
            i = 0
            while i < len(docs):
                n = rng.randint(0, 3)
                for idx in (ref, inc):
                    idx.add_turns(sid, docs[i:i + n] + docs[max(0, i - 1):i], 0)   # a repeated turn is skipped
                i += n
        assert list(ref.bm25._doc_terms) == list(inc.bm25._doc_terms)
        for key, bag in ref.bm25._doc_terms.items():
            assert list(inc.bm25._doc_terms[key].items()) == list(bag.items())
        assert len(inc._heads) <= 2 * len(WEIGHTS_AFTER)
        for q in ("rack blue", "garage car backup", "备份 server", "may 2026"):
            for sid in (None, "s"):
                assert ([(h.key, s) for h, s in inc.search(q, 5, session_id=sid)]
                        == [(h.key, s) for h, s in ref.search(q, 5, session_id=sid)])
        inc.remove_session("s")
        inc.remove_session("t")
        assert not inc._heads


async def test_embeddings_are_fused_with_bm25(store):
    async with EmbeddingServer() as emb:
        cfg = MemoryConfig.from_dict({"summarization": {"enabled": False}, "context": {"recent_turns": 1},
                                      "recall": {"embeddings": {"enabled": True, "base_url": emb.base_url,
                                                                "model": "toy-embed"}}})
        mm = MemoryManager(cfg, store, None, None, "SYS")
        sid = (await store.create(USER)).session_id
        await store_turn(store, mm, sid, USER, "my car is parked in garage B", "ok")
        for i in range(3):
            await store_turn(store, mm, sid, USER, f"check disk on web{i}", "fine")
        await mm.wait_idle()                                    # turn embeddings computed in the background
        ctx = await mm.build_context(sid, USER, await store.append(sid, "user", "where is the automobile?"), "m")
        assert "my car is parked in garage B" in recall_block(ctx)   # no shared word: found by the vectors
        assert emb.requests >= 2
        emb.fail = True                                         # endpoint down: BM25 alone still works
        ctx = await mm.build_context(sid, USER, await store.append(sid, "user", "which garage is the car in?"), "m")
        assert "garage B" in recall_block(ctx)
        await mm.aclose()


def test_relative_times_in_a_query_prefer_the_days_they_name():
    from datetime import datetime, timezone

    from server.memory.recall import RecallIndex, TurnDoc, query_terms
    from server.memory.when import referenced_days
    now = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)          # a Wednesday
    days = {q: [d.date().isoformat() for d in referenced_days(q, now)] for q in (
        "what did we change yesterday?", "last Tuesday", "3 days ago", "the day before yesterday", "昨天的nginx",
        "上周二", "三天前", "前天", "十二天前", "nothing relative")}
    assert days == {"what did we change yesterday?": ["2026-11-24"], "last Tuesday": ["2026-11-24"],
                    "3 days ago": ["2026-11-22"], "the day before yesterday": ["2026-11-23"],
                    "昨天的nginx": ["2026-11-24"], "上周二": ["2026-11-17"], "三天前": ["2026-11-22"],
                    "前天": ["2026-11-23"], "十二天前": ["2026-11-13"], "nothing relative": []}
    assert len(referenced_days("last week", now)) == 7
    assert query_terms("nginx yesterday") == query_terms("nginx yesterday", None)
    index = RecallIndex()
    docs = [TurnDoc("s", 1, 2, "2026-11-20T09:00:00+00:00", "we changed the nginx worker count", "done"),
            TurnDoc("s", 3, 4, "2026-11-24T09:00:00+00:00", "we changed the nginx worker count", "done")]
    index.add_turns("s", docs, 4)
    assert index.search("what did we change on nginx yesterday?", 1, now=now)[0][0].message_id == 3
    assert index.search("我们昨天对nginx改了什么", 1, now=now)[0][0].message_id == 3
    assert index.search("what did we change on nginx 5 days ago?", 1, now=now)[0][0].message_id == 1


async def test_a_storage_failure_while_checking_hits_is_not_taken_for_a_purge(store, monkeypatch):
    mm = MemoryManager(MemoryConfig.from_dict({"summarization": {"enabled": False}}), store, None, None, "SYS")
    a = (await store.create(USER, "alpha")).session_id
    await store_turn(store, mm, a, USER, "the kafka cluster lives in rack 9", "ok")
    assert [h["session_id"] for h in await mm.search(USER, "kafka cluster")] == [a]
    real_get = store.get

    async def failing_get(session_id):
        raise StorageIOError(f"cannot read {session_id}: disk gone")
    monkeypatch.setattr(store, "get", failing_get)
    with pytest.raises(StorageIOError):          # told as it is (the tool reports the failure) ...
        await mm.search(USER, "kafka cluster")
    monkeypatch.setattr(store, "get", real_get)
    # ... and the session was not forgotten as if it had been purged
    assert [h["session_id"] for h in await mm.search(USER, "kafka cluster")] == [a]
    await mm.aclose()
