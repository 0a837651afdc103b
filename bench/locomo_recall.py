"""Evidence recall@k of the memory layer's turn recall on LoCoMo-format data.

Usage: python bench/locomo_recall.py PATH [--k 1 5 10] [--no-captions] [--pool]

Data: a JSON list of conversations; ``conversation["session_<n>"]`` lists turns with ``dia_id``,
``speaker``, ``text`` (image turns also carry ``blip_caption``), ``conversation["session_<n>_date_time"]``
the session date ("1:56 pm on 8 May, 2023"); ``qa`` items carry ``question``, ``evidence`` (dia ids)
and ``category``. Malformed evidence ids are normalized: "D8:6; D9:17" -> two ids, "D:11:26" ->
"D11:26", a bare "D" is dropped; a question left with no valid evidence is skipped.

Indexing: every dia turn becomes one recall document exactly as the recall layer builds it
(``server.memory.recall.RecallIndex``): text ``"<speaker>: <text>"`` (plus ``[image: <caption>]``
unless --no-captions), the session date as the turn's time, each LoCoMo session a separate chat
session of one user (so neighbour context never crosses sessions). The question is the query,
searched across all sessions of the conversation (as the history_search tool does).

With --pool every conversation goes into ONE index (one user with all their sessions: ~2,800
turns for the dev half), each question searched across all of it: the query time at the scale the
issue asks about (p50 < 5 ms at 2,000 turns), and recall with the other conversations as distractors.

Metric: recall@k for one question = |evidence ids among the top-k results| / |evidence ids|;
the figure printed is its mean over the questions of a category (and over all questions).

Baselines measured in the same run: plain BM25 (k1=1.2, b=0.75) over the same turn texts with
lowercased alphanumeric words only -- no stemming, no CJK bigrams, no neighbours, no dates --
without and with English stopword removal ("bm25-words", "bm25-words-stop").
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from server.memory.analyze import STOPWORDS, plain_words  # noqa: E402
from server.memory.bm25 import BM25Index  # noqa: E402
from server.memory.recall import RecallIndex, TurnDoc  # noqa: E402

EVIDENCE_RE = re.compile(r"D:?(\d+):(\d+)")
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}


def normalize_evidence(items: list[Any]) -> list[str]:
    """Valid dia ids in ``items``: split "D8:6; D9:17", fix "D:11:26", drop "D"."""
    out: list[str] = []
    for item in items:
        for part in re.split(r"[;,\s]+", str(item)):
            m = EVIDENCE_RE.fullmatch(part.strip())
            if m:
                dia = f"D{m.group(1)}:{m.group(2)}"
                if dia not in out:
                    out.append(dia)
    return out


def parse_session_date(text: str) -> str:
    """"1:56 pm on 8 May, 2023" -> ISO 8601 (UTC); "" when unreadable."""
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y"):
        try:
            return datetime.strptime(text.strip(), fmt).replace(tzinfo=timezone.utc).isoformat()
        except ValueError:
            continue
    return ""


def load_turns(conv: dict[str, Any], captions: bool) -> list[tuple[str, str, str, str]]:
    """(session key, dia_id, text as indexed, ISO time) for every turn, in conversation order."""
    c = conv["conversation"]
    numbers = sorted(int(k.split("_")[1]) for k in c if re.fullmatch(r"session_\d+", k))
    out = []
    for n in numbers:
        when = parse_session_date(str(c.get(f"session_{n}_date_time", "")))
        for turn in c[f"session_{n}"]:
            text = f"{turn['speaker']}: {turn['text']}"
            if captions and turn.get("blip_caption"):
                text += f" [image: {turn['blip_caption']}]"
            out.append((f"session_{n}", str(turn["dia_id"]), text, when))
    return out


Retriever = Callable[[str, int], list[str]]


def default_retriever(turns: list[tuple[str, str, str, str]]) -> Retriever:
    """The embedded default: the recall layer's own index (one chat session per LoCoMo session)."""
    index = RecallIndex()
    dia_of: dict[tuple[str, int], str] = {}
    by_session: dict[str, list[TurnDoc]] = defaultdict(list)
    for i, (session, dia, text, when) in enumerate(turns, start=1):
        doc = TurnDoc(session, i, None, when, text, "")
        by_session[session].append(doc)
        dia_of[doc.key] = dia
    for session, docs in by_session.items():
        index.add_turns(session, docs, docs[-1].message_id)
    return lambda q, k: [dia_of[doc.key] for doc, _ in index.search(q, k)]


def baseline_retriever(turns: list[tuple[str, str, str, str]], stopwords: bool) -> Retriever:
    """Plain BM25 over words (see module docstring)."""
    def words(text: str) -> list[str]:
        ws = plain_words(text)
        return [w for w in ws if w not in STOPWORDS] if stopwords else ws
    index = BM25Index(1.2, 0.75)
    for _, dia, text, _ in turns:
        index.add(dia, words(text))
    return lambda q, k: [str(d) for d, _ in index.search(words(q), k)]


def groups(data: list[dict[str, Any]], captions: bool, pool: bool) -> list[tuple[list, list[tuple[Any, str, set[str]]]]]:
    """(turns, [(category, question, evidence ids)]) per index: one per conversation, or one for
    all of them with ``pool`` (sessions and dia ids prefixed by the conversation number)."""
    out = []
    for n, conv in enumerate(data):
        prefix = f"c{n}/" if pool else ""
        turns = [(prefix + s, prefix + d, text, when) for s, d, text, when in load_turns(conv, captions)]
        qas = []
        for qa in conv.get("qa", ()):
            evidence = {prefix + e for e in normalize_evidence(qa.get("evidence") or [])}
            if evidence:
                qas.append((qa.get("category"), str(qa["question"]), evidence))
        out.append((turns, qas))
    if pool:
        out = [([t for turns, _ in out for t in turns], [q for _, qas in out for q in qas])]
    return out


def evaluate(data: list[dict[str, Any]], make: Callable[[list], Retriever], ks: list[int],
             captions: bool, pool: bool = False) -> tuple[dict[Any, list[float]], dict[Any, int], float, list[float]]:
    """Per-category sums of recall@k, question counts, index seconds, each query's seconds."""
    sums: dict[Any, list[float]] = defaultdict(lambda: [0.0] * len(ks))
    counts: dict[Any, int] = defaultdict(int)
    t_index = 0.0
    t_query: list[float] = []
    depth = max(ks)
    for turns, qas in groups(data, captions, pool):
        t0 = time.perf_counter()
        retrieve = make(turns)
        t_index += time.perf_counter() - t0
        for category, question, evidence in qas:
            t0 = time.perf_counter()
            ranked = retrieve(question, depth)
            t_query.append(time.perf_counter() - t0)
            for cat in (category, "all"):
                counts[cat] += 1
                for j, k in enumerate(ks):
                    sums[cat][j] += len(evidence.intersection(ranked[:k])) / len(evidence)
    return sums, counts, t_index, t_query


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path, help="LoCoMo-format JSON file")
    ap.add_argument("--k", type=int, nargs="+", default=[1, 5, 10], help="cut-offs (default 1 5 10)")
    ap.add_argument("--no-captions", action="store_true", help="index turn text only, no image captions")
    ap.add_argument("--pool", action="store_true", help="all conversations in one index (query time at scale)")
    args = ap.parse_args(argv)
    if any(k < 1 for k in args.k):
        ap.error("--k values must be >= 1")
    data = json.loads(args.path.read_text(encoding="utf-8"))
    if not isinstance(data, list):
        ap.error("expected a JSON list of conversations")
    ks = sorted(set(args.k))
    captions = not args.no_captions
    methods: list[tuple[str, Callable[[list], Retriever]]] = [
        ("bm25-words", lambda t: baseline_retriever(t, stopwords=False)),
        ("bm25-words-stop", lambda t: baseline_retriever(t, stopwords=True)),
        ("default", default_retriever),
    ]
    results = {name: evaluate(data, make, ks, captions, args.pool) for name, make in methods}
    cats = sorted((c for c in results["default"][1] if c != "all"), key=str) + ["all"]
    print(f"LoCoMo evidence recall ({args.path.name}, {len(data)} conversations, "
          f"captions {'on' if captions else 'off'}"
          + (f", pooled: one index of {sum(len(load_turns(c, captions)) for c in data)} turns)" if args.pool else ")"))
    header = f"{'method':<16} {'category':<16} {'n':>4} " + " ".join(f"{'R@' + str(k):>6}" for k in ks)
    print(header)
    print("-" * len(header))
    for name, (sums, counts, _, _) in results.items():
        for cat in cats:
            label = "all" if cat == "all" else f"{cat} {CATEGORY_NAMES.get(cat, '')}".strip()
            print(f"{name:<16} {label:<16} {counts[cat]:>4} "
                  + " ".join(f"{s / counts[cat]:>6.3f}" for s in sums[cat]))
        print()
    base = results["bm25-words-stop"]
    best = results["default"]
    n = best[1]["all"]
    for j, k in enumerate(ks):
        b, d = base[0]["all"][j] / n, best[0]["all"][j] / n
        print(f"R@{k}: default {d:.3f} vs plain BM25 {b:.3f} (x{d / b if b else float('inf'):.2f})")
    for name, (_, counts, t_index, t_query) in results.items():
        q = sorted(t_query)
        p50, p95 = q[len(q) // 2], q[min(len(q) - 1, int(len(q) * 0.95))]
        print(f"{name:<16} index {t_index * 1000:8.1f} ms total, query {sum(q) / len(q) * 1e6:8.1f} us/question "
              f"(p50 {p50 * 1e6:.1f} us, p95 {p95 * 1e6:.1f} us)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
