"""Removing sealed documents gives their memory back: a segment whose documents are all removed is
dropped at once, a segment more than half dead is rebuilt with its live documents only, and a
rebuilt or merged segment keeps only the terms of live documents (its term dictionary shrinks)."""
from __future__ import annotations

import math
import random

import pytest

from server.memory.bm25 import BM25Index
from server.memory.bm25_segment import Segment


def docs(prefix: str, n: int, rng: random.Random, group: str = "g") -> list[tuple[str, dict[str, float], str]]:
    """``n`` documents, each with 5 terms of its own and 3 shared ones."""
    return [(f"{prefix}{i}", {**{f"{prefix}{i}w{j}": 1.0 for j in range(5)},
                             **{f"s{rng.randrange(20)}": 2.0 for _ in range(3)}}, group) for i in range(n)]


def shape(index: BM25Index) -> list[tuple[int, int, int]]:
    """(documents, live documents, terms) per segment."""
    return [(len(s.ids), s.n_alive, len(s.vocab)) for s in index._segments]


@pytest.mark.parametrize("group_stats", [False, True])
def test_removing_every_document_of_a_segment_drops_it_and_its_terms(group_stats):
    rng = random.Random(1)
    index = BM25Index(**({"group_stats": True} if group_stats else {}))
    one = docs("a", 30, rng)
    index.add_sealed(one)
    assert shape(index) == [(30, 30, len({t for _, bag, _ in one for t in bag}))]
    for d, _, _ in one:
        assert index.remove(d)
    assert index._segments == [] and len(index) == 0
    assert index._stats.df == {} and index._stats._group_size == {}
    assert index._stats._gdf == {} and index._stats._glen == {}
    assert index.search(["s1", "a0w0"], 5) == []


def test_a_dead_segment_in_the_middle_goes_at_once_and_the_others_stay():
    rng = random.Random(2)
    index = BM25Index()
    big, mid, small = docs("a", 40, rng), docs("b", 12, rng), docs("c", 4, rng)
    for batch in (big, mid, small):
        index.add_sealed(batch)
    before = shape(index)
    assert [n for n, _, _ in before] == [40, 12, 4]
    for d, _, _ in mid:
        index.remove(d)
    assert shape(index) == [before[0], before[2]]
    assert not any(t.startswith("b") for t in index._stats.df)


def test_a_mostly_dead_segment_is_rebuilt_with_its_live_documents_and_terms_only():
    rng = random.Random(3)
    index, plain = BM25Index(), BM25Index()
    batch = docs("a", 10, rng)
    index.add_sealed(batch)
    for d, bag, g in batch:
        plain.add(d, bag, g)
    for d, _, _ in batch[:5]:                        # half dead: kept as is
        index.remove(d)
        plain.remove(d)
    assert shape(index)[0][:2] == (10, 5)
    index.remove("a5")                               # 6 of 10 dead: rebuilt
    plain.remove("a5")
    [seg] = index._segments
    live_terms = {t for _, bag, _ in batch[6:] for t in bag}
    assert (len(seg.ids), seg.n_alive) == (4, 4) and set(seg.vocab) == live_terms
    assert set(index._stats.df) == live_terms
    for q in (["s1", "s2", "a7w1"], ["a0w0"], ["s3"]):
        got, want = index.search(q, 3), plain.search(q, 3)
        assert [d for d, _ in got] == [d for d, _ in want]
        assert all(math.isclose(x, y, rel_tol=1e-12) for (_, x), (_, y) in zip(got, want))
    assert "a2" not in index and "a8" in index and index.terms_of("a8") == plain.terms_of("a8")


def test_remove_many_rebuilds_each_segment_once():
    rng = random.Random(4)
    index = BM25Index()
    batch = docs("a", 12, rng)
    index.add_sealed(batch)
    seg = index._segments[0]
    assert index.remove_many([d for d, _, _ in batch[:9]] + ["nope"]) == 9
    [rebuilt] = index._segments
    assert rebuilt is not seg and (len(rebuilt.ids), rebuilt.n_alive) == (3, 3)
    assert index.remove_many([d for d, _, _ in batch[9:]]) == 3 and index._segments == []


def test_a_merge_keeps_only_the_terms_of_live_documents():
    rng = random.Random(5)
    a, b = BM25Index(), BM25Index()
    a.add_sealed(docs("a", 6, rng))
    b.add_sealed(docs("b", 6, rng))
    sa, sb = a._segments[0], b._segments[0]
    sa.kill(0)
    sb.kill(5)
    merged = Segment.merge([sa, sb])
    assert merged.ids == [f"a{i}" for i in range(1, 6)] + [f"b{i}" for i in range(5)]
    assert set(merged.vocab) == {t for i in range(len(merged.ids)) for t in merged.bag(i)}
    assert "a0w0" not in merged.term_id and "b5w4" not in merged.term_id and "a1w0" in merged.term_id
