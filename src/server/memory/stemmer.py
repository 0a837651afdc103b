"""English stemming for the analyzer: the Porter algorithm as compiled by PyStemmer (Snowball).

``stem("connections") == stem("connected") == "connect"``. Words shorter than three letters and
words with characters other than ASCII letters are returned unchanged (so "k8s" stays "k8s").
Results are memoized (bounded cache). A PyStemmer object must not be shared between threads,
so each thread gets its own (ingestion analyzes text in worker threads).
"""
from __future__ import annotations

import threading
from functools import lru_cache

import Stemmer

ALGORITHM = "porter"            # the 1980 Porter rules, as the index has always used

_local = threading.local()


def _stemmer() -> Stemmer.Stemmer:
    s = getattr(_local, "stemmer", None)
    if s is None:
        s = _local.stemmer = Stemmer.Stemmer(ALGORITHM)
    return s


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """The Porter stem of a lowercase English word."""
    if len(word) < 3 or not word.isascii() or not word.isalpha():
        return word
    return _stemmer().stemWord(word)
