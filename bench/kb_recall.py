"""Answer recall of the knowledge base on SQuAD-format data, plus ingest and query speed.

Usage: python bench/kb_recall.py PATH [--docs-per-file 8] [--scale 10000] [--queries 200]
                                  [--target 600 --overlap 100] [--split] [--no-rerank]

Data: SQuAD format (``data[].title``, ``data[].paragraphs[].context``, ``.qas[].question``,
``.qas[].answers[].text``), e.g. CMRC 2018. Paragraphs are packed 8 to a markdown document, each
under a ``# title`` heading, and ingested through the real pipeline (``KnowledgeBase.ingest``:
parse, chunk, index, store). Every question is asked; a question counts at k when a gold answer
string occurs in one of the top-k passages (answer-in-top-k).

Lines printed:
  baseline top1 X top5 Y top10 Z   BM25 (k1=1.2, b=0.75) over character bigrams of the same chunks
  default  top1 X top5 Y top10 Z   KnowledgeBase.search as the server runs it
  ceiling X                        questions whose answer lies inside one chunk (no ranking can beat it)

``--split`` (held-out): the first half of the documents ("tune": settings are chosen on it) and the
second half ("held-out": never looked at while choosing) go into separate knowledge bases, each
asked its own questions; lines ``tune baseline ...``, ``tune default ...``, ``held-out baseline
...``, ``held-out default ...``. ``--target``/``--overlap`` set the chunking, ``--no-rerank`` turns
the second ranking stage off (``server.knowledge.rerank``).
  ingest: MB/s of text through the pipeline
  query p50 at N chunks: synthetic CJK chunks (Zipf-distributed characters) in one collection,
  through the same ChunkIndex (``--scale`` sizes, default 10000 only; ``--scale 10000 100000 1000000``
  opts in to the large ones: 1M takes ~5 minutes of CPU and ~7 GB of memory).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from server.knowledge import KnowledgeBase, KnowledgeConfig  # noqa: E402
from server.knowledge.index import ChunkIndex, chunk_terms  # noqa: E402
from server.memory.analyze import normalize  # noqa: E402
from server.memory.bm25 import BM25Index  # noqa: E402

KS = (1, 5, 10)


def load(path: str) -> tuple[list[tuple[str, str]], list[tuple[str, list[str], int]]]:
    """(title, context) per paragraph and (question, answers, paragraph number) per question."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    paras, qas = [], []
    for article in data["data"]:
        title = str(article.get("title") or article.get("id") or "untitled")
        for p in article["paragraphs"]:
            paras.append((title, p["context"]))
            for qa in p["qas"]:
                answers = [a["text"] for a in qa.get("answers", []) if a.get("text")]
                if answers:
                    qas.append((qa["question"], answers, len(paras) - 1))
    return paras, qas


def pack(paras: list[tuple[str, str]], per_file: int) -> list[tuple[str, bytes]]:
    files = []
    for i in range(0, len(paras), per_file):
        body = "\n\n".join(f"# {t}\n\n{c}" for t, c in paras[i:i + per_file])
        files.append((f"doc{i // per_file:04d}.md", body.encode("utf-8")))
    return files


def bigrams(text: str) -> list[str]:
    t = "".join(normalize(text).split())
    return [t[i:i + 2] for i in range(len(t) - 1)]


def score(ranked: list[list[str]], qas: list[tuple[str, list[str], int]]) -> dict[int, float]:
    out = {}
    for k in KS:
        hits = sum(1 for texts, (_, answers, _) in zip(ranked, qas)
                   if any(a in t for t in texts[:k] for a in answers))
        out[k] = hits / max(1, len(qas))
    return out


def line(label: str, s: dict[int, float]) -> str:
    return f"{label} " + " ".join(f"top{k} {s[k]:.3f}" for k in KS)


def make_config(args: argparse.Namespace) -> KnowledgeConfig:
    cfg = KnowledgeConfig()
    if args.target is not None:
        cfg.chunk_target_chars = args.target
    if args.overlap is not None:
        cfg.chunk_overlap_chars = args.overlap
    return cfg


async def measure(files: list[tuple[str, bytes]], qas: list[tuple[str, list[str], int]], cfg: KnowledgeConfig,
                  rerank: bool, big_mb: float = 0.0) -> dict:
    """Ingest ``files`` into a fresh knowledge base, ask ``qas``; baseline and default answer recall."""
    out: dict = {}
    with tempfile.TemporaryDirectory() as root:
        kb = KnowledgeBase(cfg, root)
        if not rerank:
            kb.index.rerank_depth = 0
        await kb.start()
        t0 = time.perf_counter()
        for name, data in files:
            await kb.ingest("bench", [], None, name, data)
        out["took"] = time.perf_counter() - t0
        chunks = [ch.text for ch in kb.index.chunks.values()]
        out["chunks"] = len(chunks)
        # the best any retriever can do on these chunks: the answer inside at least one chunk
        out["ceiling"] = sum(1 for _, answers, _ in qas if any(a in t for t in chunks for a in answers)) / max(1, len(qas))
        base = BM25Index(1.2, 0.75)
        for i, text in enumerate(chunks):
            base.add(i, bigrams(text))
        base_ranked = [[chunks[i] for i, _ in base.search(bigrams(q), max(KS))] for q, _, _ in qas]
        t1 = time.perf_counter()
        ranked = [[h.text for h in await kb.search("bench", [], q, max(KS))] for q, _, _ in qas]
        out["query_s"] = (time.perf_counter() - t1) / max(1, len(qas))
        if big_mb:
            big = b"\n\n".join(data for _, data in files) * max(1, int(big_mb * 1e6 // max(1, sum(len(d) for _, d in files))))
            t2 = time.perf_counter()
            await kb.ingest("bench", [], None, "big.md", big)
            out["big"] = (len(big), time.perf_counter() - t2)
        await kb.close()
    out["baseline"], out["default"] = score(base_ranked, qas), score(ranked, qas)
    return out


async def recall(path: str, per_file: int, big_mb: float, cfg: KnowledgeConfig, rerank: bool) -> None:
    paras, qas = load(path)
    files = pack(paras, per_file)
    r = await measure(files, qas, cfg, rerank, big_mb)
    b, d = r["baseline"], r["default"]
    mb = sum(len(d) for _, d in files) / 1e6
    print(f"{len(paras)} paragraphs in {len(files)} documents, {r['chunks']} chunks, {len(qas)} questions "
          f"(chunking {cfg.chunk_target_chars}/{cfg.chunk_overlap_chars}, rerank {'on' if rerank else 'off'})")
    print(line("baseline", b))
    print(line("default", d))
    print(f"ceiling {r['ceiling']:.3f} (questions whose answer lies inside one chunk)")
    print("ratio    " + " ".join(f"top{k} x{d[k] / b[k]:.3f}" for k in KS if b[k]))
    size, big_took = r.get("big", (0, 0.0))
    one = f"one {size / 1e6:.1f} MB document: {size / 1e6 / big_took:.2f} MB/s; " if size else ""
    print(f"ingest: {mb:.2f} MB of text in {len(files)} documents in {r['took']:.2f} s = {mb / r['took']:.2f} MB/s "
          f"(fsync-bound); {one}search {r['query_s'] * 1e3:.2f} ms/question (async, incl. thread hop)")


async def split_recall(path: str, per_file: int, cfg: KnowledgeConfig, rerank: bool) -> None:
    """Held-out check: the documents' first half (settings are chosen on it) and second half (never
    looked at while choosing), each in its own knowledge base, each asked its own questions."""
    paras, qas = load(path)
    files = pack(paras, per_file)
    cut = len(files) // 2
    halves = (("tune", 0, cut), ("held-out", cut, len(files)))
    print(f"{len(paras)} paragraphs in {len(files)} documents, {len(qas)} questions "
          f"(chunking {cfg.chunk_target_chars}/{cfg.chunk_overlap_chars}, rerank {'on' if rerank else 'off'})")
    for label, lo, hi in halves:
        mine = [qa for qa in qas if lo * per_file <= qa[2] < hi * per_file]
        r = await measure(files[lo:hi], mine, cfg, rerank)
        print(f"{label}: documents {lo}-{hi - 1}, {r['chunks']} chunks, {len(mine)} questions")
        print(line(f"{label} baseline", r["baseline"]))
        print(line(f"{label} default", r["default"]))
        print(f"{label} ceiling {r['ceiling']:.3f} (questions whose answer lies inside one chunk)")


def synthetic_chunk(rng: random.Random, alphabet: str, weights: list[float], size: int) -> str:
    return "".join(rng.choices(alphabet, weights, k=size))


def speed(sizes: list[int], queries: int, chunk_chars: int, rerank: bool = True) -> None:
    rng = random.Random(7)
    alphabet = "".join(chr(c) for c in range(0x4E00, 0x4E00 + 3000))
    weights = [1.0 / (r + 1) for r in range(len(alphabet))]          # Zipf-like character frequencies
    for n in sizes:
        index = ChunkIndex(1.2, 0.75, 1.0, **({} if rerank else {"rerank_depth": 0}))
        t0 = time.perf_counter()
        batch: list[dict] = []
        terms: list[dict[str, float]] = []
        doc = 0
        for i in range(n):
            text = synthetic_chunk(rng, alphabet, weights, chunk_chars)
            batch.append({"text": text, "location": {}})
            terms.append(chunk_terms(text, (), 0.0))
            if len(batch) == 1000 or i == n - 1:
                index.add(f"d{doc}", "user:bench", batch, terms, None)
                batch, terms, doc = [], [], doc + 1
        index.compact()                                   # as KnowledgeBase.start does after loading
        built = time.perf_counter() - t0
        keys = list(index.chunks)
        times = []
        for _ in range(queries):
            text = index.chunks[rng.choice(keys)].text
            start = rng.randrange(0, max(1, len(text) - 12))
            q = text[start:start + 12]                    # a 12-character question from a chunk
            t = time.perf_counter()
            index.search(q, ["user:bench"], 10)
            times.append(time.perf_counter() - t)
        print(f"query p50 at {n} chunks: {statistics.median(times) * 1e3:.2f} ms "
              f"(p90 {sorted(times)[int(len(times) * 0.9)] * 1e3:.2f} ms; built in {built:.0f} s)")
        del index


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--docs-per-file", type=int, default=8)
    ap.add_argument("--scale", type=int, nargs="*", default=[10_000],
                    help="synthetic index sizes for the query speed (default 10000; 1000000 needs ~7 GB "
                         "and minutes of CPU, so it runs only when named; 0, or --scale alone, skips it)")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--chunk-chars", type=int, default=40, help="characters of a synthetic chunk")
    ap.add_argument("--big-mb", type=float, default=8.0, help="size of the one-document ingest test")
    ap.add_argument("--target", type=int, help="chunk_target_chars (default: the [knowledge] default)")
    ap.add_argument("--overlap", type=int, help="chunk_overlap_chars (default: the [knowledge] default)")
    ap.add_argument("--split", action="store_true",
                    help="held-out mode: the first and second half of the documents separately")
    ap.add_argument("--no-rerank", action="store_true", help="BM25 order only (no second stage)")
    args = ap.parse_args()
    cfg = make_config(args)
    if args.split:
        asyncio.run(split_recall(args.path, args.docs_per_file, cfg, not args.no_rerank))
    else:
        asyncio.run(recall(args.path, args.docs_per_file, args.big_mb, cfg, not args.no_rerank))
    speed([n for n in args.scale if n > 0], args.queries, args.chunk_chars, not args.no_rerank)


if __name__ == "__main__":
    main()
