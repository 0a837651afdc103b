"""Document parsers: bytes in, ``Block`` list out. One function per format, chosen by extension.

Refused with UNSUPPORTED_MEDIA: unknown extensions, binary content in a text format, and corrupt
pdf/docx files (with the parser's reason). A docx is a zip: its member sizes and compression ratios
are checked against the configured limits before anything is decompressed (zip bombs).

Every parser counts the characters it produces as it goes (``Budget``) and stops as soon as
``max_extracted_chars`` is passed; a pdf is also bounded per page (``pdf_max_page_chars``), per
stream (``pdf_max_stream_bytes``, pypdf's decompression limits) and in page content interpreted
(``pdf_max_content_bytes``). ``cancelled`` (a callable) is polled at every page / block: a
cancelled parse raises ``Cancelled`` (SHUTTING_DOWN) and frees its thread.
"""
from __future__ import annotations

import csv
import io
import json
import re
import zipfile
from html.parser import HTMLParser
from pathlib import PurePath
from typing import Callable

from protocol import ErrorCode
from server.errors import HandlerError
from server.knowledge.blocks import Block
from server.knowledge.config import KnowledgeConfig
from server.knowledge.encodings import decode_text, unsupported

TEXT_KINDS = {".txt": "text", ".text": "text", ".log": "text", ".md": "markdown", ".markdown": "markdown",
              ".csv": "csv", ".json": "json", ".yaml": "yaml", ".yml": "yaml", ".html": "html", ".htm": "html"}
BINARY_KINDS = {".pdf": "pdf", ".docx": "docx"}
SUPPORTED = sorted(TEXT_KINDS) + sorted(BINARY_KINDS)
CSV_ROWS_PER_BLOCK = 20
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


class Cancelled(HandlerError):
    """The ingest was cancelled (its caller left, the knowledge base is closing)."""

    def __init__(self) -> None:
        super().__init__(ErrorCode.SHUTTING_DOWN, "ingest cancelled (the client left or the server is stopping)")


def _never() -> bool:
    return False


class Budget:
    """The characters a parse has produced so far, against ``max_extracted_chars``, and the
    cancellation check. ``add`` and ``check`` are called at every page / block / piece."""

    __slots__ = ("limit", "total", "cancelled")

    def __init__(self, cfg: KnowledgeConfig, cancelled: Callable[[], bool] | None = None) -> None:
        self.limit = cfg.max_extracted_chars
        self.total = 0
        self.cancelled = cancelled or _never

    def check(self) -> None:
        if self.cancelled():
            raise Cancelled()

    def add(self, n: int) -> None:
        self.total += n
        if self.total > self.limit:
            raise over_limit(self.total, self.limit)
        self.check()


def over_limit(total: int, limit: int) -> HandlerError:
    return unsupported(f"document holds over {limit} characters of text ({total} so far; "
                       f"limit max_extracted_chars = {limit})")


def kind_of(name: str) -> str:
    """The parser kind for a file name (by extension), or UNSUPPORTED_MEDIA."""
    ext = PurePath(name).suffix.lower()
    kind = TEXT_KINDS.get(ext) or BINARY_KINDS.get(ext)
    if kind is None:
        raise unsupported(f"unsupported file type {ext or '(none)'!r}; supported: {' '.join(SUPPORTED)}")
    return kind


def _paragraphs(lines: list[str], first_line: int = 1, page: int | None = None) -> list[Block]:
    """Blank-line separated paragraphs of ``lines`` with their line ranges."""
    out: list[Block] = []
    start = None
    for i, line in enumerate(lines + [""]):
        if line.strip():
            if start is None:
                start = i
        elif start is not None:
            out.append(Block("\n".join(lines[start:i]).strip(), 0, page, first_line + start, first_line + i - 1))
            start = None
    return out


def _counted(lines: list[str], budget: Budget, first_line: int = 1, page: int | None = None) -> list[Block]:
    out = _paragraphs(lines, first_line, page)
    budget.add(sum(len(b.text) for b in out))
    return out


def parse_text(data: bytes, cfg: KnowledgeConfig, budget: Budget) -> list[Block]:
    return _counted(decode_text(data).split("\n"), budget)


def parse_markdown(data: bytes, cfg: KnowledgeConfig, budget: Budget) -> list[Block]:
    """ATX headings (``#`` .. ``######``) and blank-line paragraphs; fenced code stays one block."""
    lines = decode_text(data).split("\n")
    out: list[Block] = []
    body_start, fence = 0, None
    for i, line in enumerate(lines):
        m = _FENCE.match(line)
        if m:
            fence = None if fence == m.group(1) else (fence or m.group(1))
            continue
        if fence is None:
            h = _HEADING.match(line)
            if h:
                out.extend(_counted(lines[body_start:i], budget, body_start + 1))
                out.append(Block(h.group(2), len(h.group(1)), None, i + 1, i + 1))
                budget.add(len(h.group(2)))
                body_start = i + 1
    out.extend(_counted(lines[body_start:], budget, body_start + 1))
    return out


def parse_csv(data: bytes, cfg: KnowledgeConfig, budget: Budget) -> list[Block]:
    """Rows as ``column: value`` lines, a block per ``CSV_ROWS_PER_BLOCK`` rows, located by the lines
    of the file its records span (a quoted cell may hold line ends: a record is not a line). Column
    names have their whitespace (line ends too) collapsed to single spaces, so a block whose text has
    as many line ends as its range has lines is line for line its source (no empty row or cell was
    dropped) and the chunker cites each row's own lines."""
    text = decode_text(data)
    reader = csv.reader(io.StringIO(text))
    records: list[tuple[list[str], int, int]] = []     # (cells, first line, last line) of each record
    try:
        for row in reader:
            records.append((row, records[-1][2] + 1 if records else 1, reader.line_num))
    except csv.Error as exc:
        raise unsupported(f"malformed csv: {exc}") from None
    del text
    if not records:
        return []
    header, _, header_end = records[0]
    names = [" ".join(h.split()) for h in header]
    out = []
    for start in range(1, len(records), CSV_ROWS_PER_BLOCK):    # "column: " repeated per value: counted
        part = records[start:start + CSV_ROWS_PER_BLOCK]
        lines = ["; ".join(f"{h}: {v}" for h, v in zip(names, row) if v.strip()) for row, _, _ in part]
        block = Block("\n".join(x for x in lines if x), 0, None, part[0][1], part[-1][2])
        budget.add(len(block.text))
        out.append(block)
    if len(records) == 1:
        out.append(Block("; ".join(header), 0, None, 1, header_end))
        budget.add(len(out[-1].text))
    return [b for b in out if b.text]


def _too_deep(kind: str) -> HandlerError:
    return unsupported(f"malformed {kind}: nested too deeply")


def parse_json(data: bytes, cfg: KnowledgeConfig, budget: Budget) -> list[Block]:
    """Validated, then indexed as written; a file on one line (minified) is indexed pretty-printed
    (keys stay next to their values, chunks end at line ends) and every block is located on that
    one line of the file, not on the lines of the pretty-printed text. The pretty-printed text is
    counted as it is produced (deep one-line files expand a lot)."""
    text = decode_text(data)
    try:
        obj = json.loads(text)
    except RecursionError:
        raise _too_deep("json") from None
    except ValueError as exc:
        raise unsupported(f"malformed json: {exc}") from None
    if "\n" not in text.strip():
        pieces: list[str] = []
        size = 0
        try:
            for piece in json.JSONEncoder(ensure_ascii=False, indent=2).iterencode(obj):
                pieces.append(piece)
                size += len(piece)
                if size > budget.limit - budget.total:
                    raise over_limit(budget.total + size, budget.limit)
                if len(pieces) % 4096 == 0:
                    budget.check()
        except RecursionError:
            raise _too_deep("json") from None
        line = 1 + text[:len(text) - len(text.lstrip())].count("\n")     # the line holding the json
        text = "".join(pieces)
        del pieces, obj
        blocks = _counted(text.split("\n"), budget)
        for b in blocks:                  # pretty-printed lines are not the file's: cite its one line
            b.line_start = b.line_end = line
        return blocks
    del obj
    return _counted(text.split("\n"), budget)


def parse_yaml(data: bytes, cfg: KnowledgeConfig, budget: Budget) -> list[Block]:
    """Validated with ``yaml.safe_load_all`` (no object construction), indexed as written."""
    import yaml
    text = decode_text(data)
    try:
        for _ in yaml.safe_load_all(text):
            budget.check()
    except RecursionError:
        raise _too_deep("yaml") from None
    except yaml.YAMLError as exc:
        raise unsupported(f"malformed yaml: {str(exc).splitlines()[0]}") from None
    return _counted(text.split("\n"), budget)


class _HtmlBlocks(HTMLParser):
    BLOCK = {"p", "div", "li", "td", "th", "pre", "blockquote", "section", "article", "tr", "dd", "dt",
             "br", "table", "ul", "ol", "header", "footer", "main", "nav", "figcaption", "caption"}
    SKIP = {"script", "style", "noscript", "template"}
    # what may stand in <head>; any other start tag (or text outside <title>) ends it, as in HTML5
    HEAD = {"head", "title", "meta", "link", "base", "style", "script", "noscript", "template"}

    def __init__(self, budget: Budget) -> None:
        super().__init__(convert_charrefs=True)
        self.budget = budget
        self.blocks: list[Block] = []
        self.buf: list[str] = []
        self.skip = 0
        self.heading = 0
        self.start_line = 1
        self.in_head = False
        self.head_done = False         # a <head> after the head (or the body) began is ignored
        self.in_title = False

    def flush(self, level: int = 0) -> None:
        text = " ".join("".join(self.buf).split())
        if text:
            line = self.getpos()[0]
            self.blocks.append(Block(text, level, None, self.start_line, line))
            self.budget.add(len(text))
        self.buf = []
        self.start_line = self.getpos()[0]

    def _end_head(self) -> None:
        self.in_head = self.in_title = False
        self.head_done = True

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "head":
            self.in_head = not self.head_done
            return
        if tag == "html":
            return
        if self.in_head and tag not in self.HEAD:
            self._end_head()
        elif not self.in_head and tag not in self.HEAD:
            self.head_done = True
        if tag == "title" and self.in_head:
            self.in_title = True
        elif tag in self.SKIP:
            self.skip += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self.flush()
            self.heading = int(tag[1])
        elif tag in self.BLOCK:        # (an unclosed heading ends where a block begins)
            self.flush(self.heading)
            self.heading = 0

    def handle_endtag(self, tag: str) -> None:
        if tag == "head":
            if self.in_head:
                self._end_head()
        elif tag == "title":
            self.in_title = False
        elif tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        elif re.fullmatch(r"h[1-6]", tag) and self.heading:
            self.flush(self.heading)
            self.heading = 0
        elif tag in self.BLOCK:
            self.flush()

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        if self.in_head:
            if self.in_title or not data.strip():
                return
            self._end_head()           # text outside <title>: the body has begun
        self.buf.append(data)


HTML_FEED_CHARS = 1 << 16


def parse_html(data: bytes, cfg: KnowledgeConfig, budget: Budget) -> list[Block]:
    """Visible text of block elements; h1..h6 become headings; script/style/head are dropped
    (the head ends at ``</head>`` or where the body implicitly begins)."""
    p = _HtmlBlocks(budget)
    text = decode_text(data)
    for start in range(0, len(text), HTML_FEED_CHARS):
        p.feed(text[start:start + HTML_FEED_CHARS])
        budget.check()
    del text
    p.close()
    p.flush()
    return p.blocks


class _PageFull(BaseException):
    """Raised from pypdf's visitor: a BaseException, so pypdf's ``except Exception`` around form
    XObjects does not swallow it and the page's extraction stops at once."""


def _content_bytes(page) -> int:
    """Decoded size of a page's content streams (pypdf caches the decoded data)."""
    contents = page.get("/Contents")
    if contents is None:
        return 0
    contents = contents.get_object()
    streams = contents if isinstance(contents, list) else [contents]
    total = 0
    for s in streams:
        s = s.get_object()
        if hasattr(s, "get_data"):
            total += len(s.get_data())
    return total


def parse_pdf(data: bytes, cfg: KnowledgeConfig, budget: Budget) -> list[Block]:
    """Text of each page (pypdf), paragraphs per page, located by page number. Bounded: every
    stream's decompressed size (``pdf_max_stream_bytes``), the page content interpreted in the
    whole document, a stream shared by N pages counted N times (``pdf_max_content_bytes``, checked
    before any page is extracted), each page's text (``pdf_max_page_chars``, stopped as it grows)
    and the running total (``max_extracted_chars``); cancellation is checked at every operator."""
    from pypdf import PdfReader, apply_configuration
    from pypdf.errors import LimitReachedError, PyPdfError
    limit = cfg.pdf_max_stream_bytes
    out: list[Block] = []
    try:
        with apply_configuration(zlib_maximum_output_length=limit, lzw_maximum_output_length=limit,
                                 run_length_maximum_output_length=limit, brotli_maximum_output_length=limit,
                                 array_based_stream_maximum_output_length=limit,
                                 stream_decoding_work_maximum_length=limit):
            reader = PdfReader(io.BytesIO(data))
            if reader.is_encrypted:
                raise unsupported("encrypted pdf")
            if len(reader.pages) > cfg.pdf_max_pages:
                raise unsupported(f"pdf has {len(reader.pages)} pages (limit {cfg.pdf_max_pages})")
            content = 0
            for page in reader.pages:
                content += _content_bytes(page)
                if content > cfg.pdf_max_content_bytes:
                    raise unsupported(f"pdf pages hold over {cfg.pdf_max_content_bytes} bytes of content to "
                                      f"interpret (limit pdf_max_content_bytes): refused as a decompression bomb")
                budget.check()
            page_limit = min(cfg.pdf_max_page_chars, budget.limit)
            for no, page in enumerate(reader.pages, 1):
                budget.check()
                got = [0]

                def on_text(text, *_a, got=got) -> None:
                    got[0] += len(text)
                    if got[0] > page_limit or budget.total + got[0] > budget.limit:
                        raise _PageFull()

                def on_operator(*_a) -> None:
                    if budget.cancelled():
                        raise _PageFull()
                try:
                    text = page.extract_text(visitor_text=on_text, visitor_operand_before=on_operator) or ""
                except _PageFull:
                    budget.check()                       # cancelled: Cancelled
                    if got[0] > cfg.pdf_max_page_chars:
                        raise unsupported(f"pdf page {no} holds over {cfg.pdf_max_page_chars} characters of "
                                          f"text (limit pdf_max_page_chars)") from None
                    raise over_limit(budget.total + got[0], budget.limit) from None
                out.extend(_counted(text.replace("\r\n", "\n").split("\n"), budget, 1, no))
    except HandlerError:
        raise
    except LimitReachedError as exc:
        raise unsupported(f"pdf over a decompression limit (pdf_max_stream_bytes = {limit}): {exc}") from None
    except PyPdfError as exc:
        raise unsupported(f"corrupt pdf: {exc or type(exc).__name__}") from None
    except Exception as exc:              # pypdf meets malformed objects with all kinds of errors
        raise unsupported(f"corrupt pdf: {type(exc).__name__}: {exc}") from None
    for b in out:                         # pdf "lines" are extraction artefacts: cite the page only
        b.line_start = b.line_end = None
    return out


def check_zip(data: bytes, cfg: KnowledgeConfig) -> None:
    """Refuse a zip whose declared sizes exceed the limits (checked before any decompression)."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError) as exc:
        raise unsupported(f"corrupt docx: {exc}") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > cfg.docx_max_members:
            raise unsupported(f"docx has {len(infos)} zip members (limit {cfg.docx_max_members})")
        total = 0
        for info in infos:
            total += info.file_size
            if info.file_size > cfg.docx_max_ratio * max(info.compress_size, 1) and info.file_size > 1 << 20:
                raise unsupported(f"docx member {info.filename!r} expands {info.file_size // max(info.compress_size, 1)}x "
                                  f"(limit {cfg.docx_max_ratio}x): refused as a zip bomb")
        if total > cfg.docx_max_uncompressed_bytes:
            raise unsupported(f"docx expands to {total} bytes (limit {cfg.docx_max_uncompressed_bytes}): "
                              "refused as a zip bomb")


def parse_docx(data: bytes, cfg: KnowledgeConfig, budget: Budget) -> list[Block]:
    """Paragraphs (``Heading N`` / ``Title`` styles become headings) and table rows (python-docx);
    counted cell by cell (a merged cell repeats its text in every column it spans)."""
    check_zip(data, cfg)
    import docx
    from docx.opc.exceptions import PackageNotFoundError
    try:
        document = docx.Document(io.BytesIO(data))
    except (PackageNotFoundError, KeyError, ValueError, zipfile.BadZipFile, AttributeError) as exc:
        raise unsupported(f"corrupt docx: {exc or type(exc).__name__}") from None
    except Exception as exc:              # lxml syntax errors and the like inside the package
        raise unsupported(f"corrupt docx: {type(exc).__name__}: {exc}") from None
    out: list[Block] = []
    for para in document.paragraphs:
        text = para.text.strip()
        budget.add(len(text))
        if not text:
            continue
        style = (para.style.name if para.style is not None else "") or ""
        m = re.match(r"Heading (\d)", style)
        level = int(m.group(1)) if m else (1 if style == "Title" else 0)
        out.append(Block(text, level))
    for table in document.tables:
        for row in table.rows:
            cells = []
            for c in row.cells:
                cells.append(c.text.strip())
                budget.add(len(cells[-1]))
            if any(cells):
                out.append(Block(" | ".join(cells)))
    return out


PARSERS: dict[str, Callable[[bytes, KnowledgeConfig, Budget], list[Block]]] = {
    "text": parse_text, "markdown": parse_markdown, "csv": parse_csv, "json": parse_json, "yaml": parse_yaml,
    "html": parse_html, "pdf": parse_pdf, "docx": parse_docx}


def parse(name: str, data: bytes, cfg: KnowledgeConfig,
          cancelled: Callable[[], bool] | None = None) -> list[Block]:
    """Blocks of a document, or HandlerError UNSUPPORTED_MEDIA; ``Cancelled`` (SHUTTING_DOWN) as
    soon as ``cancelled()`` is true at a page / block boundary."""
    if not data:
        raise unsupported("empty file")
    budget = Budget(cfg, cancelled)
    budget.check()
    blocks = PARSERS[kind_of(name)](data, cfg, budget)
    total = sum(len(b.text) for b in blocks)
    if total > cfg.max_extracted_chars:
        raise over_limit(total, cfg.max_extracted_chars)
    budget.check()
    if not any(b.text.strip() for b in blocks):
        raise unsupported("no text found in the document")
    return blocks
