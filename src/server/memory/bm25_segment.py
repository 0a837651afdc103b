"""The sealed part of a BM25 index: immutable numpy segments for collections of millions of
documents (``BM25Index.seal`` / ``add_sealed`` build them; the index merges them in tiers)."""
from __future__ import annotations

from array import array
from typing import Container, Hashable

import numpy as np

ALL = object()       # ``group`` value meaning every group
SLACK = 1e-9         # relative margin on pruning bounds (float rounding of sums in another order)

class Segment:
    """An immutable block of documents in numpy arrays, for collections of millions of documents.

    Built from documents sealed out of a ``BM25Index`` (``seal``, ``add_sealed``) or by merging
    segments. Postings are term-major CSR arrays (doc numbers ascending within a term); the same
    data doc-major backs ``terms_of`` and removal. Term frequencies are stored as float32 (exact
    for counts and for weights like 0.5; other weights round to 24 bits), lengths as float64. Removal only clears an ``alive`` flag (the index adjusts its
    statistics, and drops or rebuilds a segment left mostly dead); merging drops dead documents
    and the terms only they had.
    """

    def __init__(self, ids: list[Hashable], groups: list[Hashable], seq: np.ndarray, vocab: list[str],
                 doc_ptr: np.ndarray, doc_term: np.ndarray, doc_tf: np.ndarray, length: np.ndarray) -> None:
        n = len(ids)
        self.ids = ids
        self.pos = {d: i for i, d in enumerate(ids)}
        self.groups = groups
        codes: dict[Hashable, int] = {}
        self.group = np.fromiter((codes.setdefault(g, len(codes)) for g in groups), np.int32, n)
        self.codes = codes
        self.seq = seq
        self.vocab = vocab
        self.term_id = {t: j for j, t in enumerate(vocab)}
        self.doc_ptr, self.doc_term, self.doc_tf = doc_ptr, doc_term, doc_tf
        doc_of = np.repeat(np.arange(n, dtype=np.int32), np.diff(doc_ptr))
        self.length = length                      # as the dict index summed each bag (same floats)
        order = np.argsort(doc_term, kind="stable")        # term-major, doc numbers stay ascending
        self.post_doc = doc_of[order]
        self.post_tf = doc_tf[order]
        self.post_ptr = np.zeros(len(vocab) + 1, np.int64)
        np.cumsum(np.bincount(doc_term, minlength=len(vocab)), out=self.post_ptr[1:])
        self.tf_max = np.zeros(len(vocab), np.float32)
        nonempty = np.diff(self.post_ptr) > 0
        if nonempty.any():
            self.tf_max[nonempty] = np.maximum.reduceat(self.post_tf, self.post_ptr[:-1][nonempty])
        self.min_len = float(self.length.min()) if n else 0.0
        self.alive = np.ones(n, bool)
        self.n_alive = n

    @classmethod
    def build(cls, docs: list[tuple[Hashable, dict[str, float], Hashable, int]]) -> Segment:
        """From (doc_id, bag, group, seq) tuples."""
        vocab: dict[str, int] = {}
        ptr = array("q", [0])
        terms = array("i")
        tfs = array("f")
        setdefault = vocab.setdefault
        for _, bag, _, _ in docs:
            terms.extend([setdefault(t, len(vocab)) for t in bag])
            tfs.extend(bag.values())
            ptr.append(len(terms))
        return cls([d[0] for d in docs], [d[2] for d in docs], np.array([d[3] for d in docs], np.int64),
                   list(vocab), np.frombuffer(ptr, np.int64), np.frombuffer(terms, np.int32),
                   np.frombuffer(tfs, np.float32), np.array([sum(d[1].values()) for d in docs], np.float64))

    @classmethod
    def merge(cls, parts: list[Segment]) -> Segment:
        """The live documents of ``parts`` in one segment, with only the terms they hold (vectorized:
        no per-posting Python work; one merged part is a rebuild without its dead documents)."""
        vocab: dict[str, int] = {}
        ids: list[Hashable] = []
        groups: list[Hashable] = []
        seqs, ptrs, terms, tfs, lengths = [], [], [], [], []
        base = 0
        for seg in parts:
            live = np.flatnonzero(seg.alive)
            lens = np.diff(seg.doc_ptr)[live]
            starts = seg.doc_ptr[live]
            idx = np.repeat(starts - np.concatenate(([0], np.cumsum(lens)[:-1])), lens) + np.arange(lens.sum())
            local = seg.doc_term[idx]
            if seg.n_alive == len(seg.ids):
                used = range(len(seg.vocab))                  # (every term of a segment is some document's)
            else:
                mark = np.zeros(len(seg.vocab), bool)
                mark[local] = True
                used = np.flatnonzero(mark).tolist()
            remap = np.zeros(len(seg.vocab), np.int64)
            remap[used] = [vocab.setdefault(seg.vocab[j], len(vocab)) for j in used]
            terms.append(remap[local])
            tfs.append(seg.doc_tf[idx])
            ptrs.append(base + np.cumsum(lens))
            base += int(lens.sum())
            ids.extend(seg.ids[i] for i in live)
            groups.extend(seg.groups[i] for i in live)
            seqs.append(seg.seq[live])
            lengths.append(seg.length[live])
        return cls(ids, groups, np.concatenate(seqs) if seqs else np.zeros(0, np.int64), list(vocab),
                   np.concatenate([np.zeros(1, np.int64)] + ptrs),
                   np.concatenate(terms).astype(np.int32) if terms else np.zeros(0, np.int32),
                   np.concatenate(tfs) if tfs else np.zeros(0, np.float32),
                   np.concatenate(lengths) if lengths else np.zeros(0))

    def bag(self, i: int) -> dict[str, float]:
        s, e = self.doc_ptr[i], self.doc_ptr[i + 1]
        return {self.vocab[j]: float(tf) for j, tf in zip(self.doc_term[s:e], self.doc_tf[s:e])}

    def kill(self, i: int) -> None:
        self.alive[i] = False
        self.n_alive -= 1

    def top(self, query: list[tuple[str, float]], k: int, group: Hashable, skip: Container[Hashable],
            k1: float, b: float, avgdl: float) -> list[tuple[Hashable, float, int]]:
        """The best ``k`` live documents (of ``group`` unless ALL) as (doc_id, score, seq).

        Max-score pruning, vectorized: terms by decreasing upper bound; once the bounds of the
        terms left cannot lift an unscored document into the top ``k``, the remaining terms are
        only looked up (binary search) for the candidates still in reach.
        """
        n = len(self.ids)
        if group is ALL:
            valid = self.alive
        else:
            code = self.codes.get(group)
            if code is None:
                return []
            valid = self.alive & (self.group == code)
        if skip:
            hidden = [i for i in (self.pos.get(d) for d in skip) if i is not None]
            if hidden:
                valid = valid.copy()
                valid[hidden] = False
        base, per_len = k1 * (1.0 - b), k1 * b / avgdl
        norm_min = base + per_len * self.min_len
        entries = []
        for term, w in query:
            j = self.term_id.get(term)
            if j is None:
                continue
            tfm = self.tf_max[j]
            entries.append((w * tfm * (k1 + 1.0) / (tfm + norm_min) * (1.0 + SLACK), w * (k1 + 1.0),
                            int(self.post_ptr[j]), int(self.post_ptr[j + 1])))
        if not entries:
            return []
        entries.sort(key=lambda e: -e[0])
        rest = np.cumsum([e[0] for e in entries][::-1])[::-1].tolist() + [0.0]
        scores = np.zeros(n)
        cands: np.ndarray | None = None
        for j, (_, wk, s, e) in enumerate(entries):
            # theta (the k-th best so far) costs O(n): only worth it before a long posting list
            if cands is None and j and (e - s) * 4 > n and rest[j] < scores.max():
                top = np.partition(np.where(valid, scores, -1.0), n - k)[n - k] if n > k else -1.0
                theta = top * (1.0 - SLACK)
                if theta > 0 and rest[j] < theta:
                    cands = np.flatnonzero(valid & (scores + rest[j] >= theta))
            d, tf = self.post_doc[s:e], self.post_tf[s:e].astype(np.float64)
            if cands is None:
                scores[d] += wk * tf / (tf + base + per_len * self.length[d])
            elif len(cands):
                at = np.searchsorted(d, cands)
                at[at == len(d)] = 0
                hit = cands[d[at] == cands] if len(d) else cands[:0]
                tfh = tf[np.searchsorted(d, hit)]
                scores[hit] += wk * tfh / (tfh + base + per_len * self.length[hit])
        pool = np.flatnonzero(valid & (scores > 0)) if cands is None else cands[scores[cands] > 0]
        if len(pool) > k:                         # the k best and whatever ties with the k-th
            kth = np.partition(scores[pool], len(pool) - k)[len(pool) - k]
            pool = pool[scores[pool] >= kth * (1.0 - SLACK)]
        return [(self.ids[i], self._exact(int(i), query, k1, b, avgdl), int(self.seq[i])) for i in pool]

    def _exact(self, i: int, query: list[tuple[str, float]], k1: float, b: float, avgdl: float) -> float:
        """The score of document ``i`` summed exactly as ``BM25Index.scores`` does (query order)."""
        s, e = self.doc_ptr[i], self.doc_ptr[i + 1]
        bag = dict(zip(self.doc_term[s:e].tolist(), self.doc_tf[s:e].tolist()))
        norm = k1 * (1.0 - b + b * float(self.length[i]) / avgdl)
        total = 0.0
        for term, weight in query:
            tf = bag.get(self.term_id.get(term, -1))
            if tf is not None:
                total = total + weight * tf * (k1 + 1.0) / (tf + norm)
        return total

    def all_scores(self, query: list[tuple[str, float]], k1: float, b: float, avgdl: float,
                   group: Hashable) -> dict[Hashable, float]:
        """Every live document sharing a term with the query (of ``group`` unless ALL)."""
        pairs = self.top(query, len(self.ids) or 1, group, (), k1, b, avgdl) if self.ids else []
        return {d: s for d, s, _ in pairs}
