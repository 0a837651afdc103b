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
