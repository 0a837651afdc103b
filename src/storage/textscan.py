"""Search over one session's visible messages folded into one string (scanned by ``str.find`` in C).

``SessionText`` holds the casefolded contents of the visible, searchable (not canned, not superseded) messages joined with NUL (which no
query contains, so a match never spans two messages) and the offset where each one starts. It is
built on the first search of a session and kept with the session's in-memory state until the
session changes (its journal ``last_seq`` moves). ``scan`` gives exactly what ``Query.match`` gives
message by message (same scores, same positions), with Python work per *matching* message only.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Any

from .search import Query, searchable

SEP = "\x00"


class SessionText:
    __slots__ = ("seq", "vis", "blob", "starts", "index")

    def __init__(self, seq: int, vis: int, msgs: list[dict[str, Any]]) -> None:
        self.seq, self.vis = seq, vis               # what it was built from: journal seq, vis_start
        folded: list[str] = []
        index: list[int] = []                       # position in msgs of each folded text
        for i in range(vis, len(msgs)):
            c = msgs[i].get("content")
            if isinstance(c, str) and c and searchable(msgs[i]):
                folded.append(c.casefold())
                index.append(i)
        starts, at = [], 0
        for f in folded:
            starts.append(at)
            at += len(f) + 1
        self.blob = SEP.join(folded)
        self.starts = starts                        # offset of each folded text in blob
        self.index = index

    def _hits(self, needle: str) -> dict[int, tuple[int, int]]:
        """k -> (position of the first occurrence in text k, occurrences in it, non-overlapping)."""
        blob, starts, out = self.blob, self.starts, {}
        find, count = blob.find, blob.count
        n, last = len(blob), len(starts) - 1
        pos = find(needle)
        while pos >= 0:
            k = bisect_right(starts, pos) - 1
            end = starts[k + 1] - 1 if k < last else n
            out[k] = (pos - starts[k], count(needle, pos, end))
            pos = find(needle, end)
        return out

    def scan(self, q: Query) -> list[tuple[int, float, int]]:
        """(position in msgs, score, position of the first match) of every matching message."""
        whole = self._hits(q.text)
        res = {k: (1.5 + 0.1 * min(c - 1, 4), p) for k, (p, c) in whole.items()}  # as Query.match
        if len(q.tokens) >= 2:
            found: dict[int, list[int]] = {}
            for t in q.tokens:
                for k, (p, _) in self._hits(t).items():
                    if k not in whole:
                        found.setdefault(k, []).append(p)
            for k, ps in found.items():
                res[k] = (round(len(ps) / len(q.tokens), 4), min(ps))
        index = self.index
        return [(index[k], s, p) for k, (s, p) in sorted(res.items())]    # in message order


def session_text(cache: SessionText | None, seq: int, vis: int, msgs: list[dict[str, Any]]) -> SessionText:
    """``cache`` if it was built from this state, else a new one."""
    if cache is not None and cache.seq == seq and cache.vis == vis:
        return cache
    return SessionText(seq, vis, msgs)
