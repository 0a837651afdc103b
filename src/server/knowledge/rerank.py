"""Second stage of the knowledge-base ranking: the best BM25 candidates re-ordered by how much of
the question a passage covers and how close together the matched terms sit.

SQuAD-style questions share a contiguous phrase with the sentence that answers them ("冰雪皇后什么时候
退出了台湾市场" / "...品牌正式撤出台湾"), while BM25 alone favours the chunk that repeats the topic's
name most. For each candidate the score becomes

    bm25 / best_bm25 + COVERAGE_WEIGHT * coverage + PROXIMITY_WEIGHT * proximity + EXACT_WEIGHT * exact

- terms: CJK bigrams (a lone CJK character as itself) and English stems, with their positions;
  each query term weighs its BM25 idf over the chunks of the searcher's collections only
  (``doc_freq`` and ``n_chunks`` come from ``ChunkIndex.stats``: another user's documents must
  not change the order);
- coverage: the weight of the query terms found in the chunk's text or heading path, over the
  weight of all query terms;
- proximity: the largest weight of distinct query terms inside one window of ``len(query) +
  WINDOW_SLACK`` characters of the chunk's text, counting only terms that are not in the chunk's
  heading path (the section's topic is already credited to every chunk of the section), plus the
  weight of the query terms in the chunk's own (most specific) heading, which names what the text
  is about as closely as a term beside the others would ("When is the maintenance window on
  production?": the section "Production" holding "Maintenance window: Sunday ..." is as close as
  the section "Staging" that mentions production in passing), over the weight of all query terms;
- exact: the weight of the query's identifiers (an ASCII token holding a digit and an inner ``.``,
  ``-``, ``_``, ``:`` or ``/``: ``db-01``, ``10.2.10.30``, ``ERR-4031``, ``v1.2.3``, ``2026-10-01``)
  that stand whole in the chunk's text or heading path (not inside a longer identifier:
  ``db-01`` is not in ``prod-db-01`` nor ``db-01.5``, it is in ``db-01:5432``), over the weight of
  all the query's identifiers (not of all its terms: words of the question that no chunk holds,
  such as "在哪个机架", must not dilute it). The analyzer cuts an identifier into its pieces
  (``db``, ``01``), which other identifiers share (``db-stage-01``, a date ``2026-10-01``): with
  ``EXACT_WEIGHT`` 1 a chunk holding a query that is only an identifier outranks every chunk
  holding only its pieces (their other features sum to at most 2).

The weights were chosen on the first half of the CMRC 2018 trial documents only (bench/kb_recall.py
``--split``; docs/knowledge.md has the figures of both halves).
"""
from __future__ import annotations

import math
import re
from collections import Counter
from functools import lru_cache
from typing import Callable, Collection, Hashable, Iterable, Sequence

from server.memory.analyze import CJK_PUNCT, normalize, word_terms
from server.memory.tokens import CJK_CLASS

RERANK_DEPTH = 10            # BM25 candidates re-ordered (0: BM25 order as is)
NORMALIZED_CACHE = 4096      # chunk texts kept normalized (NFKC, lowercase) between queries
COVERAGE_WEIGHT = 0.5
PROXIMITY_WEIGHT = 0.5
WINDOW_SLACK = 10            # characters added to the query's length for the proximity window
EXACT_WEIGHT = 1.0           # the query's identifiers found whole (``identifiers``)

_RUN_RE = re.compile(rf"([{CJK_CLASS}]+)|([^\W_{CJK_CLASS}]+)")
_WORD_RE = re.compile(rf"[^\W_{CJK_CLASS}]+")
_IDENT_RE = re.compile(r"[a-z0-9_](?:[a-z0-9_.:/-]*[a-z0-9_])?", re.ASCII)

Passage = Callable[[Hashable], tuple[str, Sequence[str]]]     # key -> (text, heading path)
DocFreq = Callable[[str], int]


def positioned_terms(text: str) -> list[tuple[int, str]]:
    """(character offset, term) of ``text``: CJK bigrams (a lone CJK character as itself) and
    English stems (``server.memory.analyze``), offsets into the normalized text."""
    out: list[tuple[int, str]] = []
    t = CJK_PUNCT.sub(" ", normalize(text))
    for m in _RUN_RE.finditer(t):
        cjk, word = m.groups()
        start = m.start()
        if cjk:
            if len(cjk) == 1:
                out.append((start, cjk))
            else:
                out.extend((start + i, cjk[i:i + 2]) for i in range(len(cjk) - 1))
        else:
            out.extend((start, term) for term in word_terms(word))
    return out


def matches(text: str, terms: Collection[str]) -> list[tuple[int, str]]:
    """(offset, term) of every occurrence of ``terms`` (from ``positioned_terms``) in ``text``,
    sorted by offset: CJK terms found with ``str.find`` (a query bigram never holds punctuation, so
    this is the same as comparing bigrams), English stems by stemming the text's words (only when
    the query has English terms)."""
    t = _normalized(text)
    out: list[tuple[int, str]] = []
    english = False
    for term in terms:
        if term.isascii():
            english = True
            continue
        i = t.find(term)
        while i >= 0:
            out.append((i, term))
            i = t.find(term, i + 1)
    if english:
        for m in _WORD_RE.finditer(t):
            out.extend((m.start(), s) for s in word_terms(m.group()) if s in terms)
    out.sort()
    return out


def identifiers(query: str) -> list[str]:
    """The identifier-like tokens of ``query`` (normalized), as written: ASCII runs holding a digit
    and an inner ``.``, ``-``, ``_``, ``:`` or ``/`` (the analyzer cuts them into pieces)."""
    return list(dict.fromkeys(m.group() for m in _IDENT_RE.finditer(normalize(query))
                              if any(c.isdigit() for c in m.group())
                              and any(c in ".-_:/" for c in m.group())))


@lru_cache(maxsize=4096)
def _whole(ident: str) -> re.Pattern[str]:
    """``ident`` standing whole: not preceded by an identifier character, nor followed by one or by a
    ``.``/``-`` that continues the identifier (``db-01`` in ``db-01.`` and ``db-01:5432``, not in
    ``prod-db-01`` or ``db-01-b``)."""
    return re.compile(rf"(?<![a-z0-9_.-]){re.escape(ident)}(?![a-z0-9_]|[.-][a-z0-9_])", re.ASCII)


@lru_cache(maxsize=NORMALIZED_CACHE)
def _normalized(text: str) -> str:
    return normalize(text)      # NFKC costs ~0.1 ms for a 600-character chunk; a chunk's str caches its hash


@lru_cache(maxsize=4096)
def _heading_terms(heading: str) -> frozenset[str]:
    return frozenset(t for _, t in positioned_terms(heading))


def _best_window(hits: list[tuple[int, str]], weight: dict[str, float], width: int) -> float:
    """The largest weight of distinct terms among ``hits`` (sorted by offset) within ``width``."""
    best = total = 0.0
    inside: Counter[str] = Counter()
    j = 0
    for pos, term in hits:
        if not inside[term]:
            total += weight[term]
        inside[term] += 1
        while hits[j][0] < pos - width:
            old = hits[j][1]
            inside[old] -= 1
            if not inside[old]:
                total -= weight[old]
            j += 1
        best = max(best, total)
    return best


def rerank(query: str, candidates: Iterable[tuple[Hashable, float]], passage: Passage,
           doc_freq: DocFreq, n_chunks: int) -> list[tuple[Hashable, float]]:
    """``candidates`` ((key, bm25), best first) re-scored and sorted, best first. ``doc_freq`` and
    ``n_chunks``: the statistics of the collections the searcher reads (never global ones)."""
    cands = list(candidates)
    q_terms = positioned_terms(query)
    if not cands or not q_terms:
        return cands
    weight: dict[str, float] = {}
    for _, term in q_terms:
        if term not in weight:
            df = doc_freq(term)
            weight[term] = math.log(1.0 + (n_chunks - df + 0.5) / (df + 0.5))
    total = sum(weight.values()) or 1.0
    idents = [(_whole(i), sum(weight.get(t, 0.0) for t in {t for _, t in positioned_terms(i)}))
              for i in identifiers(query)]
    ident_total = sum(w for _, w in idents) or 1.0
    width = len(query) + WINDOW_SLACK
    best_bm25 = cands[0][1] if cands[0][1] > 0 else 1.0
    scored = []
    for rank, (key, bm25) in enumerate(cands):
        text, heading = passage(key)
        in_heading = _heading_terms(" ".join(heading)) & weight.keys()
        hits = matches(text, weight.keys())
        coverage = sum(weight[t] for t in {t for _, t in hits} | in_heading) / total
        topical = [(p, t) for p, t in hits if t not in in_heading]
        own = _heading_terms(heading[-1]) & weight.keys() if heading else frozenset()
        proximity = (_best_window(topical, weight, width) + sum(weight[t] for t in own)) / total
        score = bm25 / best_bm25 + COVERAGE_WEIGHT * coverage + PROXIMITY_WEIGHT * proximity
        if idents:
            body, path = _normalized(text), normalize(" / ".join(heading))
            exact = sum(w for pattern, w in idents if pattern.search(body) or pattern.search(path))
            score += EXACT_WEIGHT * exact / ident_total
        scored.append((score, -rank, key))
    scored.sort(reverse=True)
    return [(key, score) for score, _, key in scored]
