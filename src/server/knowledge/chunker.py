"""Structure-aware chunking: a heading starts a new section; a section's paragraphs are packed into
chunks of about ``target`` characters; a paragraph too long for one chunk is cut at line ends, and
a line too long for one chunk at sentence ends (。！？ and . ! ? followed by a space, ; and ；), a
sentence too long at ``target`` characters, so a line that fits (a csv record, a config line) is
never cut. Consecutive chunks of one section share ``overlap`` characters (whole trailing lines or
sentences where they fit). Every chunk keeps its heading path, page and line range. A chunk that
begins inside a table's rows (blocks with a ``header``) starts with the table's header row, counted in
the target, so every quoted row says which column is which.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from server.knowledge.blocks import Block

# a table's header row is repeated at the start of a chunk only when it (and its line end) takes at
# most this share of the chunk target: a longer one would crowd out the rows it names
TABLE_HEADER_MAX_SHARE = 0.5
_SENTENCE_END = re.compile(r"(?<=[。！？!?…])\s*|(?<=[.;；])\s+|(?<=\n)")
_NOT_SPACE = re.compile(r"\S")
# sentence ends are searched for in windows of this many times the chunk target, so that no single
# regex call (which holds the GIL) scans more: a 25 MB line without a sentence end was one call of
# 1-2.4 s, stalling every client of the server
SENTENCE_SEARCH_WINDOW_TARGETS = 2


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


def _space_end(text: str, pos: int, window: int) -> int:
    """Where the whitespace run at ``pos`` ends, each regex call scanning at most ``window`` characters."""
    n = len(text)
    while pos < n:
        m = _NOT_SPACE.search(text, pos, min(n, pos + window))
        if m is not None:
            return m.start()
        pos = min(n, pos + window)
    return n


def _sentence_ends(text: str, window: int) -> list[tuple[int, int]]:
    """The (start, end) of the matches of ``_SENTENCE_END`` in ``text``, exactly as ``finditer`` gives
    them, but each regex call scanning at most ``window`` characters (``finditer`` scans a line
    without a sentence end in one call). A match a window's end cuts short (a whitespace run) is
    extended to the run's end; a position a window's end cut off is searched again in the next."""
    out: list[tuple[int, int]] = []
    n, pos, empty_at = len(text), 0, -1
    while True:
        end = min(n, pos + window)
        m = _SENTENCE_END.search(text, pos, end)
        if m is not None and m.start() == m.end() == empty_at:
            # as finditer: no second empty match where one was found
            m = _SENTENCE_END.search(text, pos + 1, end) if pos < end else None
        if m is None:
            if end >= n:
                return out
            pos = end                                  # (the window's end is searched again, whole)
            continue
        a, b = m.span()
        if b == end < n and a > 0 and text[a - 1] != "\n":
            b = _space_end(text, b, window)            # "\s*" / "\s+" cut short by the window
        out.append((a, b))
        empty_at = b if a == b else -1
        pos = b


def _spans(text: str, target: int) -> list[tuple[int, int]]:
    """(start, end) of the sentences of ``text``, whitespace trimmed; a sentence longer than ``target``
    is cut at the last whitespace of its second half before ``target`` characters, else at ``target``."""
    out: list[tuple[int, int]] = []
    bounds = [0]
    for start, end in _sentence_ends(text, max(1, SENTENCE_SEARCH_WINDOW_TARGETS * target)):
        bounds += [start, end]
    bounds.append(len(text))
    for i in range(0, len(bounds), 2):
        a, b = bounds[i], bounds[i + 1]
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        while b - a > target:
            cut = a + target
            k = cut
            while k > a + target // 2 and not text[k].isspace():
                k -= 1
            if text[k].isspace():
                cut = k
                while cut > a and text[cut - 1].isspace():
                    cut -= 1
            out.append((a, cut))
            a = cut
            while a < b and text[a].isspace():
                a += 1
        if a < b:
            out.append((a, b))
    return out


def _line_spans(text: str, target: int) -> list[tuple[int, int]]:
    """(start, end) of the pieces a chunk is built from: the lines of ``text``, whitespace trimmed,
    a line of at most ``target`` characters whole (a csv record's ``column: value; ...`` line is
    never cut at its "; " or at a ". " in a cell), a longer one cut at its sentence ends (``_spans``)."""
    out: list[tuple[int, int]] = []
    a = 0
    while a < len(text):
        b = text.find("\n", a)
        b = len(text) if b < 0 else b + 1
        line = text[a:b]
        kept = line.strip()
        if len(kept) > target:
            out += [(a + x, a + y) for x, y in _spans(line, target)]
        elif kept:
            lead = a + len(line) - len(line.lstrip())
            out.append((lead, lead + len(kept)))
        a = b
    return out


def sentences(text: str, target: int) -> list[str]:
    """``text`` cut at sentence ends; pieces longer than ``target`` cut every ``target`` characters."""
    return [text[a:b] for a, b in _spans(text, target)]


@dataclass(slots=True)
class _Piece:
    """A run of one paragraph's text with its own location, and the text that preceded it there."""
    text: str
    para: int                      # the paragraph (block) it comes from
    gap: str                       # the source text between it and the previous piece of its paragraph
    page: int | None
    line_start: int | None
    line_end: int | None
    header: str | None = None      # its table's header row (a table row's piece), repeated atop a chunk

    def cut(self, target: int) -> list[_Piece]:
        """Its lines (a line longer than ``target``: its sentences), each with its own line range
        when the text is line for line its source lines (text formats, csv rows; else the whole
        range: html collapses whitespace, csv may drop empty rows and cells, a one-line json is
        pretty-printed)."""
        t, ls, le = self.text, self.line_start, self.line_end
        exact = ls is not None and le is not None and t.count("\n") == le - ls
        out, prev, pos, line = [], None, 0, ls
        for a, b in _line_spans(t, target):
            if exact:
                line += t.count("\n", pos, a)
                first = line
                line += t.count("\n", a, b)
                pos = b
                ls, le = first, line
            out.append(_Piece(t[a:b], self.para, self.gap if prev is None else t[prev:a], self.page, ls, le,
                              self.header))
            prev = b
        return out


def _merge(a: int | None, b: int | None, pick) -> int | None:
    return b if a is None else a if b is None else pick(a, b)


def chunk_blocks(blocks: list[Block], target: int, overlap: int) -> list[Chunk]:
    """Chunks of at most ``target`` characters. A heading or a new page (pdf) closes the chunk, so a
    chunk comes from one page and one section; within a paragraph, the pieces of a chunk are joined by
    the text between them in the source (line ends kept), so a chunk of a text format is a verbatim run
    of its lines ``line_start``..``line_end``. A chunk whose first piece is a table row (a block with a
    ``header``) begins with that header row and a line end, counted in ``target`` (not in the line
    range: the lines cited are the rows'); a header over ``TABLE_HEADER_MAX_SHARE`` of the target is
    not repeated."""
    out: list[Chunk] = []
    path: list[tuple[int, str]] = []
    cur: list[_Piece] = []         # pieces of the chunk being built (text already cut to fit)
    glue: list[str] = []           # what joins each piece to the one before
    size = 0
    carried = 0                    # leading pieces of ``cur`` repeated from the previous chunk

    def heading() -> tuple[str, ...]:
        return tuple(t for _, t in path)

    def head(p: _Piece) -> int:
        """Characters the header of a chunk beginning with ``p`` takes (its table's header row, a line end)."""
        return 0 if p.header is None else len(p.header) + 1

    def cost(p: _Piece) -> int:
        """Characters ``p`` adds to the chunk being built: its joint, its text, the header it brings."""
        return len(joint(p)) + len(p.text) + head(cur[0] if cur else p)

    def joint(p: _Piece) -> str:
        """What goes before ``p`` in the chunk: its source gap within a paragraph, else a line end."""
        if not cur:
            return ""
        return p.gap if cur[-1].para == p.para else "\n"

    def emit() -> None:
        nonlocal cur, glue, size, carried
        if len(cur) <= carried:
            return
        text = "".join(g + p.text for g, p in zip(glue, cur)).strip()
        if text and cur[0].header is not None:
            text = cur[0].header + "\n" + text             # a chunk begun inside a table: its header first
        if text:
            ls = le = None
            for p in cur:
                ls = _merge(ls, p.line_start, min)
                le = _merge(le, p.line_end, max)
            out.append(Chunk(text, heading(), cur[0].page, ls, le))    # (one page: a new page closes it)
        # overlap: carry whole trailing sentences of the last piece (up to ``overlap`` characters)
        carry: list[_Piece] = []
        if overlap:
            keep = 0
            for last in reversed(cur):
                parts = last.cut(target)
                while parts and keep + len(parts[-1].text) <= overlap:
                    keep += len(parts[-1].text)
                    carry.insert(0, parts.pop())
                if parts:
                    break
            if len(carry) == len(cur) and all(c.text == p.text for c, p in zip(carry, cur)):
                carry = []                           # the whole chunk fits in the overlap: no repeat
        cur, glue, size = [], [], 0
        for p in carry:
            add(p)
        carried = len(carry)

    def add(piece: _Piece) -> None:
        nonlocal size
        glue.append(joint(piece))
        cur.append(piece)
        size += len(piece.text) + len(glue[-1])

    def make_room(p: _Piece) -> None:
        """After emit(): drop repeated (carried) pieces that would push ``p`` past the target."""
        nonlocal cur, glue, size, carried
        while carried and size + cost(p) > target:
            cur, carried = cur[1:], carried - 1
            glue = [""] + glue[2:] if cur else []
            size = sum(len(x.text) for x in cur) + sum(map(len, glue))

    def restart() -> None:
        nonlocal cur, glue, size, carried
        emit()
        cur, glue, size, carried = [], [], 0, 0

    for i, b in enumerate(blocks):
        if b.is_heading:
            restart()
            while path and path[-1][0] >= b.level:
                path.pop()
            path.append((b.level, b.text.strip()))
            continue
        if not b.text.strip():
            continue
        if cur and b.page != cur[-1].page:
            restart()                                # a chunk never spans two pages
        header = b.header if b.header and len(b.header) + 1 <= target * TABLE_HEADER_MAX_SHARE else None
        whole = _Piece(b.text, i, "", b.page, b.line_start, b.line_end, header)
        if size + cost(whole) <= target:
            add(whole)
            continue
        if len(b.text) + head(whole) <= target:
            emit()
            make_room(whole)
            add(whole)
            continue
        for s in whole.cut(target - head(whole)):    # a long paragraph: sentence by sentence
            if cur and size + cost(s) > target:
                emit()
                make_room(s)
            add(s)
    emit()
    return out
