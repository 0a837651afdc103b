"""Retrieval over the chunks of every collection: the shared BM25 engine (``server.memory.bm25``
with the shared analyzer, ``server.memory.analyze``: CJK unigrams and bigrams plus English stems),
with its best candidates re-ordered by query-term coverage and proximity (``rerank``), fused by
reciprocal rank fusion with cosine similarity of embeddings when an endpoint is configured.

BM25 postings are grouped by collection, so a search scores only the chunks of the collections
the user may read (with max-score pruning). The statistics behind the scores -- document count,
document frequencies, average length, in BM25 and in the second stage's term weights -- are kept
per collection too and summed over the searcher's visible collections only: what other users
store never changes a user's ids, order or scores (which would tell whether a word is in their
private documents). Not thread safe: ``KnowledgeBase`` serializes access with one lock.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Hashable, Iterable

import numpy as np

from server.memory.analyze import analyze
from server.memory.bm25 import BM25Index, Stats
from server.knowledge.rerank import RERANK_DEPTH, rerank
from server.memory.recall import rrf

ChunkKey = tuple[str, int]       # (doc_id, chunk number)


@dataclass(slots=True)
class IndexedChunk:
    collection: str
    text: str
    location: dict


def chunk_terms(text: str, heading: Iterable[str], title_weight: float) -> dict[str, float]:
    """The weighted bag of a chunk: its text, plus its heading path at ``title_weight``."""
    bag: dict[str, float] = dict(Counter(analyze(text)))
    if title_weight:
        for t in analyze(" ".join(heading)):
            bag[t] = bag.get(t, 0.0) + title_weight
    return bag


class ChunkIndex:
    def __init__(self, k1: float, b: float, title_weight: float, rerank_depth: int = RERANK_DEPTH) -> None:
        self.bm25 = BM25Index(k1, b, group_stats=True)   # each document's chunks: one sealed segment
        self.title_weight = title_weight
        self.rerank_depth = rerank_depth      # BM25 candidates the second stage re-orders (0: none)
        self.chunks: dict[ChunkKey, IndexedChunk] = {}
        self._vectors: dict[str, dict[ChunkKey, np.ndarray]] = {}      # collection -> key -> unit vector
        self._matrix: dict[str, tuple[list[ChunkKey], np.ndarray]] = {}  # per collection, built lazily

    def __len__(self) -> int:
        return len(self.chunks)

    @property
    def has_vectors(self) -> bool:
        return any(self._vectors.values())

    def add(self, doc_id: str, collection: str, chunks: list[dict],
            terms: list[dict[str, float]], vectors: list[list[float]] | None) -> None:
        for i, ch in enumerate(chunks):
            self.chunks[(doc_id, i)] = IndexedChunk(collection, ch["text"], ch["location"])
        self.bm25.add_sealed(((doc_id, i), bag, collection) for i, bag in enumerate(terms))
        if vectors:
            coll = self._vectors.setdefault(collection, {})
            for i, vec in enumerate(vectors):
                v = np.asarray(vec, dtype=np.float32)
                n = float(np.linalg.norm(v))
                coll[(doc_id, i)] = v / n if n else v
            self._matrix.pop(collection, None)

    def compact(self) -> None:
        """After a bulk load: every chunk into one sealed segment (fastest queries, least memory)."""
        self.bm25.compact()

    def remove(self, doc_id: str, n_chunks: int) -> None:
        """Drop a document's chunks; the index gives their memory back at once (a segment left
        empty is dropped, one left mostly dead is rebuilt: ``BM25Index.remove_many``)."""
        gone = []
        for i in range(n_chunks):
            ch = self.chunks.pop((doc_id, i), None)
            if ch is None:
                continue
            gone.append((doc_id, i))
            coll = self._vectors.get(ch.collection)
            if coll is not None and coll.pop((doc_id, i), None) is not None:
                self._matrix.pop(ch.collection, None)
        self.bm25.remove_many(gone)

    def stats(self, collections: Iterable[str]) -> Stats:
        """The BM25 statistics of ``collections`` only (summed in sorted order: the same figures
        whatever order the caller lists them in)."""
        return self.bm25.stats(sorted(set(collections)))

    def lexical(self, query: str, collections: Iterable[str], depth: int,
                visible: Iterable[str] | None = None) -> list[tuple[ChunkKey, float]]:
        """The top ``depth`` chunks of ``collections``: the best ``max(depth, rerank_depth)`` by BM25,
        re-ordered by ``rerank`` (unless ``rerank_depth`` is 0), both weighing terms with the
        statistics of ``collections`` and ``visible`` only (the searcher's readable collections).
        Collections without chunks are skipped before any work: a user in thousands of empty groups
        searches as fast as one in a few (before, each one cost a BM25 search, under the lock)."""
        held = self.bm25.group_size                    # (the chunks of a collection, kept by the index's statistics)
        colls = [c for c in dict.fromkeys(collections) if held(c)]       # (a collection without chunks: skipped)
        stats = self.stats(colls + [c for c in (visible or ()) if held(c)])
        terms = analyze(query)
        wanted = max(depth, self.rerank_depth)
        found: list[tuple[Hashable, float]] = []
        for coll in colls:
            found.extend(self.bm25.search(terms, wanted, group=coll, stats=stats))
        found.sort(key=lambda kv: -kv[1])
        found = found[:wanted]
        if self.rerank_depth:
            found = rerank(query, found, self._passage, stats.df, stats.n)
        return found[:depth]         # type: ignore[return-value]

    def _passage(self, key: Hashable) -> tuple[str, list[str]]:
        ch = self.chunks[key]        # type: ignore[index]
        return ch.text, ch.location.get("heading", [])

    def dense(self, query_vector: list[float], collections: Iterable[str], depth: int) -> list[ChunkKey]:
        q = np.asarray(query_vector, dtype=np.float32)
        n = float(np.linalg.norm(q))
        if not n:
            return []
        q /= n
        scored: list[tuple[float, ChunkKey]] = []
        for coll in collections:
            vecs = self._vectors.get(coll)
            if not vecs:
                continue
            cached = self._matrix.get(coll)
            if cached is None:
                keys = list(vecs)
                cached = self._matrix[coll] = (keys, np.stack([vecs[k] for k in keys]))
            keys, matrix = cached
            if matrix.shape[1] != q.shape[0]:
                continue
            sims = matrix @ q
            top = np.argsort(-sims)[:depth]
            scored.extend((float(sims[i]), keys[i]) for i in top)
        scored.sort(key=lambda sk: -sk[0])
        return [k for _, k in scored[:depth]]

    def search(self, query: str, collections: list[str], k: int,
               query_vector: list[float] | None = None,
               visible: Iterable[str] | None = None) -> list[tuple[ChunkKey, float]]:
        """Top ``k`` chunks of ``collections``: BM25 alone, or BM25 and vectors fused by reciprocal
        rank fusion. Term statistics come from ``collections`` plus ``visible`` (the searcher's
        readable collections: a search of one of them then scores as in the search of all) and
        from no other collection."""
        if query_vector is None:
            return self.lexical(query, collections, k, visible)
        depth = max(4 * k, 20)
        lex = [key for key, _ in self.lexical(query, collections, depth, visible)]
        vec = self.dense(query_vector, collections, depth)
        return rrf([lex, vec])[:k]          # type: ignore[return-value]
