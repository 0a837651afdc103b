"""Long pasted-log-like texts for tests of what a long message costs."""
from __future__ import annotations

import random


def paste(rng: random.Random, n: int, words: tuple[str, ...] | list[str]) -> str:
    """``n`` characters of log-like text: ``words`` drawn at random, each maybe with a number."""
    out: list[str] = []
    size = 0
    while size < n:
        w = rng.choice(words) + rng.choice(("", str(rng.randint(0, 99999))))
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n]
