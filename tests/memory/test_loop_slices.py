"""The memory layer's CPU work never holds the event loop for long (one turn's long pasted text, a
session of them indexed after a restart, an offline summary of them).

These tests check the mechanism, not timings: what runs on the loop thread between two of its
yields (text analyzed, terms posted), which thread the extractive summarizer runs on, and how much
of a long message the recall query and an excerpt look at.
"""
from __future__ import annotations

import asyncio
import random
import threading
from datetime import datetime, timedelta, timezone

import server.memory.indexes as indexes_mod
import server.memory.recall as recall
import server.memory.summarizer as summarizer
from memory_testlib import PASTER, paste, OfflineStub, long_session, quiet_manager as manager
from server.memory.config import SummarizationConfig
from server.memory.indexes import INDEX_INLINE_CHARS, INDEX_SLICE_TERMS
from server.memory.recall import (EXCERPT_CHARS_PER_TOKEN, MAX_QUERY_CHARS, RecallIndex, TurnDoc,
                                  excerpt_and_tokens, query_terms, turn_docs)
from server.memory.tokens import ApproxTokenCounter
from storage.models import ChatMessage

USER = PASTER


class LoopWork:
    """What the loop thread does between two of its turns: text analyzed (characters) and terms
    posted to the index. ``ticker`` runs as a task beside the work: each time it gets the loop, the
    work since its last turn is one slice."""

    def __init__(self, monkeypatch) -> None:
        self.loop_thread = threading.get_ident()
        self.chars = self.terms = 0
        self.slices: list[tuple[int, int]] = []
        self.done = False
        analyze, reindex = recall.analyze, recall.RecallIndex._reindex

        def counted_analyze(text: str) -> list[str]:
            if threading.get_ident() == self.loop_thread:
                self.chars += len(text)
            return analyze(text)

        def counted_reindex(index: RecallIndex, order: list, i: int):
            out = reindex(index, order, i)
            self.terms += len(index.bm25.terms_of(order[i]))
            return out
        monkeypatch.setattr(recall, "analyze", counted_analyze)
        monkeypatch.setattr(recall.RecallIndex, "_reindex", counted_reindex)

    def cut(self) -> None:
        if self.chars or self.terms:
            self.slices.append((self.chars, self.terms))
        self.chars = self.terms = 0

    async def ticker(self) -> None:
        while not self.done:
            self.cut()
            await asyncio.sleep(0)
        self.cut()


async def reference(store, sid: str) -> RecallIndex:
    """The session indexed in one go (``add_turns``), as before slicing."""
    docs, upto = turn_docs(sid, await store.messages(sid), final=False)
    index = RecallIndex()
    index.add_turns(sid, docs, upto)
    return index


def ranking(index: RecallIndex, sid: str, query: str) -> list[tuple[tuple[str, int], float]]:
    return [(doc.key, score) for doc, score in index.search(query, 10, session_id=sid)]


async def test_an_index_build_analyzes_off_the_loop_and_posts_in_bounded_slices(store, monkeypatch):
    """A session of long pasted turns indexed after a restart: the loop thread never analyzes more
    than INDEX_INLINE_CHARS characters, nor posts much more than INDEX_SLICE_TERMS terms, between two
    of its turns (before: 25 turns at a time, 5-15 s with 32,000-character messages); the index is
    exactly the one built in one go."""
    sid = await long_session(store, turns=12, chars=6_000)
    mm = manager(store)
    work = LoopWork(monkeypatch)
    uidx = mm.indexes.user(USER)

    async def build() -> None:
        try:
            async with uidx.lock:
                await mm.indexes.sync(uidx, sid)
        finally:
            work.done = True
    await asyncio.gather(build(), work.ticker())

    index = uidx.index
    assert len(index) == 12 and index.indexed_upto[sid] == 24
    biggest = max(len(index.bm25.terms_of(key)) for key in index.docs)
    assert len(work.slices) > 2
    assert max(chars for chars, _ in work.slices) <= INDEX_INLINE_CHARS
    assert max(terms for _, terms in work.slices) < INDEX_SLICE_TERMS + biggest
    ref = await reference(store, sid)
    for query in ("turn3 nginx timeout", "备份 超时", "answer11 kafka", "rollback 12345"):
        assert ranking(index, sid, query) == ranking(ref, sid, query)


async def test_a_long_new_turn_is_analyzed_off_the_loop(store, monkeypatch):
    """The common case: one new turn with a 32,000-character paste is indexed incrementally without
    analyzing it on the loop, and each slice posts at most one document past the bound."""
    sid = await long_session(store, turns=3, chars=500)
    mm = manager(store)
    uidx = mm.indexes.user(USER)
    async with uidx.lock:
        await mm.indexes.sync(uidx, sid)
    rng = random.Random(5)
    await store.append(sid, "user", "kestrel " + paste(rng, 32_000))
    await store.append(sid, "assistant", "noted")
    work = LoopWork(monkeypatch)

    async def step() -> None:
        try:
            async with uidx.lock:
                assert await mm.indexes.sync(uidx, sid)
        finally:
            work.done = True
    await asyncio.gather(step(), work.ticker())
    assert max(chars for chars, _ in work.slices) <= INDEX_INLINE_CHARS
    assert ranking(uidx.index, sid, "kestrel") == ranking(await reference(store, sid), sid, "kestrel")


async def test_a_session_cleared_while_its_turns_are_analyzed_is_read_again(store, monkeypatch):
    """A clear (``forget_session``) while the analysis runs in its worker thread: what was read
    before it is not indexed; the session is read again, as it is now."""
    sid = await long_session(store, turns=4, chars=4_000)
    await store.append(sid, "user", "the redis cluster lives on host kestrel")
    await store.append(sid, "assistant", "noted: kestrel")
    mm = manager(store)
    entered, release = threading.Event(), threading.Event()
    analyze_turns = indexes_mod.analyze_turns

    def gated(docs):
        entered.set()
        release.wait(30)
        return analyze_turns(docs)
    monkeypatch.setattr(indexes_mod, "analyze_turns", gated)
    uidx = mm.indexes.user(USER)

    async def prompt_sync() -> bool:               # as a prompt's recall does (no re-check after it)
        async with uidx.lock:
            return await mm.indexes.sync(uidx, sid)
    sync = asyncio.create_task(prompt_sync())
    try:
        assert await asyncio.to_thread(entered.wait, 30)
        await store.clear(sid)
        mm.forget_session(sid)                     # what the server does on a clear
        user = await store.append(sid, "user", "the staging database is on host osprey")
        await store.append(sid, "assistant", "noted: osprey")
    finally:
        release.set()
    assert await sync
    assert set(uidx.index.docs) == {(sid, user.id)}         # nothing read before the clear
    assert uidx.index.search("kestrel", 5, session_id=sid) == []
    assert [h["message_id"] for h in await mm.search(USER, "osprey")] == [user.id]


async def test_an_index_build_cancelled_half_way_is_done_in_full_next_time(store, monkeypatch):
    """A turn cancelled while its session is being indexed leaves no half-posted documents: the next
    sync indexes the session as if nothing had happened."""
    sid = await long_session(store, turns=12, chars=6_000, seed=7)
    mm = manager(store)
    work = LoopWork(monkeypatch)
    uidx = mm.indexes.user(USER)

    async def build() -> None:
        async with uidx.lock:
            await mm.indexes.sync(uidx, sid)
    task = asyncio.create_task(build())
    while not work.terms and not task.done():      # until the first slice is posted
        await asyncio.sleep(0)
    assert not task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    async with uidx.lock:
        await mm.indexes.sync(uidx, sid)
    ref = await reference(store, sid)
    assert set(uidx.index.docs) == set(ref.docs) and uidx.index.indexed_upto[sid] == 24
    for query in ("turn0 nginx", "turn11 服务器", "answer5 redis"):
        assert ranking(uidx.index, sid, query) == ranking(ref, sid, query)


async def test_the_offline_summary_is_written_in_a_worker_thread(monkeypatch):
    """With the offline agent (the default) the extractive summarizer runs off the loop: it took 4 s
    of the loop's time on a session of long pastes."""
    threads: list[int] = []
    extractive = summarizer.extractive_summary

    def spy(previous: str, messages: list[ChatMessage]) -> str:
        threads.append(threading.get_ident())
        return extractive(previous, messages)
    monkeypatch.setattr(summarizer, "extractive_summary", spy)
    ts = "2026-11-20T10:15:00+00:00"
    covered = [ChatMessage(1, "user", "My staging server is stage-7.internal. check this log: " + paste(random.Random(2), 5000), ts),
               ChatMessage(2, "assistant", "noted", ts)]
    p = summarizer.Plan(None, covered, [])
    record = await summarizer.summarize(p, SummarizationConfig(), ApproxTokenCounter(), OfflineStub(), None)
    assert threads and threads[0] != threading.get_ident()
    assert record.model == summarizer.EXTRACTIVE_MODEL and "stage-7.internal" in record.text


def test_a_long_query_is_searched_by_its_ends_only(monkeypatch):
    """A 32,000-character message as the recall query: only its first and last MAX_QUERY_CHARS / 2
    characters are analyzed and scanned for relative times; a question at its end still counts."""
    ts = "2026-11-20T10:15:00+00:00"
    index = RecallIndex()
    index.add_turns("s", [TurnDoc("s", 1, 2, ts, "the redis cluster lives on host kestrel", "noted"),
                          TurnDoc("s", 3, 4, ts, "the staging database is on host osprey", "noted"),
                          TurnDoc("s", 5, 6, ts, "nginx reload done", "ok")], 6)
    seen: list[int] = []
    analyze, referenced_days = recall.analyze, recall.referenced_days

    def counted(fn):
        def wrapper(text, *args):
            seen.append(len(text))
            return fn(text, *args)
        return wrapper
    monkeypatch.setattr(recall, "analyze", counted(analyze))
    monkeypatch.setattr(recall, "referenced_days", counted(referenced_days))
    rng = random.Random(3)
    middle = paste(rng, 15_000) + " osprey osprey " + paste(rng, 15_000)
    query = "check this log: " + middle + " where does the redis cluster live?"
    hits = index.search(query, 3, session_id="s")
    assert seen and max(seen) <= MAX_QUERY_CHARS + 1
    assert hits[0][0].message_id == 1
    assert "kestrel" not in query and "osprey" not in query_terms(query)    # the middle is not looked at
    now = datetime(2026, 11, 21, 9, 0, tzinfo=timezone.utc)
    terms = query_terms(paste(rng, 30_000) + " what did we change yesterday?", now)
    day = now - timedelta(days=1)
    assert set(recall.date_terms(day.isoformat())) <= set(terms)


def test_an_excerpt_of_a_long_turn_counts_only_what_it_can_keep():
    """A recalled turn with 32,000-character texts: the excerpt of N tokens counts (and truncates)
    at most EXCERPT_CHARS_PER_TOKEN * N characters of each text, and is what it was before."""
    class Recording(ApproxTokenCounter):
        def __init__(self) -> None:
            self.lengths: list[int] = []

        def count(self, text: str) -> int:
            self.lengths.append(len(text))
            return super().count(text)

        def truncate(self, text: str, max_tokens: int, keep_end: bool = False) -> str:
            self.lengths.append(len(text))
            return super().truncate(text, max_tokens, keep_end)

    rng = random.Random(4)
    user, answer = "kestrel " + paste(rng, 32_000), "answer " + paste(rng, 32_000)
    doc = TurnDoc("s", 1, 2, "2026-11-20T10:15:00+00:00", user, answer)
    counter = Recording()
    text, tokens = excerpt_and_tokens(doc, counter, 200)
    assert max(counter.lengths) <= EXCERPT_CHARS_PER_TOKEN * 200
    assert tokens <= 200 and tokens == ApproxTokenCounter().count(text)
    assert text.startswith("[Recalled from 2026-11-20 10:15 UTC] User: kestrel ") and " / Assistant: answer " in text
    u, a = text.split(" / Assistant: ")
    assert u.endswith("…") and a.endswith("…")
    # the default counter: the same excerpt as from texts short enough to be taken whole (the
    # estimator counts a token for at most 5 characters, so the cut never falls past the bound)
    keep = EXCERPT_CHARS_PER_TOKEN * 200 - 100
    assert excerpt_and_tokens(TurnDoc("s", 1, 2, doc.time, user[:keep], answer[:keep]), ApproxTokenCounter(), 200) \
        == (text, tokens)
