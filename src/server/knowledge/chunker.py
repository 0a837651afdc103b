"""Structure-aware chunking: a heading starts a new section; a section's paragraphs are packed into
chunks of about ``target`` characters; a paragraph too long for one chunk is cut at sentence ends
(。！？ and . ! ? followed by a space, ; and ； as a fallback), a sentence too long at ``target``
characters. Consecutive chunks of one section share ``overlap`` characters (whole trailing
sentences where they fit). Every chunk keeps its heading path, page and line range.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from server.knowledge.blocks import Block

_SENTENCE_END = re.compile(r"(?<=[。！？!?…])\s*|(?<=[.;；])\s+|(?<=\n)")


@dataclass(slots=True)
class Chunk:
    text: str
    heading: tuple[str, ...]
    page: int | None
    line_start: int | None
    line_end: int | None

    def location(self) -> dict:
        loc: dict = {}
        if self.heading:
            loc["heading"] = list(self.heading)
        if self.page is not None:
            loc["page"] = self.page
        if self.line_start is not None:
            loc["lines"] = [self.line_start, self.line_end]
        return loc


def format_location(loc: dict) -> str:
    """``Install > Linux, p. 3, lines 10-24`` (the part after § in a citation)."""
    parts = []
    if loc.get("heading"):
        parts.append(" > ".join(loc["heading"]))
    if loc.get("page") is not None:
        parts.append(f"p. {loc['page']}")
    if loc.get("lines"):
        a, b = loc["lines"]
        parts.append(f"line {a}" if a == b else f"lines {a}-{b}")
    return ", ".join(parts) or "start"


def citation(name: str, loc: dict) -> str:
    """``[name §location]``."""
    return f"[{name} §{format_location(loc)}]"


def sentences(text: str, target: int) -> list[str]:
    """``text`` cut at sentence ends; pieces longer than ``target`` cut every ``target`` characters."""
    out = []
    for s in _SENTENCE_END.split(text):
        if not s.strip():
            continue
        while len(s) > target:
            out.append(s[:target])
            s = s[target:]
        out.append(s)
    return out


def _space(before: str, after: str) -> str:
    """What rejoins two sentences of one paragraph: a space between Latin text, nothing in CJK."""
    return " " if before[-1:].isascii() and after[:1].isascii() else ""


def _merge(a: int | None, b: int | None, pick) -> int | None:
    return b if a is None else a if b is None else pick(a, b)


def chunk_blocks(blocks: list[Block], target: int, overlap: int) -> list[Chunk]:
    out: list[Chunk] = []
    path: list[tuple[int, str]] = []
    cur: list[Block] = []          # pieces of the chunk being built (text already cut to fit)
    glue: list[str] = []           # what joins each piece to the one before: "\n" or "" (same paragraph)
    size = 0
    carried = 0                    # leading pieces of ``cur`` repeated from the previous chunk

    def heading() -> tuple[str, ...]:
        return tuple(t for _, t in path)

    def emit() -> None:
        nonlocal cur, glue, size, carried
        if len(cur) <= carried:
            return
        text = "".join(g + p.text for g, p in zip(glue, cur)).strip()
        if text:
            ls = le = pg = None
            for p in cur:
                ls = _merge(ls, p.line_start, min)
                le = _merge(le, p.line_end, max)
                pg = _merge(pg, p.page, min)
            out.append(Chunk(text, heading(), pg, ls, le))
        # overlap: carry whole trailing sentences of the last piece (up to ``overlap`` characters)
        carry: list[Block] = []
        if overlap:
            keep = 0
            for last in reversed(cur):
                parts = sentences(last.text, target)
                while parts and keep + len(parts[-1]) <= overlap:
                    keep += len(parts[-1])
                    carry.insert(0, Block(parts.pop(), 0, last.page, last.line_end, last.line_end))
                if parts:
                    break
            if len(carry) == len(cur) and all(c.text == p.text for c, p in zip(carry, cur)):
                carry = []                           # the whole chunk fits in the overlap: no repeat
        cur, glue = carry, [""][:len(carry)] + [_space(a.text, b.text) for a, b in zip(carry, carry[1:])]
        size = sum(len(p.text) for p in carry)
        carried = len(carry)

    def add(piece: Block, sep: str) -> None:
        nonlocal size
        cur.append(piece)
        glue.append(sep if len(cur) > 1 else "")
        size += len(piece.text) + len(glue[-1])

    for b in blocks:
        if b.is_heading:
            emit()
            cur, glue, size, carried = [], [], 0, 0
            while path and path[-1][0] >= b.level:
                path.pop()
            path.append((b.level, b.text.strip()))
            continue
        if not b.text.strip():
            continue
        if size + 1 + len(b.text) <= target:
            add(b, "\n")
            continue
        if len(b.text) <= target:
            emit()
            add(b, "\n")
            continue
        sep = "\n"
        for s in sentences(b.text, target):        # a long paragraph: sentence by sentence
            if size + len(s) > target and cur:
                emit()
                sep = ""
            add(Block(s, 0, b.page, b.line_start, b.line_end), sep or (_space(cur[-1].text, s) if cur else ""))
            sep = ""
    emit()
    return out
