"""Answer recall of the knowledge base on SQuAD-format data, plus ingest and query speed.

Usage: python bench/kb_recall.py PATH [--docs-per-file 8] [--scale 10000 1000000] [--queries 200]

Data: SQuAD format (``data[].title``, ``data[].paragraphs[].context``, ``.qas[].question``,
``.qas[].answers[].text``), e.g. CMRC 2018. Paragraphs are packed 8 to a markdown document, each
under a ``# title`` heading, and ingested through the real pipeline (``KnowledgeBase.ingest``:
parse, chunk, index, store). Every question is asked; a question counts at k when a gold answer
string occurs in one of the top-k passages (answer-in-top-k).

Lines printed:
  baseline top1 X top5 Y top10 Z   BM25 (k1=1.2, b=0.75) over character bigrams of the same chunks
  default  top1 X top5 Y top10 Z   KnowledgeBase.search as the server runs it
  ingest: MB/s of text through the pipeline
  query p50 at N chunks: synthetic CJK chunks (Zipf-distributed characters) in one collection,
  through the same ChunkIndex (``--scale`` sizes; 1M takes minutes and several GB of memory).
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


def load(path: str) -> tuple[list[tuple[str, str]], list[tuple[str, list[str]]]]:
    """(title, context) per paragraph and (question, answers) per question."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    paras, qas = [], []
    for article in data["data"]:
        title = str(article.get("title") or article.get("id") or "untitled")
        for p in article["paragraphs"]:
            paras.append((title, p["context"]))
            for qa in p["qas"]:
                answers = [a["text"] for a in qa.get("answers", []) if a.get("text")]
                if answers:
                    qas.append((qa["question"], answers))
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


def score(ranked: list[list[str]], qas: list[tuple[str, list[str]]]) -> dict[int, float]:
    out = {}
    for k in KS:
        hits = sum(1 for texts, (_, answers) in zip(ranked, qas)
                   if any(a in t for t in texts[:k] for a in answers))
        out[k] = hits / len(qas)
    return out


def line(label: str, s: dict[int, float]) -> str:
    return f"{label} " + " ".join(f"top{k} {s[k]:.3f}" for k in KS)


async def recall(path: str, per_file: int, big_mb: float = 8.0) -> None:
    paras, qas = load(path)
    files = pack(paras, per_file)
    with tempfile.TemporaryDirectory() as root:
        kb = KnowledgeBase(KnowledgeConfig(), root)
        await kb.start()
        t0 = time.perf_counter()
        for name, data in files:
            await kb.ingest("bench", [], None, name, data)
        took = time.perf_counter() - t0
        mb = sum(len(d) for _, d in files) / 1e6
        chunks = [ch.text for ch in kb.index.chunks.values()]
        base = BM25Index(1.2, 0.75)
        for i, text in enumerate(chunks):
            base.add(i, bigrams(text))
        base_ranked = [[chunks[i] for i, _ in base.search(bigrams(q), max(KS))] for q, _ in qas]
        t1 = time.perf_counter()
        ranked = [[h.text for h in await kb.search("bench", [], q, max(KS))] for q, _ in qas]
        qt = (time.perf_counter() - t1) / len(qas)
        big = b"\n\n".join(data for _, data in files) * max(1, int(big_mb * 1e6 // max(1, sum(len(d) for _, d in files))))
        t2 = time.perf_counter()
        await kb.ingest("bench", [], None, "big.md", big)
        big_took = time.perf_counter() - t2
        await kb.close()
    b, d = score(base_ranked, qas), score(ranked, qas)
    print(f"{len(paras)} paragraphs in {len(files)} documents, {len(chunks)} chunks, {len(qas)} questions")
    print(line("baseline", b))
    print(line("default", d))
    print("ratio    " + " ".join(f"top{k} x{d[k] / b[k]:.3f}" for k in KS if b[k]))
    print(f"ingest: {mb:.2f} MB of text in {len(files)} documents in {took:.2f} s = {mb / took:.2f} MB/s "
          f"(fsync-bound); one {len(big) / 1e6:.1f} MB document: {len(big) / 1e6 / big_took:.2f} MB/s; "
          f"search {qt * 1e3:.2f} ms/question (async, incl. thread hop)")


def synthetic_chunk(rng: random.Random, alphabet: str, weights: list[float], size: int) -> str:
    return "".join(rng.choices(alphabet, weights, k=size))


def speed(sizes: list[int], queries: int, chunk_chars: int) -> None:
    rng = random.Random(7)
    alphabet = "".join(chr(c) for c in range(0x4E00, 0x4E00 + 3000))
    weights = [1.0 / (r + 1) for r in range(len(alphabet))]          # Zipf-like character frequencies
    for n in sizes:
        index = ChunkIndex(1.2, 0.75, 1.0)
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
    ap.add_argument("--scale", type=int, nargs="*", default=[10_000, 1_000_000])
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--chunk-chars", type=int, default=40, help="characters of a synthetic chunk")
    ap.add_argument("--big-mb", type=float, default=8.0, help="size of the one-document ingest test")
    args = ap.parse_args()
    asyncio.run(recall(args.path, args.docs_per_file, args.big_mb))
    speed(args.scale, args.queries, args.chunk_chars)


if __name__ == "__main__":
    main()
