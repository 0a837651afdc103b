"""An incremental BM25 index in pure Python: add or remove documents one at a time, query top-k.

Documents are bags of terms with (possibly fractional) weights, so callers can weight fields
(e.g. a neighbouring turn at half weight). Postings are ``term -> {doc_id: tf}``; a query only
touches the postings of its own terms, which keeps it fast for tens of thousands of documents.
"""
from __future__ import annotations

import heapq
import math
from collections import Counter
from typing import Callable, Hashable, Iterable, Mapping

DEFAULT_K1 = 1.2
DEFAULT_B = 0.75


def as_bag(terms: Iterable[str] | Mapping[str, float]) -> dict[str, float]:
    """A term list becomes a term -> count bag; a mapping is copied as is."""
    if isinstance(terms, Mapping):
        return {t: float(w) for t, w in terms.items() if w > 0}
    return {t: float(n) for t, n in Counter(terms).items()}


class BM25Index:
    """Okapi BM25 over an incrementally built collection."""

    def __init__(self, k1: float = DEFAULT_K1, b: float = DEFAULT_B) -> None:
        self.k1 = k1
        self.b = b
        self._postings: dict[str, dict[Hashable, float]] = {}
        self._doc_terms: dict[Hashable, dict[str, float]] = {}
        self._doc_len: dict[Hashable, float] = {}
        self._total_len = 0.0
        self._seq: dict[Hashable, int] = {}
        self._next_seq = 0

    def __len__(self) -> int:
        return len(self._doc_len)

    def __contains__(self, doc_id: Hashable) -> bool:
        return doc_id in self._doc_len

    def add(self, doc_id: Hashable, terms: Iterable[str] | Mapping[str, float]) -> None:
        """Index one document (replacing any earlier version with the same id)."""
        if doc_id in self._doc_len:
            self.remove(doc_id)
        bag = as_bag(terms)
        for term, tf in bag.items():
            self._postings.setdefault(term, {})[doc_id] = tf
        length = sum(bag.values())
        self._doc_terms[doc_id] = bag
        self._doc_len[doc_id] = length
        self._total_len += length
        self._seq[doc_id] = self._next_seq
        self._next_seq += 1

    def remove(self, doc_id: Hashable) -> bool:
        """Drop one document; False if it was not indexed."""
        bag = self._doc_terms.pop(doc_id, None)
        if bag is None:
            return False
        for term in bag:
            plist = self._postings.get(term)
            if plist is not None:
                plist.pop(doc_id, None)
                if not plist:
                    del self._postings[term]
        self._total_len -= self._doc_len.pop(doc_id)
        del self._seq[doc_id]
        return True

    def terms_of(self, doc_id: Hashable) -> dict[str, float]:
        """The indexed term bag of a document (empty if unknown)."""
        return self._doc_terms.get(doc_id, {})

    def doc_freq(self, term: str) -> int:
        return len(self._postings.get(term, ()))

    def scores(self, query: Iterable[str] | Mapping[str, float],
               accept: Callable[[Hashable], bool] | None = None) -> dict[Hashable, float]:
        """Score every document sharing a term with the query (query term weights multiply)."""
        n = len(self._doc_len)
        if n == 0:
            return {}
        avgdl = (self._total_len / n) or 1.0
        k1, b = self.k1, self.b
        doc_len = self._doc_len
        out: dict[Hashable, float] = {}
        for term, qw in as_bag(query).items():
            plist = self._postings.get(term)
            if not plist:
                continue
            df = len(plist)
            weight = qw * math.log(1.0 + (n - df + 0.5) / (df + 0.5))
            for doc_id, tf in plist.items():
                if accept is not None and not accept(doc_id):
                    continue
                norm = k1 * (1.0 - b + b * doc_len[doc_id] / avgdl)
                out[doc_id] = out.get(doc_id, 0.0) + weight * tf * (k1 + 1.0) / (tf + norm)
        return out

    def search(self, query: Iterable[str] | Mapping[str, float], k: int,
               accept: Callable[[Hashable], bool] | None = None) -> list[tuple[Hashable, float]]:
        """The top ``k`` (doc_id, score) pairs, best first; ties go to the newer document."""
        if k <= 0:
            return []
        seq = self._seq
        return heapq.nlargest(k, self.scores(query, accept).items(), key=lambda kv: (kv[1], seq[kv[0]]))
