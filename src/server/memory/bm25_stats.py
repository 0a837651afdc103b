"""The collection statistics of a BM25 index (``BM25Index`` owns one ``CorpusStats``): document
count, total length and document frequencies, collection-wide and, with ``by_group``, per group;
``Stats`` is the view of some groups that a search scores with. The index reports every document
and term it adds or drops (dict documents one by one, sealed ones a segment at a time, a dropped
group's terms one count per distinct term).
"""
from __future__ import annotations

import sys
from typing import Callable, Hashable, Iterable

import numpy as np

from server.memory.bm25_segment import Segment

SPARSE_DICT = 160    # bytes per entry above which an emptied term dictionary is re-packed (a full one: <= ~40)


class Stats:
    """The collection statistics of some groups (``BM25Index.stats``): their document count, total
    length and document frequencies, summed over the groups at query time."""

    __slots__ = ("n", "total_len", "_dfs")

    def __init__(self, n: int, total_len: float, dfs: list[dict[str, int]]) -> None:
        self.n = n
        self.total_len = total_len
        self._dfs = dfs

    def df(self, term: str) -> int:
        total = 0
        for df in self._dfs:
            total += df.get(term, 0)
        return total

    def get(self, term: str, default: int = 0) -> int:
        """``df`` with the signature of ``dict.get`` (what the index looks document frequencies up with)."""
        return self.df(term) or default


def _raise(df: dict[str, int], vocab: list[str], counts: np.ndarray) -> None:
    """Each ``vocab[j]`` in ``counts[j]`` more documents in ``df``."""
    get = df.get
    for term, c in zip(vocab, counts.tolist()):
        if c:
            df[term] = get(term, 0) + c


def _lower(df: dict[str, int], vocab: list[str], term_ids: np.ndarray) -> None:
    """Each of ``vocab[term_ids]`` (one per document that had it) one document fewer in ``df``."""
    ids, counts = np.unique(term_ids, return_counts=True)
    for j, c in zip(ids.tolist(), counts.tolist()):
        term = vocab[j]
        left = df[term] - c
        if left:
            df[term] = left
        else:
            del df[term]


def _drop(df: dict[str, int], term: str) -> None:
    left = df[term] - 1
    if left:
        df[term] = left
    else:
        del df[term]


def _repack(df: dict[str, int]) -> dict[str, int]:
    """``df``, or a re-packed copy when its table is mostly empty (a dict never shrinks it on deletion)."""
    return dict(df) if sys.getsizeof(df) > SPARSE_DICT * (len(df) + 64) else df


class CorpusStats:
    """Document count, total length and document frequencies of an index's live documents, and
    with ``by_group`` the same per group (an emptied group is forgotten: it starts again from 0)."""

    def __init__(self, by_group: bool = False) -> None:
        self.by_group = by_group
        self.n = 0
        self.total_len = 0.0
        self.df: dict[str, int] = {}
        self._group_size: dict[Hashable, int] = {}
        self._gdf: dict[Hashable, dict[str, int]] = {}          # group -> term -> df (with by_group)
        self._glen: dict[Hashable, float] = {}                  # group -> total length (with by_group)

    def group_size(self, group: Hashable) -> int:
        return self._group_size.get(group, 0)

    # -- documents -------------------------------------------------------------------------------
    def add_doc(self, group: Hashable, length: float) -> None:
        """One more document of ``group`` (its terms are counted by ``add_term``/``add_segment``)."""
        self.n += 1
        self._group_size[group] = self._group_size.get(group, 0) + 1
        self.total_len += length
        if self.by_group:
            self._glen[group] = self._glen.get(group, 0.0) + length
            self._gdf.setdefault(group, {})          # (a document without terms counts no term)

    def resize_doc(self, group: Hashable, old: float, new: float) -> None:
        """A document of ``group`` re-added: its length ``old`` became ``new``."""
        self.total_len -= old
        self.total_len += new
        if self.by_group:
            self._glen[group] -= old
            self._glen[group] += new

    def drop_doc(self, group: Hashable, length: float) -> bool:
        """One document of ``group`` (of ``length``) is gone; False if it was the group's last."""
        self.n -= 1
        self.total_len -= length
        left = self._group_size[group] - 1
        if left:
            self._group_size[group] = left
            if self.by_group:
                self._glen[group] -= length
            return True
        del self._group_size[group]
        if self.by_group:                      # an empty group starts again from exactly 0
            del self._glen[group]
            del self._gdf[group]
        return False

    # -- document frequencies ----------------------------------------------------------------------
    def add_term(self, term: str, group: Hashable) -> None:
        """One more document of ``group`` has ``term``."""
        self.df[term] = self.df.get(term, 0) + 1
        if self.by_group:
            gdf = self._gdf.setdefault(group, {})
            gdf[term] = gdf.get(term, 0) + 1

    def drop_term(self, term: str, group: Hashable) -> None:
        """One document of ``group`` fewer has ``term``."""
        _drop(self.df, term)
        if self.by_group:
            _drop(self._gdf[group], term)

    def lower(self, term: str, count: int) -> None:
        """``count`` documents fewer have ``term``, collection-wide only: those of a whole group
        leaving the index (``BM25Index.drop_group``), whose own frequencies go with its last
        document (``drop_doc``)."""
        left = self.df[term] - count
        if left:
            self.df[term] = left
        else:
            del self.df[term]

    def add_segment(self, seg: Segment) -> None:
        """The terms of a new segment's documents (once per distinct term of each group)."""
        n_terms = len(seg.vocab)
        _raise(self.df, seg.vocab, np.bincount(seg.doc_term, minlength=n_terms))
        if self.by_group:
            per_doc = np.diff(seg.doc_ptr)
            for group, code in seg.codes.items():
                mine = seg.doc_term if len(seg.codes) == 1 else seg.doc_term[np.repeat(seg.group == code, per_doc)]
                _raise(self._gdf.setdefault(group, {}), seg.vocab, np.bincount(mine, minlength=n_terms))

    def drop_rows(self, seg: Segment, rows: list[int]) -> None:
        """The terms of the documents ``rows`` of ``seg`` (lowered once per distinct term:
        ``np.unique``; a document's chunks share most terms). Their counts and lengths go by
        ``drop_doc``."""
        at = np.asarray(rows, np.int64)
        starts = seg.doc_ptr[at]
        lens = seg.doc_ptr[at + 1] - starts
        idx = np.repeat(starts - np.concatenate(([0], np.cumsum(lens)[:-1])), lens) + np.arange(lens.sum())
        term_ids = seg.doc_term[idx]
        _lower(self.df, seg.vocab, term_ids)
        if self.by_group:
            codes = seg.group[at]
            for code in np.unique(codes).tolist():
                mine = codes == code
                group = seg.groups[rows[int(np.argmax(mine))]]
                _lower(self._gdf[group], seg.vocab, term_ids[np.repeat(mine, lens)])

    def repack(self, groups: Iterable[Hashable] = ()) -> None:
        """Re-pack the document-frequency dicts (collection-wide, and of ``groups``) left mostly
        empty by removals."""
        for group in groups:
            gdf = self._gdf.get(group)
            if gdf is not None:
                self._gdf[group] = _repack(gdf)
        self.df = _repack(self.df)

    # -- views -------------------------------------------------------------------------------------
    def of(self, groups: Iterable[Hashable]) -> Stats:
        """The statistics of ``groups`` only (summed in the order given; needs ``by_group``)."""
        if not self.by_group:
            raise ValueError("BM25Index(group_stats=True) keeps per-group statistics")
        n, total, dfs = 0, 0.0, []
        for g in dict.fromkeys(groups):
            size = self._group_size.get(g)
            if size:
                n += size
                total += self._glen[g]
                dfs.append(self._gdf[g])
        return Stats(n, total, dfs)

    def view(self, stats: Stats | None) -> tuple[int, float, Callable[..., int | None]]:
        """(document count, total length, df lookup) of ``stats``, or of the whole collection."""
        if stats is None:
            return self.n, self.total_len, self.df.get
        return stats.n, stats.total_len, stats.get
