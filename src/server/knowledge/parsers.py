"""Document parsers: bytes in, ``Block`` list out. One function per format, chosen by extension.

Refused with UNSUPPORTED_MEDIA: unknown extensions, binary content in a text format, and corrupt
pdf/docx files (with the parser's reason). A docx is a zip: its member sizes and compression ratios
are checked against the configured limits before anything is decompressed (zip bombs).
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

TEXT_KINDS = {".txt": "text", ".text": "text", ".log": "text", ".md": "markdown", ".markdown": "markdown",
              ".csv": "csv", ".json": "json", ".yaml": "yaml", ".yml": "yaml", ".html": "html", ".htm": "html"}
BINARY_KINDS = {".pdf": "pdf", ".docx": "docx"}
SUPPORTED = sorted(TEXT_KINDS) + sorted(BINARY_KINDS)
CSV_ROWS_PER_BLOCK = 20
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def unsupported(message: str) -> HandlerError:
    return HandlerError(ErrorCode.UNSUPPORTED_MEDIA, message)


def kind_of(name: str) -> str:
    """The parser kind for a file name (by extension), or UNSUPPORTED_MEDIA."""
    ext = PurePath(name).suffix.lower()
    kind = TEXT_KINDS.get(ext) or BINARY_KINDS.get(ext)
    if kind is None:
        raise unsupported(f"unsupported file type {ext or '(none)'!r}; supported: {' '.join(SUPPORTED)}")
    return kind


def _as_gb18030(data: bytes) -> str | None:
    """``data`` as GB18030 (a superset of GBK and GB2312) when it decodes strictly and its non-ASCII
    characters are mostly common Chinese (CJK ideographs and CJK punctuation), else None.
    Checked before charset-normalizer, whose guess on short Chinese text is often cp932/Big5."""
    try:
        text = data.decode("gb18030")
    except UnicodeDecodeError:
        return None
    wide = [c for c in text if ord(c) > 0x7F]
    chinese = sum(1 for c in wide if "\u4e00" <= c <= "\u9fff" or "\u3000" <= c <= "\u303f" or "\uff01" <= c <= "\uff5e")
    return text if wide and chinese >= 0.9 * len(wide) else None


def decode_text(data: bytes) -> str:
    """Bytes of a text file as str: BOM / UTF-8 first, then GB18030 when it reads as Chinese, else
    the encoding charset-normalizer finds (Big5, Shift-JIS, UTF-16, Latin-1, ...). Binary content
    (NUL bytes, control characters) is refused."""
    if b"\x00" in data[:65536] and not data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise unsupported("binary content in a text file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        gb = _as_gb18030(data) if not data.startswith((b"\xff\xfe", b"\xfe\xff")) else None
        if gb is not None:
            text = gb
        else:
            from charset_normalizer import from_bytes
            best = from_bytes(data).best()
            if best is None:
                raise unsupported("cannot detect the text encoding (binary file?)") from None
            text = str(best)
    sample = text[:65536]
    if sample and len(_CONTROL.findall(sample)) > len(sample) // 100 + 1:
        raise unsupported("binary content in a text file")
    return text.replace("\r\n", "\n").replace("\r", "\n")


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


def parse_text(data: bytes, cfg: KnowledgeConfig) -> list[Block]:
    return _paragraphs(decode_text(data).split("\n"))


def parse_markdown(data: bytes, cfg: KnowledgeConfig) -> list[Block]:
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
                out.extend(_paragraphs(lines[body_start:i], body_start + 1))
                out.append(Block(h.group(2), len(h.group(1)), None, i + 1, i + 1))
                body_start = i + 1
    out.extend(_paragraphs(lines[body_start:], body_start + 1))
    return out


def parse_csv(data: bytes, cfg: KnowledgeConfig) -> list[Block]:
    """Rows as ``column: value`` lines, a block per ``CSV_ROWS_PER_BLOCK`` rows."""
    text = decode_text(data)
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise unsupported(f"malformed csv: {exc}") from None
    if not rows:
        return []
    header, out = rows[0], []
    for start in range(1, len(rows), CSV_ROWS_PER_BLOCK):
        part = rows[start:start + CSV_ROWS_PER_BLOCK]
        lines = ["; ".join(f"{h}: {v}" for h, v in zip(header, row) if v.strip()) for row in part]
        out.append(Block("\n".join(x for x in lines if x), 0, None, start + 1, start + len(part)))
    if len(rows) == 1:
        out.append(Block("; ".join(header), 0, None, 1, 1))
    return [b for b in out if b.text]


def parse_json(data: bytes, cfg: KnowledgeConfig) -> list[Block]:
    """Validated, then indexed as pretty-printed text (keys stay next to their values)."""
    text = decode_text(data)
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise unsupported(f"malformed json: {exc}") from None
    if "\n" not in text.strip():
        text = json.dumps(obj, ensure_ascii=False, indent=2)
    return _paragraphs(text.split("\n"))


def parse_yaml(data: bytes, cfg: KnowledgeConfig) -> list[Block]:
    """Validated with ``yaml.safe_load_all`` (no object construction), indexed as written."""
    import yaml
    text = decode_text(data)
    try:
        for _ in yaml.safe_load_all(text):
            pass
    except yaml.YAMLError as exc:
        raise unsupported(f"malformed yaml: {str(exc).splitlines()[0]}") from None
    return _paragraphs(text.split("\n"))


class _HtmlBlocks(HTMLParser):
    BLOCK = {"p", "div", "li", "td", "th", "pre", "blockquote", "section", "article", "tr", "dd", "dt",
             "br", "table", "ul", "ol", "header", "footer", "main", "nav", "figcaption", "caption"}
    SKIP = {"script", "style", "noscript", "template", "head"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[Block] = []
        self.buf: list[str] = []
        self.skip = 0
        self.heading = 0
        self.start_line = 1

    def flush(self, level: int = 0) -> None:
        text = " ".join("".join(self.buf).split())
        if text:
            line = self.getpos()[0]
            self.blocks.append(Block(text, level, None, self.start_line, line))
        self.buf = []
        self.start_line = self.getpos()[0]

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in self.SKIP:
            self.skip += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self.flush()
            self.heading = int(tag[1])
        elif tag in self.BLOCK:
            self.flush()

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        elif re.fullmatch(r"h[1-6]", tag) and self.heading:
            self.flush(self.heading)
            self.heading = 0
        elif tag in self.BLOCK:
            self.flush()

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.buf.append(data)


def parse_html(data: bytes, cfg: KnowledgeConfig) -> list[Block]:
    """Visible text of block elements; h1..h6 become headings; script/style/head are dropped."""
    p = _HtmlBlocks()
    p.feed(decode_text(data))
    p.close()
    p.flush()
    return p.blocks


def parse_pdf(data: bytes, cfg: KnowledgeConfig) -> list[Block]:
    """Text of each page (pypdf), paragraphs per page, located by page number."""
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise unsupported("encrypted pdf")
        if len(reader.pages) > cfg.pdf_max_pages:
            raise unsupported(f"pdf has {len(reader.pages)} pages (limit {cfg.pdf_max_pages})")
        out: list[Block] = []
        for no, page in enumerate(reader.pages, 1):
            text = (page.extract_text() or "").replace("\r\n", "\n")
            out.extend(_paragraphs(text.split("\n"), 1, no))
    except HandlerError:
        raise
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


def parse_docx(data: bytes, cfg: KnowledgeConfig) -> list[Block]:
    """Paragraphs (``Heading N`` / ``Title`` styles become headings) and table rows (python-docx)."""
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
        if not text:
            continue
        style = (para.style.name if para.style is not None else "") or ""
        m = re.match(r"Heading (\d)", style)
        level = int(m.group(1)) if m else (1 if style == "Title" else 0)
        out.append(Block(text, level))
    for table in document.tables:
        for row in table.rows:
            cells = [c.text.strip() for c in row.cells]
            if any(cells):
                out.append(Block(" | ".join(cells)))
    return out


PARSERS: dict[str, Callable[[bytes, KnowledgeConfig], list[Block]]] = {
    "text": parse_text, "markdown": parse_markdown, "csv": parse_csv, "json": parse_json, "yaml": parse_yaml,
    "html": parse_html, "pdf": parse_pdf, "docx": parse_docx}


def parse(name: str, data: bytes, cfg: KnowledgeConfig) -> list[Block]:
    """Blocks of a document, or HandlerError UNSUPPORTED_MEDIA."""
    if not data:
        raise unsupported("empty file")
    blocks = PARSERS[kind_of(name)](data, cfg)
    total = sum(len(b.text) for b in blocks)
    if total > cfg.max_extracted_chars:
        raise unsupported(f"document holds {total} characters of text (limit {cfg.max_extracted_chars})")
    if not any(b.text.strip() for b in blocks):
        raise unsupported("no text found in the document")
    return blocks
