"""The fast paths give exactly what the straightforward computations give: one-regex token
counting, pruned group search and in-place re-indexing in BM25, and counted excerpts."""
from __future__ import annotations

import heapq
import random
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.memory.bm25 import BM25Index
from server.memory.recall import TurnDoc, excerpt_and_tokens, format_excerpt
from server.memory.tokens import CJK_CLASS, ApproxTokenCounter

C = ApproxTokenCounter()
_CJK = re.compile(f"[{CJK_CLASS}]")
_WORD = re.compile(rf"[^\W_{CJK_CLASS}]+")
_SYMBOL = re.compile(rf"[^\w\s{CJK_CLASS}]|_")


def reference_count(text: str) -> int:
    """The documented rule, spelled out: CJK 1, other visible characters 1, a word run ceil(len / 4)."""
    return len(_CJK.findall(text)) + len(_SYMBOL.findall(text)) + sum((len(w) + 3) // 4 for w in _WORD.findall(text))


@settings(deadline=None, max_examples=400)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_one_regex_count_equals_the_rule(text):
    assert C.count(text) == reference_count(text)


def test_count_handles_every_kind_of_character():
    rng = random.Random(4)
    pieces = ["abc", "ABCDEFGHI", "x_y", "42", "中文字", "カナ", "한국", "，。", "\u3000", " ", "\n\t", "ﬁ", "é", "😀", "-"]
    for _ in range(3000):
        text = "".join(rng.choices(pieces, k=rng.randint(0, 12)))
        assert C.count(text) == reference_count(text), repr(text)


# -- BM25 ---------------------------------------------------------------------------------------------
def full_scan(idx: BM25Index, query: list[str], k: int, group: str, skip: set) -> list:
    """Score every document of the collection, keep the group's: no pruning, no postings per group."""
    scores = idx.scores(query, lambda d: idx._group[d] == group and d not in skip)
    return heapq.nlargest(k, scores.items(), key=lambda kv: (kv[1], idx._seq[kv[0]]))


def random_bag(rng: random.Random, vocab: list[str]):
    if rng.random() < 0.5:                       # weighted bags as the recall index builds them
        return {rng.choice(vocab): rng.choice((1.0, 0.6, 0.3, 0.2, 0.5, 2.5)) for _ in range(rng.randint(1, 12))}
    return rng.choices(vocab, weights=[1 / (i + 1) for i in range(len(vocab))], k=rng.randint(1, 20))


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32))
def test_pruned_group_search_equals_a_full_scan(seed):
    rng = random.Random(seed)
    idx = BM25Index(1.2, rng.choice((0.0, 0.5, 0.75, 1.0)))
    vocab = [f"w{i}" for i in range(rng.randint(1, 40))]
    docs: list[int] = []
    for d in range(rng.randint(0, 120)):
        idx.add(d, random_bag(rng, vocab), rng.choice("abc"))
        docs.append(d)
        if rng.random() < 0.15:                  # re-index in place (neighbour context changed)
            idx.add(rng.choice(docs), random_bag(rng, vocab), idx._group[docs[-1]])
        if rng.random() < 0.08:
            gone = rng.choice(docs)
            idx.remove(gone)
            docs.remove(gone)
    for _ in range(6):
        query = rng.choices(vocab + ["unknown"], k=rng.randint(1, 15))
        group, k = rng.choice("abc"), rng.randint(1, 6)
        skip = set(rng.sample(docs, min(len(docs), rng.randint(0, 3))))
        assert idx.search(query, k, group=group, skip=skip) == full_scan(idx, query, k, group, skip)


def test_pruned_search_keeps_ties_newest_first():
    idx = BM25Index()
    for d in range(30):
        idx.add(d, ["disk", "full"] if d % 2 else ["disk"], "s")
    got = idx.search(["disk", "full"], 3, group="s")
    assert [d for d, _ in got] == [29, 27, 25] and got == full_scan(idx, ["disk", "full"], 3, "s", set())


def test_in_place_reindex_equals_remove_then_add():
    rng = random.Random(7)
    vocab = [f"t{i}" for i in range(25)]
    a, b = BM25Index(), BM25Index()
    for d in range(60):
        bag = random_bag(rng, vocab)
        a.add(d, bag, d % 3)
        b.add(d, bag, d % 3)
        if d > 2:
            again = rng.randrange(d)
            bag = random_bag(rng, vocab)
            a.add(again, bag, again % 3)          # diff update
            b.remove(again)
            b.add(again, bag, again % 3)
    for _ in range(50):
        query = rng.choices(vocab, k=rng.randint(1, 8))
        assert a.scores(query) == b.scores(query)
        assert a.search(query, 5) == b.search(query, 5)
        assert all(a.search(query, 5, group=g) == b.search(query, 5, group=g) for g in range(3))
    assert all(a.doc_freq(t) == b.doc_freq(t) for t in vocab)


# -- excerpts -----------------------------------------------------------------------------------------
class CharCounter:
    def count(self, text: str) -> int:
        return len(text)

    def count_messages(self, messages: list[dict]) -> int:
        return sum(len(m.get("content") or "") + 10 for m in messages)


def test_counted_excerpts_match_their_text():
    rng = random.Random(2)
    words = "disk nginx 磁盘 log error ok the cpu is at 93% on web-3".split()
    for counter in (C, CharCounter()):
        for _ in range(3000):
            user = " ".join(rng.choices(words, k=rng.randint(0, 40)))
            answer = " ".join(rng.choices(words, k=rng.randint(0, 120))) if rng.random() < 0.8 else ""
            doc = TurnDoc("s", 1, 2 if answer else None, "2026-03-04T05:06:07+00:00", user, answer)
            budget = rng.randint(1, 250)
            text, tokens = excerpt_and_tokens(doc, counter, budget)
            assert text == format_excerpt(doc, counter, budget) and tokens == counter.count(text)
