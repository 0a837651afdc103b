"""An incremental BM25 index in pure Python: add or remove documents one at a time, query top-k.

Documents are bags of terms with (possibly fractional) weights, so callers can weight fields
(e.g. a neighbouring turn at half weight). Postings are ``term -> {group: {doc_id: tf}}``; a query
only touches the postings of its own terms (and of one group when restricted), which keeps it fast
for tens of thousands of documents. Large collections seal documents into numpy segments
(``bm25_segment.Segment``). The collection statistics live in a ``bm25_stats.CorpusStats``; with
``group_stats`` it also keeps each group's (document count, document frequencies, total length),
so a search can score with those of some groups only (``stats``): what the knowledge base needs to
keep users' collections from showing through each other's scores. A whole group leaves in
bounded steps (``drop_group``: one posting-list entry per distinct term of the group, not one per
document and term), hidden from searches from the start.
"""
from __future__ import annotations

import heapq
import math
from collections import Counter
from typing import Callable, Container, Hashable, Iterable, Mapping

from server.memory.bm25_segment import ALL, SLACK, Segment
from server.memory.bm25_stats import CorpusStats, Stats

DEFAULT_K1 = 1.2
DEFAULT_B = 0.75


def as_bag(terms: Iterable[str] | Mapping[str, float]) -> dict[str, float]:
    """A term list becomes a term -> count bag; a mapping is copied as is."""
    if isinstance(terms, Mapping):
        return {t: float(w) for t, w in terms.items() if w > 0}
    return {t: float(n) for t, n in Counter(terms).items()}


MAX_SEGMENTS = 16    # more sealed segments than this are merged


class BM25Index:
    """Okapi BM25 over an incrementally built collection.

    Each document may belong to a ``group`` (e.g. a chat session): postings are kept per group, so
    a query restricted to one group only walks that group's postings, while the collection
    statistics (document count, document frequencies, average length) stay collection-wide --
    a group-restricted search scores exactly as a filtered search over everything would.

    ``group_stats``: the statistics are also kept per group, and ``search``/``scores`` given
    ``stats=index.stats(groups)`` score with those groups' statistics only -- exactly as an index
    holding only those groups' documents would (documents of other groups change nothing).
    """

    def __init__(self, k1: float = DEFAULT_K1, b: float = DEFAULT_B, seal_at: int | None = None, *,
                 group_stats: bool = False) -> None:
        self.k1 = k1
        self.b = b
        self.seal_at = seal_at                 # seal the dict part into a numpy Segment at this size
        self._stats = CorpusStats(group_stats)
        self._segments: list[Segment] = []
        self._postings: dict[str, dict[Hashable, dict[Hashable, float]]] = {}   # term -> group -> doc -> tf
        self._doc_terms: dict[Hashable, dict[str, float]] = {}
        self._doc_len: dict[Hashable, float] = {}
        self._group: dict[Hashable, Hashable] = {}
        self._tf_max: dict[str, dict[Hashable, float]] = {}    # term -> group -> highest tf (never lowered)
        self._min_len: dict[Hashable, float] = {}               # group -> shortest length (never raised)
        self._seq: dict[Hashable, int] = {}
        self._next_seq = 0
        self._dropping: dict[Hashable, GroupDrop] = {}         # group -> its drop still under way

    @property
    def group_stats(self) -> bool:
        return self._stats.by_group

    def __len__(self) -> int:
        return self._stats.n - sum(len(d.lengths) for d in self._dropping.values())

    def __contains__(self, doc_id: Hashable) -> bool:
        return doc_id in self._doc_len or self._sealed(doc_id) is not None

    def _sealed(self, doc_id: Hashable) -> tuple[Segment, int] | None:
        for seg in self._segments:
            i = seg.pos.get(doc_id)
            if i is not None and seg.alive[i]:
                return seg, i
        return None

    # -- sealed segments (large collections) ----------------------------------------------------------
    def seal(self) -> None:
        """Move the documents of the dict part into an immutable numpy ``Segment`` (same scores,
        far less memory, vectorized queries); merge the segments when there are too many."""
        self._finish_drops()
        if self._doc_terms:
            docs = sorted(((d, bag, self._group[d], self._seq[d]) for d, bag in self._doc_terms.items()),
                          key=lambda x: x[3])
            self._segments.append(Segment.build(docs))
            self._postings, self._doc_terms, self._doc_len, self._group = {}, {}, {}, {}
            self._tf_max, self._min_len, self._seq = {}, {}, {}
        self._tier()

    def add_sealed(self, docs: Iterable[tuple[Hashable, Iterable[str] | Mapping[str, float], Hashable]]) -> None:
        """Index (doc_id, terms, group) documents straight into a new sealed segment (bulk ingest:
        several times faster than ``add`` one by one); an id already indexed is replaced."""
        self._finish_drops()
        items = []
        touched: list = []
        for doc_id, terms, group in docs:
            if doc_id in self:
                self._remove((doc_id,), touched)
            bag = as_bag(terms)
            items.append((doc_id, bag, group, self._next_seq))
            self._next_seq += 1
            self._stats.add_doc(group, sum(bag.values()))
        self._reclaim(touched)
        if items:
            seg = Segment.build(items)
            while items:       # the bags one by one: freed at once they hold the GIL for long (a worker
                items.pop()    # thread's commit of a large document stalled the event loop ~0.1 s)
            self._stats.add_segment(seg)
            self._segments.append(seg)
            self._tier()

    def _tier(self) -> None:
        """Merge the newest segments while the last is at least half the size of the one before
        (a binary counter: O(log n) segments, each document merged O(log n) times)."""
        segs = self._segments
        while len(segs) >= 2 and (segs[-1].n_alive * 2 >= segs[-2].n_alive or len(segs) > MAX_SEGMENTS):
            segs[-2:] = [Segment.merge(segs[-2:])]

    def compact(self) -> None:
        """Everything in one segment (after a bulk load)."""
        self.seal()
        if len(self._segments) > 1 or (self._segments and self._segments[0].n_alive < len(self._segments[0].ids)):
            self._segments = [Segment.merge(self._segments)]

    def add(self, doc_id: Hashable, terms: Iterable[str] | Mapping[str, float], group: Hashable = None,
            *, owned: bool = False) -> None:
        """Index one document (replacing any earlier version with the same id; only the terms
        that changed are touched, and the document counts as newly added for ties). ``owned``:
        ``terms`` is a dict of positive float weights that the caller hands over (kept, not copied;
        the caller must not change it afterwards)."""
        if self._dropping and group in self._dropping:      # (its old postings must go first)
            self._dropping[group].finish()
        if self._segments and self._sealed(doc_id) is not None:
            self.remove(doc_id)
        old = self._doc_terms.get(doc_id)
        if old is not None and self._group[doc_id] != group:
            self.remove(doc_id)
            old = None
        bag = terms if owned else as_bag(terms)   # type: ignore[assignment]
        if old is None:
            for term, tf in bag.items():
                self._post(term, tf, doc_id, group)
            self._group[doc_id] = group
        else:
            for term, tf in bag.items():
                prev = old.get(term)
                if prev is None:
                    self._post(term, tf, doc_id, group)
                elif prev != tf:
                    self._postings[term][group][doc_id] = tf
                    top = self._tf_max[term]
                    if tf > top[group]:
                        top[group] = tf
            for term in old:
                if term not in bag:
                    self._unpost(term, doc_id, group)
        length = sum(bag.values())
        if old is None:
            self._stats.add_doc(group, length)
        else:
            self._stats.resize_doc(group, self._doc_len[doc_id], length)
        if length < self._min_len.get(group, math.inf):
            self._min_len[group] = length
        self._doc_terms[doc_id] = bag
        self._doc_len[doc_id] = length
        self._seq[doc_id] = self._next_seq
        self._next_seq += 1
        if self.seal_at is not None and len(self._doc_len) >= self.seal_at:
            self.seal()

    def _post(self, term: str, tf: float, doc_id: Hashable, group: Hashable) -> None:
        groups = self._postings.get(term)
        if groups is None:
            groups = self._postings[term] = {}
            self._tf_max[term] = {}
        plist = groups.get(group)
        if plist is None:
            plist = groups[group] = {}
        plist[doc_id] = tf
        self._stats.add_term(term, group)
        top = self._tf_max[term]
        if tf > top.get(group, 0.0):
            top[group] = tf

    def _unpost(self, term: str, doc_id: Hashable, group: Hashable) -> None:
        groups = self._postings.get(term)
        plist = groups.get(group) if groups is not None else None
        if plist is not None and plist.pop(doc_id, None) is not None:
            self._stats.drop_term(term, group)
            if not plist:
                del groups[group]
                del self._tf_max[term][group]
                if not groups:
                    del self._postings[term]
                    del self._tf_max[term]

    def _forget(self, group: Hashable, length: float, touched: list) -> None:
        """One document of ``group`` (of ``length``) is gone from the statistics; an emptied group
        loses its pruning bound, one left with documents is ``touched`` (with ``group_stats``)."""
        if not self._stats.drop_doc(group, length):
            self._min_len.pop(group, None)
        elif self.group_stats and group not in touched:
            touched.append(group)

    def remove(self, doc_id: Hashable) -> bool:
        """Drop one document; False if it was not indexed. A sealed segment left without live
        documents is dropped at once, one left more than half dead is rebuilt (``_reclaim``)."""
        return self.remove_many((doc_id,)) == 1

    def remove_many(self, doc_ids: Iterable[Hashable]) -> int:
        """Drop several documents (each segment is reclaimed once, after all); how many were indexed."""
        touched: list = []
        removed = self._remove(doc_ids, touched)
        self._reclaim(touched)
        return removed

    def _remove(self, doc_ids: Iterable[Hashable], touched: list) -> int:
        """``remove_many`` without the reclaim; the segments and groups that lost documents are
        added to ``touched``."""
        removed = 0
        sealed: list[tuple[Segment, int]] = []
        for doc_id in doc_ids:
            bag = self._doc_terms.pop(doc_id, None)
            if bag is None:
                found = self._sealed(doc_id) if self._segments else None
                if found is not None:
                    found[0].kill(found[1])          # (a repeated id is no longer found)
                    sealed.append(found)
                    removed += 1
                continue
            group = self._group.pop(doc_id)
            for term in bag:
                self._unpost(term, doc_id, group)
            self._forget(group, self._doc_len.pop(doc_id), touched)
            del self._seq[doc_id]
            removed += 1
        if sealed:
            self._unstat_sealed(sealed, touched)
        return removed

    def drop_group(self, group: Hashable, doc_ids: Iterable[Hashable]) -> GroupDrop:
        """Remove ``doc_ids``, every document of ``group``, in bounded steps: the call only takes the
        documents out (one dict pop each), so searches no longer see them (nor the group), and the
        returned ``GroupDrop``'s ``step``s then drop the group's postings, one entry per distinct
        term. Adding to the group again first finishes the drop. When the ids are not all of the
        group's documents in the dict part (or the index has sealed segments), they are removed at
        once (``remove_many``) and the drop returned is done."""
        ids = [d for d in dict.fromkeys(doc_ids) if d in self._doc_terms]
        if not ids or self._segments or group in self._dropping or len(ids) != self._stats.group_size(group) \
                or any(self._group[d] != group for d in ids):
            self.remove_many(doc_ids)
            return self._dropping.get(group) or GroupDrop(self, group, [], [])
        bags = [self._doc_terms.pop(d) for d in ids]
        lengths = [self._doc_len.pop(d) for d in ids]
        for d in ids:
            del self._group[d], self._seq[d]
        self._min_len.pop(group, None)         # (a group search without it finds nothing)
        drop = self._dropping[group] = GroupDrop(self, group, bags, lengths)
        return drop

    def dropping(self, group: Hashable) -> GroupDrop | None:
        """The drop of ``group`` still under way, if any."""
        return self._dropping.get(group)

    def _finish_drops(self) -> None:
        for drop in list(self._dropping.values()):
            drop.finish()

    def _unstat_sealed(self, sealed: list[tuple[Segment, int]], touched: list) -> None:
        """The statistics without the (killed) sealed documents ``sealed``: their terms segment by
        segment (``CorpusStats.drop_rows``), then their counts and lengths document by document, in
        order."""
        rows_of: dict[int, tuple[Segment, list[int]]] = {}
        for seg, i in sealed:
            rows_of.setdefault(id(seg), (seg, []))[1].append(i)
        for seg, rows in rows_of.values():
            self._stats.drop_rows(seg, rows)
            if seg not in touched:
                touched.append(seg)
        for seg, i in sealed:
            self._forget(seg.groups[i], float(seg.length[i]), touched)

    def _reclaim(self, touched: list) -> None:
        """Give back the memory of removed sealed documents now rather than at a later merge: a
        segment without live documents is dropped, one more than half dead is rebuilt from its live
        documents (only their terms stay in its term dictionary). Amortized: a rebuild follows the
        removal of at least half of the documents it had when built. Document-frequency dicts left
        mostly empty are re-packed (``CorpusStats.repack``). ``touched``: the segments and (with
        ``group_stats``) the groups that lost documents."""
        if not touched:
            return
        for seg in touched:
            if not isinstance(seg, Segment):
                continue
            at = next((j for j, s in enumerate(self._segments) if s is seg), None)
            if at is None:
                continue
            if not seg.n_alive:
                del self._segments[at]
            elif seg.n_alive * 2 < len(seg.ids):
                self._segments[at] = Segment.merge([seg])
        self._stats.repack(g for g in touched if not isinstance(g, Segment))

    def terms_of(self, doc_id: Hashable) -> dict[str, float]:
        """The indexed term bag of a document (empty if unknown)."""
        bag = self._doc_terms.get(doc_id)
        if bag is None and self._segments:
            found = self._sealed(doc_id)
            bag = found[0].bag(found[1]) if found else None
        return bag if bag is not None else {}

    def doc_freq(self, term: str) -> int:
        return self._stats.df.get(term, 0)

    def stats(self, groups: Iterable[Hashable]) -> Stats:
        """The statistics of ``groups`` only (summed in the order given; needs ``group_stats``), for
        ``search``/``scores``: scores with them do not depend on any other group's documents."""
        if self._dropping:
            groups = [g for g in groups if g not in self._dropping]
        return self._stats.of(groups)

    def group_size(self, group: Hashable) -> int:
        """Documents in ``group``."""
        return 0 if group in self._dropping else self._stats.group_size(group)

    def scores(self, query: Iterable[str] | Mapping[str, float],
               accept: Callable[[Hashable], bool] | None = None, *, group: Hashable = ALL,
               skip: Container[Hashable] = (), stats: Stats | None = None) -> dict[Hashable, float]:
        """Score every document sharing a term with the query (query term weights multiply).

        Only documents of ``group`` (default: all), not in ``skip`` and accepted by ``accept`` count;
        with the statistics of ``stats`` (``stats(groups)``; default: the whole index).
        """
        return self._scores(query, accept, group, skip, sealed=True, stats=stats)

    def _scores(self, query: Iterable[str] | Mapping[str, float], accept: Callable[[Hashable], bool] | None,
                group: Hashable, skip: Container[Hashable], sealed: bool,
                stats: Stats | None = None) -> dict[Hashable, float]:
        """``scores``, of the dict part only unless ``sealed``."""
        n, total_len, df_of = self._stats.view(stats)
        if n == 0:
            return {}
        avgdl = (total_len / n) or 1.0
        k1, b = self.k1, self.b
        doc_len = self._doc_len
        out: dict[Hashable, float] = {}
        if sealed and self._segments:
            qlist = self._weighted(as_bag(query), n, df_of)
            for seg in self._segments:
                for d, v in seg.all_scores(qlist, k1, b, avgdl, group).items():
                    if d not in skip and (accept is None or accept(d)):
                        out[d] = v
        get = out.get
        dropping = self._dropping                # (groups being dropped: hidden, their postings stale)
        for term, qw in as_bag(query).items():
            groups = self._postings.get(term)
            if not groups:
                continue
            if group is ALL:
                plists: Iterable[dict[Hashable, float]] = \
                    groups.values() if not dropping else [p for g, p in groups.items() if g not in dropping]
            else:
                one = groups.get(group)
                if one is None or group in dropping:
                    continue
                plists = (one,)
            df = df_of(term)
            if not df:                        # (only with ``stats``: no document of those groups has it)
                continue
            weight = qw * math.log(1.0 + (n - df + 0.5) / (df + 0.5))
            for plist in plists:
                for doc_id, tf in plist.items():
                    if doc_id in skip or (accept is not None and not accept(doc_id)):
                        continue
                    norm = k1 * (1.0 - b + b * doc_len[doc_id] / avgdl)
                    out[doc_id] = get(doc_id, 0.0) + weight * tf * (k1 + 1.0) / (tf + norm)
        return out

    def search(self, query: Iterable[str] | Mapping[str, float], k: int,
               accept: Callable[[Hashable], bool] | None = None, *, group: Hashable = ALL,
               skip: Container[Hashable] = (), stats: Stats | None = None) -> list[tuple[Hashable, float]]:
        """The top ``k`` (doc_id, score) pairs, best first; ties go to the newer document.

        Restricted to one group without ``accept``, the search prunes (see ``_top_in_group``):
        same result, much less work when common terms meet a few rare ones. ``stats``: score with
        the statistics of some groups only (``stats(groups)``; default: the whole index).
        """
        if k <= 0:
            return []
        seq = self._seq
        if not self._segments:
            if group is not ALL and accept is None:
                scored = self._top_in_group(as_bag(query), k, group, skip, stats)
            else:
                scored = self.scores(query, accept, group=group, skip=skip, stats=stats)
            return heapq.nlargest(k, scored.items(), key=lambda kv: (kv[1], seq[kv[0]]))
        if accept is not None:
            scored = self.scores(query, accept, group=group, skip=skip, stats=stats)
            order = {d: self._seq_of(d) for d in scored}
            return heapq.nlargest(k, scored.items(), key=lambda kv: (kv[1], order[kv[0]]))
        bag = as_bag(query)
        n, total_len, df_of = self._stats.view(stats)
        avgdl = ((total_len / n) or 1.0) if n else 1.0
        qlist = self._weighted(bag, n, df_of)
        pool = [(d, v, seq[d]) for d, v in (self._top_in_group(bag, k, group, skip, stats) if group is not ALL
                                             else self._dict_scores(bag, skip, stats)).items()]
        for seg in self._segments:
            pool.extend(seg.top(qlist, k, group, skip, self.k1, self.b, avgdl))
        return [(d, v) for d, v, _ in heapq.nlargest(k, pool, key=lambda x: (x[1], x[2]))]

    def _dict_scores(self, bag: dict[str, float], skip: Container[Hashable],
                     stats: Stats | None = None) -> dict[Hashable, float]:
        """Scores of the dict part's documents only (the segments score theirs)."""
        return self._scores(bag, None, ALL, skip, sealed=False, stats=stats)

    def _weighted(self, bag: dict[str, float], n: int,
                  df_of: Callable[..., int | None] | None = None) -> list[tuple[str, float]]:
        """Query terms with their idf-weighted query weights (collection-wide statistics, or the
        document frequencies ``df_of`` gives)."""
        out = []
        get = self._stats.df.get if df_of is None else df_of
        for term, qw in bag.items():
            df = get(term)
            if df:
                out.append((term, qw * math.log(1.0 + (n - df + 0.5) / (df + 0.5))))
        return out

    def _seq_of(self, doc_id: Hashable) -> int:
        s = self._seq.get(doc_id)
        if s is None:
            seg, i = self._sealed(doc_id)       # type: ignore[misc]
            s = int(seg.seq[i])
        return s

    def _top_in_group(self, bag: dict[str, float], k: int, group: Hashable,
                      skip: Container[Hashable], stats: Stats | None = None) -> dict[Hashable, float]:
        """Exact scores of a superset of the top ``k`` documents of ``group`` (max-score pruning).

        Terms are taken by decreasing upper bound of what they can add to one document
        (``weight * f(highest tf, shortest length)``). Once the bounds of the terms left add up
        to less than the k-th best partial score, no unseen document can reach the top k: the
        remaining terms only update the documents already in play, dropping those that cannot
        make it. The survivors are then scored exactly as ``scores`` does (same terms, same
        order of additions), so scores and ties are bit-identical to a full scan.
        """
        n, total_len, df_of = self._stats.view(stats)
        min_len = self._min_len.get(group)        # (None for a group being dropped too)
        if n == 0 or min_len is None:
            return {}
        avgdl = (total_len / n) or 1.0
        k1, b = self.k1, self.b
        doc_len = self._doc_len
        norm_min = k1 * (1.0 - b + b * min_len / avgdl)
        terms = []                                # (term, weight, plist, bound) in query order
        for term, qw in bag.items():
            groups = self._postings.get(term)
            plist = groups.get(group) if groups else None
            if plist is None:
                continue
            df = df_of(term)
            if not df:                            # (only with ``stats``: no document of those groups has it)
                continue
            weight = qw * math.log(1.0 + (n - df + 0.5) / (df + 0.5))
            tf = self._tf_max[term][group]
            terms.append((term, weight, plist, weight * tf * (k1 + 1.0) / (tf + norm_min) * (1.0 + SLACK)))
        order = sorted(terms, key=lambda t: -t[3])
        rest = [0.0] * (len(order) + 1)
        for j in range(len(order) - 1, -1, -1):
            rest[j] = rest[j + 1] + order[j][3]
        acc: dict[Hashable, float] = {}           # partial scores (rounding may differ: SLACK covers it)
        theta = -math.inf
        base, per_len = k1 * (1.0 - b), k1 * b / avgdl           # norm = base + per_len * length
        for j, (_, weight, plist, _) in enumerate(order):
            wk = weight * (k1 + 1.0)
            if len(acc) >= k and rest[j] < max(acc.values()):      # else no document can be ruled out yet
                theta = sorted(acc.values(), reverse=True)[k - 1] * (1.0 - SLACK)
            if rest[j] < theta:                   # no unseen document can reach the top k
                acc = {d: v for d, v in acc.items() if v + rest[j] >= theta}
                if len(plist) < len(acc):
                    hits = [(d, plist[d]) for d in plist if d in acc]
                else:
                    hits = [(d, plist[d]) for d in acc if d in plist]
                for d, tf in hits:
                    acc[d] += wk * tf / (tf + base + per_len * doc_len[d])
            else:
                get = acc.get
                for d, tf in plist.items():
                    if d not in skip:
                        acc[d] = get(d, 0.0) + wk * tf / (tf + base + per_len * doc_len[d])
        if len(acc) > k:                          # only those near the k-th best can be in the top k
            cut = sorted(acc.values(), reverse=True)[k - 1] * (1.0 - SLACK)
            acc = {d: v for d, v in acc.items() if v >= cut}
        out: dict[Hashable, float] = {}
        for d in acc:                             # exact: the additions of ``scores``, in query order
            bag_d = self._doc_terms[d]
            norm = k1 * (1.0 - b + b * doc_len[d] / avgdl)
            total = 0.0
            for term, weight, _, _ in terms:
                tf = bag_d.get(term)
                if tf is not None:
                    total = total + weight * tf * (k1 + 1.0) / (tf + norm)
            out[d] = total
        return out


class GroupDrop:
    """A group leaving a ``BM25Index`` (``BM25Index.drop_group``), in bounded ``step``s.

    Its documents are already out of the index (searches skip the group). Each step reads the term
    list of one more document (keeping the terms not seen yet) and drops the group's posting list
    of up to ``limit`` distinct terms, lowering each one's document frequency by that list's length:
    the work is one entry per distinct term of the group, not one per document and term. The last
    step takes the documents' counts and lengths out of the statistics, in order (the same floats as
    removing them one by one). Meanwhile the statistics are between before and after: the document
    count and total length as before, the document frequencies partly lowered (every idf stays
    positive). ``finish`` does the rest at once."""

    def __init__(self, index: BM25Index, group: Hashable, bags: list[dict[str, float]],
                 lengths: list[float]) -> None:
        self._index = index
        self.group = group
        self.lengths = lengths                 # of the documents, in the order given
        self._bags = bags[::-1]                # (popped from the end)
        self._seen: set[str] = set()           # terms read from the bags so far
        self._todo: list[str] = []             # read, postings not dropped yet
        self.done = not bags

    def step(self, limit: int) -> int:
        """Drop the postings of up to ``limit`` more terms (or read one more document's term list,
        which counts as its size; or end the drop). Returns the terms touched (0 once done)."""
        if self.done:
            return 0
        index, group, todo = self._index, self.group, self._todo
        postings, tf_max, lower = index._postings, index._tf_max, index._stats.lower
        touched = 0
        while touched < limit:
            if todo:
                n = min(len(todo), limit - touched)
                for term in todo[:n]:
                    groups = postings[term]
                    lower(term, len(groups.pop(group)))
                    if groups:
                        del tf_max[term][group]
                    else:
                        del postings[term], tf_max[term]
                del todo[:n]
                touched += n
            elif self._bags:
                bag, seen = self._bags.pop(), self._seen
                new = [t for t in bag if t not in seen]    # (in bag order: near in memory, ~2x faster)
                seen.update(new)
                todo.extend(new)
                touched += len(bag)
            else:
                self._end()
                touched += len(self.lengths)
                break
        return touched

    def _end(self) -> None:
        index, touched = self._index, []
        for length in self.lengths:
            index._forget(self.group, length, touched)
        index._reclaim(touched)
        del index._dropping[self.group]
        self._seen = set()
        self.done = True

    def finish(self) -> None:
        """Every step left, at once."""
        while not self.done:
            self.step(1 << 62)
