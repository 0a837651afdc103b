"""Dropping a session from the recall index (clear, delete, purge, restore, edit, regenerate: all go
through ``MemoryManager.forget_session``) never holds the event loop for long.

Before, ``RecallIndex.remove_session`` removed the session document by document and term by term,
on the loop, in one go: 5.2 s for 100 turns of 32,000-character pastes. Now the session is hidden
from searches at once and its postings leave one entry per distinct term (``BM25Index.drop_group``),
in slices of about ``INDEX_SLICE_TERMS`` terms with a yield to the loop in between. These tests
check the mechanism, not timings: the work done on the loop per call and per slice, what searches
see meanwhile, and that the index ends up exactly as removing the documents one by one left it.
"""
from __future__ import annotations

import asyncio
import random

from memory_testlib import PASTER, long_session, quiet_manager as manager
from server.memory.bm25 import BM25Index
from server.memory.bm25_stats import CorpusStats
from server.memory.indexes import INDEX_SLICE_TERMS
from server.memory.recall import RecallIndex, TurnDoc, turn_docs

USER = PASTER
QUERIES = ("turn3 nginx timeout", "备份 超时", "answer2 kafka", "rollback 12345", "restart error")


class DropWork:
    """Document-frequency updates of the index's statistics (one per posting removed document by
    document, one per term when a whole group's posting list goes at once), cut into the slices
    the loop runs between two turns of ``ticker``."""

    def __init__(self, monkeypatch) -> None:
        self.updates = 0
        self.slices: list[int] = []
        self.done = False
        drop_term = CorpusStats.drop_term
        lower = getattr(CorpusStats, "lower", None)

        def counted_drop_term(stats, term, group):
            self.updates += 1
            return drop_term(stats, term, group)
        monkeypatch.setattr(CorpusStats, "drop_term", counted_drop_term)
        if lower is not None:
            def counted_lower(stats, term, count):
                self.updates += 1
                return lower(stats, term, count)
            monkeypatch.setattr(CorpusStats, "lower", counted_lower)

    def cut(self) -> None:
        if self.updates:
            self.slices.append(self.updates)
        self.updates = 0

    async def ticker(self) -> None:
        while not self.done:
            self.cut()
            await asyncio.sleep(0)
        self.cut()


def terms_of_session(index: RecallIndex, sid: str) -> set[str]:
    return set().union(*(index.bm25.terms_of(key) for key in index.docs if key[0] == sid))


def reference(sid: str, docs: list[TurnDoc], upto: int) -> RecallIndex:
    """The session indexed alone, from scratch."""
    index = RecallIndex()
    index.add_turns(sid, docs, upto)
    return index


def assert_same_ranking(index: RecallIndex, ref: RecallIndex, sid: str | None) -> None:
    """The same hits in the same order, the scores equal up to the rounding of the collection's
    total length (summed in another order)."""
    for q in QUERIES:
        got, want = hits(index, q, sid), hits(ref, q, sid)
        assert got and [k for k, _ in got] == [k for k, _ in want]
        assert all(abs(x - y) <= 1e-9 * abs(y) for (_, x), (_, y) in zip(got, want))


def hits(index: RecallIndex, query: str, sid: str | None = None, k: int = 10) -> list[tuple[tuple[str, int], float]]:
    return [(doc.key, score) for doc, score in index.search(query, k, session_id=sid)]


async def test_forgetting_a_big_session_posts_nothing_on_the_call_and_drops_its_terms_in_bounded_slices(
        store, monkeypatch):
    """A clear of a session of long pasted turns: ``forget_session`` (synchronous, on the loop)
    removes no posting itself; the background drop updates one document frequency per distinct
    term of the session (not one per document and term) and at most INDEX_SLICE_TERMS between two
    turns of the loop. Before: every posting, document by document, inside the call."""
    big = await long_session(store, turns=20, chars=6_000, seed=1)
    other = await long_session(store, turns=3, chars=800, seed=2)
    mm = manager(store)
    uidx = mm.indexes.user(USER)
    async with uidx.lock:
        await mm.indexes.sync(uidx, big)
        await mm.indexes.sync(uidx, other)
    index = uidx.index
    unique = len(terms_of_session(index, big))
    postings = sum(len(index.bm25.terms_of(key)) for key in index.docs if key[0] == big)
    assert postings > 4 * unique > 4 * INDEX_SLICE_TERMS           # neighbours share most terms
    work = DropWork(monkeypatch)

    mm.forget_session(big)                          # what the server does on a clear
    assert work.updates == 0                        # nothing but the documents themselves on the call
    assert not any(key[0] == big for key in index.docs) and index.search("turn3 nginx timeout", 10) != []
    assert all(doc.session_id == other for doc, _ in index.search("turn3 nginx timeout", 10))

    async def drained() -> None:
        try:
            await mm.wait_idle()
        finally:
            work.done = True
    await asyncio.gather(drained(), work.ticker())
    assert len(work.slices) > 2
    assert max(work.slices) <= INDEX_SLICE_TERMS
    assert sum(work.slices) == unique               # one update per distinct term of the session
    assert index.bm25.dropping(big) is None and index.bm25.group_size(big) == 0
    assert not any(big in groups for groups in index.bm25._postings.values())
    docs, upto = turn_docs(other, await store.messages(other), final=False)
    assert_same_ranking(index, reference(other, docs, upto), other)


def build(sessions: dict[str, list[TurnDoc]]) -> RecallIndex:
    index = RecallIndex()
    for sid, docs in sessions.items():
        index.add_turns(sid, docs, 0)
    return index


def random_sessions(rng: random.Random, names: str) -> dict[str, list[TurnDoc]]:
    words = ["rack", "blue", "disk", "web", "garage", "car", "may", "backup", "colour", "server", "日志", "备份",
             "osprey", "staging", "kafka", "nginx"]
    return {sid: [TurnDoc(sid, 2 * i + 1, 2 * i + 2, f"2026-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}T10:00:00+00:00",
                          " ".join(rng.choices(words, k=rng.randint(1, 12))),
                          " ".join(rng.choices(words, k=rng.randint(0, 8)))) for i in range(rng.randint(1, 9))]
            for sid in names}


def removed_one_by_one(index: RecallIndex, sid: str) -> None:
    """The reference: what ``remove_session`` did before (each document alone, term by term)."""
    for key in index._order.pop(sid, ()):
        index._drop(key)
        index.bm25.remove(key)
    index.indexed_upto.pop(sid, None)


def same_state(a: BM25Index, b: BM25Index) -> None:
    assert a._postings == b._postings and a._tf_max == b._tf_max and a._min_len == b._min_len
    assert a._stats.df == b._stats.df and a._stats.n == b._stats.n and a._stats.total_len == b._stats.total_len
    assert a._seq == b._seq and a._doc_len == b._doc_len and len(a) == len(b)


def test_a_dropped_session_leaves_the_index_exactly_as_removing_its_documents_one_by_one():
    """Bit-identical statistics, postings and scores to the per-document removal (sliced or at
    once), and the same rankings as an index built without the session (scores equal up to the
    rounding of the total length, summed in another order)."""
    for seed in range(25):
        rng = random.Random(seed)
        sessions = random_sessions(rng, "stu")
        gone = rng.choice("stu")
        ref, whole, sliced = build(sessions), build(sessions), build(sessions)
        removed_one_by_one(ref, gone)
        whole.remove_session(gone)
        drop = sliced.drop_session(gone)
        while not drop.done:
            assert drop.step(rng.randint(1, 7)) > 0
        without = build({sid: docs for sid, docs in sessions.items() if sid != gone})
        for index in (whole, sliced):
            same_state(index.bm25, ref.bm25)
            assert index.docs == ref.docs and gone not in index._order and gone not in index.indexed_upto
            for q in ("rack blue", "garage car backup", "备份 server", "may 2026", "osprey kafka nginx"):
                for sid in (None, "s", "t", "u"):
                    assert hits(index, q, sid) == hits(ref, q, sid)
                    got, want = hits(index, q, sid), hits(without, q, sid)
                    assert [k for k, _ in got] == [k for k, _ in want]
                    assert all(abs(x - y) <= 1e-9 * abs(y) for (_, x), (_, y) in zip(got, want))


def test_searches_during_a_sliced_drop_never_see_the_session_and_a_re_add_finishes_it_first():
    """Between the steps of a drop, no search (one session, every session, with exclusions)
    returns a document of the session or fails on its half-dropped postings; adding the session
    again meanwhile (a restore right after a delete) first finishes the drop, and the index is then
    exactly one where it was removed and added again."""
    for seed in range(20):
        rng = random.Random(100 + seed)
        sessions = random_sessions(rng, "st")
        sessions["s"] += [TurnDoc("s", 99, 100, "2026-05-01T10:00:00+00:00", "where is the kestrel", "heron")]
        index, ref = build(sessions), build(sessions)
        drop = index.drop_session("s")
        steps, stop = 0, rng.randint(0, 6)
        while not drop.done and steps < stop:
            for q in ("kestrel heron", "osprey staging", "rack blue kafka", "日志 备份"):
                assert all(key[0] == "t" for key, _ in hits(index, q))
                assert hits(index, q, "s") == []
                assert all(doc.session_id == "t" for doc, _ in index.search(q, 5, exclude=[1]))
                assert not index.has_candidates("s", ())
            drop.step(rng.randint(1, 5))
            steps += 1
        index.add_turns("s", sessions["s"], 0)         # the session back (its drop still under way or not)
        assert drop.done and index.bm25.dropping("s") is None
        removed_one_by_one(ref, "s")
        ref.add_turns("s", sessions["s"], 0)
        same_state(index.bm25, ref.bm25)
        for q in ("osprey staging", "rack blue kafka", "日志 备份", "may 2026"):
            for sid in (None, "s", "t"):
                assert hits(index, q, sid) == hits(ref, q, sid)
        assert hits(index, "kestrel heron", "s")[0][0] == ("s", 99)


async def test_a_session_synced_again_right_after_it_was_forgotten_is_indexed_in_bounded_slices(
        store, monkeypatch):
    """An edit or a regenerate forgets the session and its next turn indexes it again at once: the
    sync takes part in the drop still under way (in slices too) before it posts, and the session is
    indexed exactly as if it had never been dropped."""
    sid = await long_session(store, turns=12, chars=6_000, seed=7)
    mm = manager(store)
    uidx = mm.indexes.user(USER)
    async with uidx.lock:
        await mm.indexes.sync(uidx, sid)
    work = DropWork(monkeypatch)
    mm.forget_session(sid)
    assert work.updates == 0 and uidx.index.bm25.dropping(sid) is not None

    async def resync() -> None:
        try:
            async with uidx.lock:
                assert await mm.indexes.sync(uidx, sid)
        finally:
            work.done = True
    await asyncio.gather(resync(), work.ticker())
    assert max(work.slices) <= INDEX_SLICE_TERMS
    await mm.wait_idle()
    docs, upto = turn_docs(sid, await store.messages(sid), final=False)
    ref = reference(sid, docs, upto)
    assert set(uidx.index.docs) == set(ref.docs) and uidx.index.indexed_upto[sid] == 24
    assert uidx.index.bm25._stats.df == ref.bm25._stats.df and len(uidx.index.bm25) == len(ref.bm25)
    assert_same_ranking(uidx.index, ref, sid)


def test_the_knowledge_base_engine_drops_a_group_with_its_own_statistics():
    """``group_stats`` (the knowledge base's index): during a drop the group counts in no group's
    statistics, and afterwards every statistic is what removing its documents one by one gives."""
    rng = random.Random(5)
    words = ["restore", "timeout", "backup", "runbook", "nginx", "disk", "备份", "超时"]
    docs = [(f"d{i}", rng.choices(words, k=rng.randint(1, 10)), rng.choice("abc")) for i in range(60)]
    index, ref = BM25Index(group_stats=True), BM25Index(group_stats=True)
    for doc_id, terms, group in docs:
        index.add(doc_id, terms, group)
        ref.add(doc_id, terms, group)
    a_ids = [d for d, _, g in docs if g == "a"]
    query = ["restore", "timeout"]
    drop = index.drop_group("a", a_ids)
    drop.step(3)
    assert index.stats(["a"]).n == 0 and index.group_size("a") == 0
    assert index.search(query, 5, group="a") == []
    assert index.search(query, 60) and all(d not in a_ids for d, _ in index.search(query, 60))
    drop.finish()
    ref.remove_many(a_ids)
    same_state(index, ref)
    assert "a" not in index._stats._gdf
    for groups in (["b"], ["b", "c"], ["a", "b", "c"]):
        s1, s2 = index.stats(groups), ref.stats(groups)
        assert (s1.n, s1.total_len, [s1.df(w) for w in words]) == (s2.n, s2.total_len, [s2.df(w) for w in words])
        assert index.search(["restore", "backup"], 10, group="b", stats=s1) == ref.search(["restore", "backup"], 10, group="b",
                                                                                       stats=s2)
