"""Would static word vectors (model2vec-style) fused with the recall default raise LoCoMo recall?

Usage: python bench/locomo_dense.py DATA VECTORS [--dims 128] [--no-extra-words]

VECTORS is the ``.npz`` written by ``scripts/distill_static.py`` (all-MiniLM-L6-v2 distilled to
one vector per WordPiece entry and per extra whole word; it is not shipped, see docs/memory.md).

Each turn and each question is encoded by a numpy-only static encoder: lowercased words minus the
analyzer's stopwords, each word's vector (its own row, else the mean of its WordPiece rows),
averaged (uniformly, or by the conversation's BM25 idf with ``idf``), normalized. A turn's vector
optionally adds its neighbours' vectors with the recall layer's neighbour weights (``ctx``); with
``sent`` each sentence of a turn is encoded alone (speaker name kept) and the turn scores its best
sentence.
Fusion: ``bm25 / max(bm25) + w * cosine`` over every turn of the conversation, where ``bm25`` is
the recall default's own score (``RecallIndex``: analyzer, neighbours, dates).

Printed: R@5 per category of the default and of every configuration on the dev data, then the
leave-one-conversation-out estimate: for each conversation, the configuration with the best
mean R@5 on the other conversations is applied to it (never chosen per question), and the
time to encode a turn and to score a question against every turn.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import unicodedata
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from locomo_recall import CATEGORY_NAMES, groups  # noqa: E402
from server.memory.analyze import STOPWORDS, analyze  # noqa: E402
from server.memory.recall import WEIGHTS_AFTER, WEIGHTS_BEFORE, RecallIndex, TurnDoc, query_terms  # noqa: E402

WORD_RE = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\s*\[image:")
N_WORDPIECE = 29523          # rows of the model's own vocabulary (the rest are extra whole words)
FUSION_WEIGHTS = (0.25, 0.5, 1.0, 2.0)
K = 5


class StaticEncoder:
    """Word lookup (WordPiece fallback) + weighted mean + normalization, numpy only."""

    def __init__(self, path: Path, dims: int, extra_words: bool) -> None:
        z = np.load(path)
        tokens = [str(t) for t in z["tokens"]]
        self.vectors = z["vectors"][:, :dims].astype(np.float32) * z["scales"].astype(np.float32)[:, None]
        limit = len(tokens) if extra_words else N_WORDPIECE
        self.row = {t: i for i, t in enumerate(tokens[:limit])}
        self._cache: dict[str, np.ndarray | None] = {}

    def word_vector(self, word: str) -> np.ndarray | None:
        if word in self._cache:
            return self._cache[word]
        rows: list[int] = []
        i = self.row.get(word)
        if i is not None:
            rows = [i]
        else:
            start = 0
            while start < len(word):
                end, found = len(word), None
                while start < end:
                    found = self.row.get(word[start:end] if start == 0 else "##" + word[start:end])
                    if found is not None:
                        break
                    end -= 1
                if found is None:
                    rows = []
                    break
                rows.append(found)
                start = end
        vec = self.vectors[rows].mean(0) if rows else None
        self._cache[word] = vec
        return vec

    @staticmethod
    def words(text: str) -> list[str]:
        text = unicodedata.normalize("NFKC", text).lower().replace("’", "'")
        return [w[:-2] if w.endswith("'s") else w for w in WORD_RE.findall(text) if w not in STOPWORDS]

    def encode(self, text: str, weight: Callable[[str], float] | None = None) -> np.ndarray:
        acc = np.zeros(self.vectors.shape[1], dtype=np.float32)
        for w in self.words(text):
            vec = self.word_vector(w)
            if vec is not None:
                acc += (1.0 if weight is None else weight(w)) * vec
        norm = float(np.linalg.norm(acc))
        return acc / norm if norm else acc


def sentences(text: str) -> list[str]:
    """``"Ann: Hi! I ran. [image: x]"`` -> ``["Ann: Hi!", "Ann: I ran.", "Ann: x"]`` (speaker kept)."""
    speaker, sep, rest = text.partition(": ")
    if not sep:
        speaker, rest = "", text
    parts = [p.strip(" ]") for p in SENTENCE_END.split(rest) if p and p.strip(" ]")]
    return [f"{speaker}: {p}" if speaker else p for p in parts] or [text]


def build(turns: list[tuple[str, str, str, str]]) -> tuple[RecallIndex, list[tuple[str, int]], list[str]]:
    index = RecallIndex()
    keys, dias = [], []
    by_session: dict[str, list[TurnDoc]] = defaultdict(list)
    for i, (session, dia, text, when) in enumerate(turns, start=1):
        doc = TurnDoc(session, i, None, when, text, "")
        by_session[session].append(doc)
        keys.append(doc.key)
        dias.append(dia)
    for session, docs in by_session.items():
        index.add_turns(session, docs, docs[-1].message_id)
    return index, keys, dias


def recall_at_k(scores: np.ndarray, dias: list[str], qas: list[tuple[Any, str, set[str]]]) -> list[tuple[Any, float]]:
    top = np.argsort(-scores, axis=1, kind="stable")[:, :K]
    return [(cat, len(ev.intersection(dias[j] for j in top[qi])) / len(ev)) for qi, (cat, _, ev) in enumerate(qas)]


def table(results: list[tuple[Any, float]]) -> dict[Any, float]:
    by: dict[Any, list[float]] = defaultdict(list)
    for cat, r in results:
        by[cat].append(r)
        by["all"].append(r)
    return {c: float(np.mean(v)) for c, v in by.items()}


def fmt(t: dict[Any, float]) -> str:
    cats = sorted((c for c in t if c != "all"), key=str) + ["all"]
    return "  ".join(f"{CATEGORY_NAMES.get(c, c)} {t[c]:.3f}" for c in cats)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path, help="LoCoMo-format JSON file")
    ap.add_argument("vectors", type=Path, help=".npz from scripts/distill_static.py")
    ap.add_argument("--dims", type=int, default=128, help="leading PCA dimensions to use")
    ap.add_argument("--no-extra-words", action="store_true", help="WordPiece rows only")
    args = ap.parse_args(argv)
    data = json.loads(args.path.read_text(encoding="utf-8"))
    enc = StaticEncoder(args.vectors, args.dims, not args.no_extra_words)

    convs = []
    t_encode, n_encoded = 0.0, 0
    pooled: list[np.ndarray] = []              # uniform own-turn vectors of every conversation
    questions_text: list[str] = []
    for turns, qas in groups(data, True, False):
        index, keys, dias = build(turns)
        pos = {k: i for i, k in enumerate(keys)}
        bm25 = np.zeros((len(qas), len(keys)), dtype=np.float32)
        for qi, (_, q, _) in enumerate(qas):
            for key, v in index.bm25.scores(query_terms(q)).items():
                bm25[qi, pos[key]] = v
        n = len(index.bm25)

        def idf(word: str, b=index.bm25, n=n) -> float:
            terms = analyze(word)
            df = b.doc_freq(terms[0]) if terms else n
            return math.log(1.0 + (n - df + 0.5) / (df + 0.5))
        sessions = [k[0] for k in keys]
        variants = {}
        for weighting in ("uniform", "idf"):
            weight = idf if weighting == "idf" else None
            t0 = time.perf_counter()
            own = np.stack([enc.encode(t[2], weight) for t in turns])
            t_encode += time.perf_counter() - t0
            n_encoded += len(turns)
            if weight is None:
                pooled.append(own)
                questions_text += [q for _, q, _ in qas]
            questions = np.stack([enc.encode(q, weight) for _, q, _ in qas])
            for ctx in ("own", "ctx"):
                docs = own.copy()
                if ctx == "ctx":
                    for offs, ws in (((-1, -2), WEIGHTS_BEFORE), ((1, 2), WEIGHTS_AFTER)):
                        for off, w in zip(offs, ws):
                            for i in range(len(keys)):
                                j = i + off
                                if 0 <= j < len(keys) and sessions[j] == sessions[i]:
                                    docs[i] += w * own[j]
                    norms = np.linalg.norm(docs, axis=1, keepdims=True)
                    docs /= np.where(norms == 0, 1.0, norms)
                variants[(weighting, ctx)] = questions @ docs.T
            owner, vecs = [], []
            for i, t in enumerate(turns):
                for sentence in sentences(t[2]):
                    owner.append(i)
                    vecs.append(enc.encode(sentence, weight))
            starts = np.searchsorted(np.array(owner), np.arange(len(turns)))
            variants[(weighting, "sent")] = np.maximum.reduceat(questions @ np.stack(vecs).T, starts, axis=1)
        top = bm25.max(1, keepdims=True)
        norm_bm25 = bm25 / np.where(top == 0, 1.0, top)
        results = {"default": recall_at_k(bm25, dias, qas)}
        for (weighting, ctx), cos in variants.items():
            for w in FUSION_WEIGHTS:
                results[f"{weighting:<7} {ctx:<4} w={w}"] = recall_at_k(norm_bm25 + w * cos, dias, qas)
        convs.append(results)

    names = list(convs[0])
    print(f"R@{K} on {args.path.name} ({len(convs)} conversations), static vectors {args.vectors.name}, "
          f"{args.dims} dims, extra words {'off' if args.no_extra_words else 'on'}")
    for name in names:
        print(f"{name:<23} {fmt(table([r for c in convs for r in c[name]]))}")
    if len(convs) < 2:
        print("leave-one-out needs at least 2 conversations")
        return 0
    held, picks = [], []
    for i in range(len(convs)):
        best = max((nm for nm in names if nm != "default"),
                   key=lambda nm: np.mean([r for j, c in enumerate(convs) if j != i for _, r in c[nm]]))
        picks.append(best)
        held += convs[i][best]
    print(f"{'leave-one-out':<23} {fmt(table(held))}")
    print("chosen per held-out conversation: " + "; ".join(picks))
    base = [np.mean([r for _, r in c["default"]]) for c in convs]
    print("held-out delta per conversation: " + " ".join(
        f"{np.mean([r for _, r in convs[i][picks[i]]]) - base[i]:+.3f}" for i in range(len(convs))))
    every = np.concatenate(pooled)
    t_query = []
    for q in questions_text:
        t0 = time.perf_counter()
        cos = every @ enc.encode(q)
        np.argpartition(-cos, min(50, len(cos) - 1))[:50]
        t_query.append(time.perf_counter() - t0)
    s = sorted(t_query)
    print(f"encode {t_encode / n_encoded * 1e6:.0f} us/turn (index time); a question encoded and scored against "
          f"all {len(every)} turns: p50 {s[len(s) // 2] * 1e6:.0f} us, p95 {s[int(len(s) * 0.95)] * 1e6:.0f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
