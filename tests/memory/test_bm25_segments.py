"""Sealed numpy segments of the BM25 engine score exactly like the dict index (up to float rounding):
search, scores, group restriction, skip, accept, re-add, removal, merging."""
from __future__ import annotations

import math
import random

from hypothesis import given, strategies as st

from server.memory.bm25 import ALL, BM25Index

VOCAB = [f"t{i}" for i in range(40)]


def same(a: list, b: list) -> None:
    assert [d for d, _ in a] == [d for d, _ in b], (a, b)
    assert all(math.isclose(x, y, rel_tol=1e-9) for (_, x), (_, y) in zip(a, b))


@given(st.integers(0, 10_000), st.sampled_from([None, 1, 3, 7, 0]))
def test_segments_match_the_dict_index(seed, seal_at):
    rng = random.Random(seed)
    plain, sealed = BM25Index(1.2, 0.75), BM25Index(1.2, 0.75, seal_at=seal_at or None)
    bulk = seal_at == 0                   # 0: every document through add_sealed
    live: list[int] = []
    for step in range(rng.randint(1, 60)):
        if live and rng.random() < 0.2:
            d = live.pop(rng.randrange(len(live)))
            assert plain.remove(d) and sealed.remove(d)
            assert not sealed.remove(d)
            continue
        d = rng.choice(live) if live and rng.random() < 0.15 else step          # sometimes a re-add
        bag = {rng.choice(VOCAB): rng.choice([1.0, 2.0, 0.5]) for _ in range(rng.randint(1, 8))}
        g = rng.choice(["a", "b", "c"])
        plain.add(d, bag, g)
        if bulk:
            sealed.add_sealed([(d, bag, g)])
        else:
            sealed.add(d, bag, g)
        if d not in live:
            live.append(d)
    if rng.random() < 0.5:
        sealed.compact()
    assert len(plain) == len(sealed) == len(live)
    for d in live:
        assert plain.terms_of(d) == sealed.terms_of(d) and d in sealed
    for t in VOCAB:
        assert plain.doc_freq(t) == sealed.doc_freq(t)
    for _ in range(5):
        q = rng.sample(VOCAB, rng.randint(1, 6))
        k = rng.randint(1, 8)
        skip = set(rng.sample(live, min(2, len(live))))
        for group in (ALL, "a", "b", "zzz"):
            same(plain.search(q, k, group=group, skip=skip), sealed.search(q, k, group=group, skip=skip))
        accept = (lambda d: d % 2 == 0)
        same(plain.search(q, k, accept), sealed.search(q, k, accept))
        ps, ss = plain.scores(q, group="a"), sealed.scores(q, group="a")
        assert ps.keys() == ss.keys() and all(math.isclose(ps[d], ss[d], rel_tol=1e-9) for d in ps)


def test_pruned_segment_search_on_a_larger_collection():
    rng = random.Random(5)
    words = [f"w{i}" for i in range(2000)]
    weights = [1 / (r + 1) for r in range(len(words))]
    plain, sealed = BM25Index(), BM25Index(seal_at=700)
    for d in range(3000):
        bag = rng.choices(words, weights, k=30)
        g = d % 3
        plain.add(d, bag, g)
        sealed.add(d, bag, g)
    assert len(sealed._segments) >= 2
    extra = BM25Index()
    for d in range(0, 3000, 100):                       # bulk segments of 100 documents
        extra.add_sealed((d + j, rng.choices(words, weights, k=30), (d + j) % 3) for j in range(100))
    assert 2 <= len(extra._segments) <= 16
    for _ in range(50):
        q = rng.choices(words, weights, k=8) + [rng.choice(words)]
        same(plain.search(q, 10, group=1), sealed.search(q, 10, group=1))
        same(plain.search(q, 10), sealed.search(q, 10))


@given(st.integers(0, 10_000), st.sampled_from([None, 1, 3, 0]))
def test_group_statistics_equal_an_index_of_the_visible_groups_alone(seed, seal_at):
    """``stats(groups)``: document count, df and average length of those groups only; a search with
    them scores exactly as an index holding only those groups' documents, sealed or not."""
    rng = random.Random(seed)
    visible = ["a", "b"]
    plain = BM25Index(1.2, 0.75, group_stats=True)
    sealed = BM25Index(1.2, 0.75, seal_at=seal_at or None, group_stats=True)
    alone = BM25Index(1.2, 0.75, group_stats=True)          # only the documents of groups a and b
    live: dict[int, str] = {}
    for step in range(rng.randint(1, 60)):
        if live and rng.random() < 0.2:
            d = rng.choice(sorted(live))
            g = live.pop(d)
            assert plain.remove(d) and sealed.remove(d) and (g not in visible or alone.remove(d))
            continue
        d = rng.choice(sorted(live)) if live and rng.random() < 0.15 else step
        bag = {rng.choice(VOCAB): rng.choice([1.0, 2.0, 0.5]) for _ in range(rng.randint(1, 8))}
        g = rng.choice(["a", "b", "c", "d"])
        plain.add(d, bag, g)
        if seal_at == 0:
            sealed.add_sealed([(d, bag, g)])
        else:
            sealed.add(d, bag, g)
        if g in visible:
            alone.add(d, bag, g)
        elif live.get(d) in visible:
            alone.remove(d)                                  # re-added into an invisible group
        live[d] = g
    if rng.random() < 0.5:
        sealed.compact()
    mine, theirs, ref = plain.stats(visible), sealed.stats(visible), alone.stats(visible)
    assert mine.n == theirs.n == ref.n == len(alone) == sum(g in visible for g in live.values())
    assert mine.total_len == ref.total_len and math.isclose(theirs.total_len, ref.total_len)
    for t in VOCAB:
        assert mine.df(t) == theirs.df(t) == ref.df(t) == alone.doc_freq(t)
    for _ in range(5):
        q = rng.sample(VOCAB, rng.randint(1, 6))
        k = rng.randint(1, 8)
        for group in visible:
            want = alone.search(q, k, group=group, stats=ref)
            assert plain.search(q, k, group=group, stats=mine) == want      # bit-identical
            same(sealed.search(q, k, group=group, stats=theirs), want)
            ps, ss = plain.scores(q, group=group, stats=mine), sealed.scores(q, group=group, stats=theirs)
            assert ps == alone.scores(q, group=group, stats=ref)
            assert ps.keys() == ss.keys() and all(math.isclose(ps[d], ss[d], rel_tol=1e-9) for d in ps)


def test_group_statistics_of_a_mixed_bulk_batch_and_of_removals_in_bulk():
    rng = random.Random(9)
    one_by_one, bulk = BM25Index(group_stats=True), BM25Index(group_stats=True)
    batch = [(d, {rng.choice(VOCAB): rng.choice([1.0, 2.0]) for _ in range(rng.randint(1, 6))}, rng.choice("abc"))
             for d in range(60)] + [(60, {}, "e"), (61, {}, "a")]          # documents without terms too
    for d, bag, g in batch:
        one_by_one.add(d, bag, g)
    bulk.add_sealed(batch)                                   # one segment holding three groups
    gone = rng.sample(range(60), 25)
    for d in gone:
        one_by_one.remove(d)
    assert bulk.remove_many(gone + gone[:3] + [999]) == 25   # repeated and unknown ids count once / not
    for groups in (["a"], ["b", "c"], ["a", "b", "c"], ["zzz"], ["e", "a"]):
        p, q = one_by_one.stats(groups), bulk.stats(groups)
        assert (p.n, p.total_len) == (q.n, q.total_len)
        assert all(p.df(t) == q.df(t) for t in VOCAB)
    assert {t: one_by_one.doc_freq(t) for t in VOCAB} == {t: bulk.doc_freq(t) for t in VOCAB}
    assert one_by_one.remove(60) and bulk.remove(60) and one_by_one.stats(["e"]).n == bulk.stats(["e"]).n == 0
