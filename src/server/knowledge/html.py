"""Reading an html file: the visible text of its block elements, ``h1``-``h6`` as headings, table rows
as ``a | b | c`` lines (as docx tables; the first row of a table is its header, carried by the other
rows' blocks for the chunker to repeat), script/style/head dropped, parsed in one pass with the stdlib
``html.parser`` (HTML5's rules for comments and ``<![``), at most ``html_max_tags`` tags and other
markup read, the text counted toward the parse's ``Budget`` (a nested table's text at every level
it is copied into). Markup left open at the end of the file is dropped, never indexed."""
from __future__ import annotations

import re
from html.parser import HTMLParser

from server.knowledge.blocks import Block
from server.knowledge.budget import Budget
from server.knowledge.config import KnowledgeConfig
from server.knowledge.encodings import decode_text, unsupported

_COMMENT_END = re.compile(r"--!?>")          # where an html comment ends (HTML5)


class _HtmlTable:
    """A table being read: the cells of its open row, the parts of its open cell (its text, and the
    row lines of a table nested in it), where the row began, its first row (taken for its header)."""
    __slots__ = ("row", "cell", "row_line", "header")

    def __init__(self) -> None:
        self.row: list[str] | None = None
        self.cell: list[str] | None = None
        self.row_line = 0
        self.header: str | None = None


class _HtmlBlocks(HTMLParser):
    BLOCK = {"p", "div", "li", "pre", "blockquote", "section", "article", "dd", "dt",
             "br", "ul", "ol", "header", "footer", "main", "nav", "figcaption", "caption"}
    CELL = {"td", "th"}
    SKIP = {"script", "style", "noscript", "template"}
    # elements without an end tag: hidden, they hide nothing after them
    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "keygen", "link", "meta", "param",
            "source", "track", "wbr"}
    # the start tags that end an open <p> (HTML5): a hidden <p> left open ends there
    P_CLOSERS = BLOCK - {"br", "caption"} | {
        "table", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "dl", "form", "figure", "aside", "address",
        "details", "fieldset", "menu", "p"}
    # what may stand in <head>; any other start tag (or text outside <title>) ends it, as in HTML5
    HEAD = {"head", "title", "meta", "link", "base", "style", "script", "noscript", "template"}

    def __init__(self, budget: Budget, max_tags: int) -> None:
        super().__init__(convert_charrefs=True)
        self.budget = budget
        self.tags_left = max_tags      # html_max_tags: each tag costs the stdlib parser microseconds
        self.blocks: list[Block] = []
        self.buf: list[str] = []
        self.skip = 0
        self.heading = 0
        self.start_line = 1
        self.in_head = False
        self.head_done = False         # a <head> after the head (or the body) began is ignored
        self.in_title = False
        self.tables: list[_HtmlTable] = []   # open tables, innermost last
        self.hidden: str | None = None       # the tag of the hidden element being skipped (``_is_hidden``)
        self.hidden_depth = 0                # ... and how many elements of that tag are open in it

    def flush(self, level: int = 0) -> None:
        text = " ".join("".join(self.buf).split())
        if text:
            line = self.getpos()[0]
            self.blocks.append(Block(text, level, None, self.start_line, line))
            self.budget.add(len(text))
        self.buf = []
        self.start_line = self.getpos()[0]

    # Tables: a row is one ``a | b | c`` line, as in docx (a table in a cell gives lines of that cell).
    def _in_cell(self) -> bool:
        return bool(self.tables) and self.tables[-1].cell is not None

    def _cell_text(self) -> str:
        """The text gathered since the cell (or the table nested in it) began, counted."""
        text = " ".join("".join(self.buf).split())
        self.buf = []
        self.budget.add(len(text))
        return text

    def _end_cell(self) -> None:
        t = self.tables[-1]
        if t.cell is not None:
            t.cell.append(self._cell_text())
            assert t.row is not None
            t.row.append("\n".join(p for p in t.cell if p))
            t.cell = None

    def _end_row(self) -> None:
        t = self.tables[-1]
        self._end_cell()
        row, t.row = t.row, None
        if not row or not any(row):
            return
        text = " | ".join(row)
        self.budget.add(3 * (len(row) - 1))
        if len(self.tables) > 1 and self.tables[-2].cell is not None:
            # a line of the enclosing table's cell: its text is copied again at every level of
            # nesting, so each copy counts (120,000 nested tables around 16 MB of text: 210 s)
            self.budget.add(len(text))
            self.tables[-2].cell.append(text)
        else:
            # the rows after the first carry it as their header: a chunk begun among them starts with it
            self.blocks.append(Block(text, 0, None, t.row_line, self.getpos()[0], t.header))
            self.start_line = self.getpos()[0]
            if t.header is None:
                t.header = text

    def _start_row(self, t: _HtmlTable) -> None:
        if len(self.tables) == 1 or self.tables[-2].cell is None:
            self.flush()                    # text in the table outside its cells: a block of its own
        t.row, t.row_line = [], self.getpos()[0]

    def _table_tag(self, tag: str, start: bool) -> None:
        """<table>, <tr>, <td>, <th>, start or end (a cell or row left open ends where the next
        begins, or with its table)."""
        if tag == "table" and start:
            if self._in_cell():
                self.tables[-1].cell.append(self._cell_text())    # type: ignore[union-attr]
            else:
                self.flush(self.heading)
                self.heading = 0
            self.tables.append(_HtmlTable())
        elif not self.tables:               # a row or cell outside any table: a block, as before
            self.flush(self.heading)
            self.heading = 0
        elif tag == "table":
            self._end_row()
            self.tables.pop()
            if not self._in_cell():
                self.flush()
        elif tag == "tr":
            self._end_row()
            if start:
                self._start_row(self.tables[-1])
        elif start:                         # a cell (its row begins with it when no <tr> was seen)
            t = self.tables[-1]
            self._end_cell()
            if t.row is None:
                self._start_row(t)
            t.cell = []
        else:
            self._end_cell()

    def close_tables(self) -> None:
        """At the end of the file: the tables, rows and cells left open end there."""
        while self.tables:
            self._table_tag("table", False)

    def _end_head(self) -> None:
        self.in_head = self.in_title = False
        self.head_done = True

    def _count_tag(self) -> None:
        self.tags_left -= 1
        if self.tags_left < 0:
            raise unsupported("html holds too many tags (limit html_max_tags)")

    # Other markup costs the parser as much as a tag (``</>``, ``<?x>``, ``<!x>``, comments): counted too
    def handle_comment(self, data: str) -> None:
        self._count_tag()

    def handle_pi(self, data: str) -> None:
        self._count_tag()

    def handle_decl(self, decl: str) -> None:
        self._count_tag()

    def unknown_decl(self, data: str) -> None:
        self._count_tag()

    def parse_endtag(self, i: int) -> int:
        if self.rawdata.startswith("</>", i):    # skipped by the stdlib without a callback
            self._count_tag()
        return super().parse_endtag(i)

    @staticmethod
    def _is_hidden(attrs: list) -> bool:
        """Whether an element with these attributes is hidden from the reader: ``hidden`` (but
        ``hidden="until-found"``, found and shown by the browser's search), ``aria-hidden="true"``,
        or a ``style`` with ``display: none`` or ``visibility: hidden`` / ``collapse``."""
        for name, value in attrs:
            value = (value or "").strip().lower()
            if name == "hidden" and value != "until-found":
                return True
            if name == "aria-hidden" and value == "true":
                return True
            if name == "style":
                for decl in value.split(";"):
                    prop, _, val = decl.partition(":")
                    val = val.replace("!important", "").strip()
                    prop = prop.strip()
                    if (prop == "display" and val == "none") or (prop == "visibility" and val in ("hidden", "collapse")):
                        return True
        return False

    def _separate(self, tag: str) -> None:
        """Where a hidden element that is a block (a paragraph, a heading, a cell) begins or ends: its
        neighbours' text is not run together (a space inside a cell, else a block boundary)."""
        if tag in self.BLOCK or tag in self.CELL or tag in ("tr", "table") or re.fullmatch(r"h[1-6]", tag):
            if self._in_cell():
                self.buf.append(" ")
            else:
                self.flush(self.heading)
                self.heading = 0

    def _hidden_start(self, tag: str, attrs: list) -> bool:
        """A start tag, seen for hidden text: True when it is skipped (inside a hidden element, or
        one beginning: its text, its nested elements, its own end tag are all left out, as docx
        hidden runs are: text the reader never sees is not indexed to be quoted to them)."""
        if self.hidden is not None:
            if self.hidden == "p" and tag in self.P_CLOSERS:
                self.hidden, self.hidden_depth = None, 0      # a hidden <p> left open ends here
            else:
                if tag == self.hidden:
                    self.hidden_depth += 1
                return True
        if self.skip or tag in ("html", "head", "body") or not self._is_hidden(attrs):
            return False
        if tag in self.VOID:
            return True                         # (a hidden <br> breaks no line; nothing to hide after it)
        self._separate(tag)
        self.hidden, self.hidden_depth = tag, 1
        return True

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        """``<x/>``: as HTML5, the slash is ignored on an element that is not void where hiding is
        concerned: ``<div hidden/>`` hides what follows up to its ``</div>``, and a ``<div/>`` inside
        a hidden element is one more ``div`` its ``</div>`` must close."""
        hidden = self.hidden is not None or (not self.skip and self._is_hidden(attrs))
        self.handle_starttag(tag, attrs)
        if not hidden or tag in self.VOID:
            self.handle_endtag(tag)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.budget.check()
        self._count_tag()
        if tag == "head":
            self.in_head = not self.head_done
            return
        if tag == "html":
            return
        if self.in_head and tag not in self.HEAD:
            self._end_head()
        elif not self.in_head and tag not in self.HEAD:
            self.head_done = True
        if self._hidden_start(tag, attrs):
            return
        if tag == "title" and self.in_head:
            self.in_title = True
        elif tag in self.SKIP:
            self.skip += 1
        elif tag in self.CELL or tag in ("tr", "table"):
            self._table_tag(tag, True)
        elif self._in_cell():
            if tag in self.BLOCK or re.fullmatch(r"h[1-6]", tag):
                self.buf.append(" ")    # a line or paragraph inside a cell: a space in its text
        elif re.fullmatch(r"h[1-6]", tag):
            self.flush()
            self.heading = int(tag[1])
        elif tag in self.BLOCK:        # (an unclosed heading ends where a block begins)
            self.flush(self.heading)
            self.heading = 0

    def handle_endtag(self, tag: str) -> None:
        self._count_tag()
        if self.hidden is not None:
            if tag == self.hidden:
                self.hidden_depth -= 1
                if not self.hidden_depth:
                    self.hidden = None
                    self._separate(tag)
            return
        if tag == "head":
            if self.in_head:
                self._end_head()
        elif tag == "title":
            self.in_title = False
        elif tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag in self.CELL or tag in ("tr", "table"):
            self._table_tag(tag, False)
        elif self._in_cell():
            if tag in self.BLOCK or re.fullmatch(r"h[1-6]", tag):
                self.buf.append(" ")
        elif re.fullmatch(r"h[1-6]", tag) and self.heading:
            self.flush(self.heading)
            self.heading = 0
        elif tag in self.BLOCK:
            self.flush()

    # Comments and "<![...": HTML5's rules, not the stdlib's SGML ones (which wait for "-->" after
    # "<!-->" or "--!>", dropping the rest of the file, and raise AssertionError on "<![foo[").
    def parse_comment(self, i: int, report: int = 1) -> int:
        """``<!--`` at ``i``: ends at ``-->`` or ``--!>``; ``<!-->`` and ``<!--->`` are empty
        comments. -1 when the comment is still open (at the end of the file: dropped)."""
        rawdata = self.rawdata
        for empty in ("<!-->", "<!--->"):
            if rawdata.startswith(empty, i):
                return i + len(empty)
        m = _COMMENT_END.search(rawdata, i + 4)
        if m is None:
            return -1
        if report:
            self.handle_comment(rawdata[i + 4:m.start()])
        return m.end()

    def parse_marked_section(self, i: int, report: int = 1) -> int:
        """``<![`` at ``i`` (``<![CDATA[``, Word's ``<![if ...]>`` / ``<![endif]>``, anything): outside
        svg/math content HTML5 reads it as a bogus comment ending at the first ``>``."""
        return self.parse_bogus_comment(i, report)

    def close(self) -> None:
        """End of the file. Markup still open there (a tag, an attribute value, a comment, a
        declaration) is dropped, as HTML5 does: ``HTMLParser.close`` hands it over as text."""
        if len(self.rawdata) > 1 and self.rawdata[0] == "<":
            self.rawdata = ""
        super().close()

    def handle_data(self, data: str) -> None:
        if self.skip or self.hidden is not None:
            return
        if self.in_head:
            if self.in_title or not data.strip():
                return
            self._end_head()           # text outside <title>: the body has begun
        self.buf.append(data)


def parse_html(data: bytes, cfg: KnowledgeConfig, budget: Budget) -> list[Block]:
    """Visible text of block elements; h1..h6 become headings; script/style/head are dropped
    (the head ends at ``</head>`` or where the body implicitly begins). Markup left open at the end
    of the file (a tag, an attribute value, a comment) is dropped, not indexed. The text is fed
    at once: fed in pieces, a tag or comment left open was scanned again at every piece (time
    growing with the square of its length); cancellation is checked at every start tag, and at
    most ``html_max_tags`` tags are read (time is linear in them, but each costs microseconds)."""
    p = _HtmlBlocks(budget, cfg.html_max_tags)
    p.feed(decode_text(data))
    p.close()
    p.close_tables()
    p.flush()
    return p.blocks
