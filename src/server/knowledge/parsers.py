"""Document parsers: bytes in, ``Block`` list out. One function per format, chosen by extension
(config files ``.conf .ini .cfg .toml .properties`` and rotated logs ``.log.N`` read as text).

Refused with UNSUPPORTED_MEDIA: unknown extensions, ``.env`` files (secrets), binary content in a
text format, corrupt pdf/docx files (with the parser's reason), password-protected pdfs (one with
only an owner password is read), malformed json/yaml/csv (a csv quote never closed too). A docx is
read by ``server.knowledge.docx`` (zip-bomb checks, streamed xml), an html file by
``server.knowledge.html``.

Every parser counts the characters it produces as it goes (``server.knowledge.budget.Budget``) and
stops as soon as
``max_extracted_chars`` is passed; a pdf is also bounded per page (``pdf_max_page_chars``), per
stream (``pdf_max_stream_bytes``, pypdf's decompression limits) and in page content interpreted
(``pdf_max_content_bytes``); a docx's xml is streamed and bounded in elements read
(``docx_max_xml_elements``); a csv is read a record at a time, each record bounded in characters
(``csv_max_record_chars``); an html file is parsed in one pass; a json file is bounded in values
before it is parsed (``JSON_MAX_VALUES``) and never kept as a tree; a yaml file is read as parser
events, never objects, bounded in events and depth (``YAML_MAX_EVENTS``, ``YAML_MAX_DEPTH``).
``cancelled`` (a callable) is polled at every page / block (every ``JSON_CHECK_EVERY`` /
``YAML_CHECK_EVERY`` tokens / events): a cancelled parse raises ``Cancelled`` (SHUTTING_DOWN) and
frees its thread.
"""
from __future__ import annotations

import csv
import io
import json
import re
import sys
from pathlib import PurePath
from typing import Callable

from server.errors import HandlerError
from server.knowledge.blocks import Block
from server.knowledge.budget import Budget, over_limit
from server.knowledge.config import KnowledgeConfig
from server.knowledge.docx import parse_docx
from server.knowledge.html import parse_html
from server.knowledge.encodings import decode_text, unsupported

#: configuration files, read as plain text (paragraphs by blank lines; a section's keys stay together)
CONFIG_EXTENSIONS = (".conf", ".ini", ".cfg", ".toml", ".properties")
TEXT_KINDS = {".txt": "text", ".text": "text", ".log": "text", ".md": "markdown", ".markdown": "markdown",
              ".csv": "csv", ".json": "json", ".yaml": "yaml", ".yml": "yaml", ".html": "html", ".htm": "html",
              **{ext: "text" for ext in CONFIG_EXTENSIONS}}
BINARY_KINDS = {".pdf": "pdf", ".docx": "docx"}
SUPPORTED = sorted(TEXT_KINDS) + sorted(BINARY_KINDS)
#: a rotated log (``app.log.1``, ``syslog.log.12``): plain text like ``.log``; a compressed one
#: (``app.log.2.gz``) is refused by its ``.gz``
ROTATED_LOG = re.compile(r"\.log\.\d{1,6}$", re.IGNORECASE)
#: an environment file (``.env``, ``.env.local``, ``prod.env``): refused, it holds secrets (API keys,
#: database passwords) that search results would quote to everyone who reads the collection
ENV_FILE = re.compile(r"^\.env(?:\..*)?$|\.env$", re.IGNORECASE)
CSV_ROWS_PER_BLOCK = 20
# csv's own cell limit (131,072 characters by default, process-wide) raised once to the largest
# allowed csv_max_record_chars: a record's size is bounded by that setting (``_CsvLines``)
CSV_FIELD_LIMIT = min(1 << 33, sys.maxsize)
csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_LIMIT))
_SURROGATE = re.compile("[\ud800-\udfff]")     # a lone one (json loads a valid pair as one character)
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
# a markdown table's delimiter row (``|---|:--:|``), below its header row
_TABLE_DELIMITER = re.compile(r"^\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$")
# csv: the delimiters sniffed (the first in this order wins a tie), on the first lines of the file
CSV_DELIMITERS = ",;\t|"
CSV_SNIFF_LINES = 10
CSV_SNIFF_CHARS = 1 << 16

# Spaced-out CJK text (justified pdfs: pypdf extracts "恢 复 超 时 时 间"): the spaces between two
# CJK characters are removed on a line where at least ``SPACED_CJK_MIN_SHARE`` of the pairs of
# neighbouring CJK characters are space-separated, and which holds at least ``SPACED_CJK_MIN_PAIRS``
# spaced pairs (a shorter line: when its whole page / paragraph is spaced-out by that rule), so the
# analyzer's bigrams come back. Han, kana, CJK punctuation and fullwidth forms; not Hangul (Korean
# separates its words with spaces), and tabs and ideographic spaces are kept.
SPACED_CJK_MIN_SHARE = 0.8
SPACED_CJK_MIN_PAIRS = 3
_CJK_JOINED = ("\u3001-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff01-\uff9f"
               "\uffe0-\uffe6\U00020000-\U0003134f")
_CJK_SPACED = re.compile(rf"(?<=[{_CJK_JOINED}])[ \u00a0]+(?=[{_CJK_JOINED}])")
_CJK_RUN = re.compile(rf"[{_CJK_JOINED}]+")
_CJK_SPACED_ANY = re.compile(rf"[{_CJK_JOINED}][ \u00a0]+[{_CJK_JOINED}]")     # (a quicker search)


def kind_of(name: str) -> str:
    """The parser kind for a file name (by extension), or UNSUPPORTED_MEDIA."""
    base = PurePath(name).name
    if ENV_FILE.search(base):
        raise unsupported(f"{base!r} is an environment file (.env): it holds secrets (API keys, passwords) that "
                          f"search answers would quote to everyone who can read the collection, so it is not "
                          f"stored; upload a copy without the secret values as a .txt or .conf file")
    if ROTATED_LOG.search(base):
        return "text"
    ext = PurePath(name).suffix.lower()
    kind = TEXT_KINDS.get(ext) or BINARY_KINDS.get(ext)
    if kind is None:
        raise unsupported(f"unsupported file type {ext or '(none)'!r}; supported: {' '.join(SUPPORTED)} "
                          f"and rotated logs (.log.1)")
    return kind


def _cjk_pairs(text: str) -> int:
    """Pairs of neighbouring CJK characters in ``text``."""
    return sum(len(run) - 1 for run in _CJK_RUN.findall(text))


def join_spaced_cjk(text: str) -> str:
    """``text`` with the spaces between two CJK characters removed on its spaced-out lines (see
    ``SPACED_CJK_MIN_SHARE``): ``恢 复 超 时 时 间 为 45 分 钟`` -> ``恢复超时时间为45分钟`` (a space
    next to a latin word or a digit stays: ``是 bk-09 。``). ``text`` is one unit (a pdf page, a
    paragraph): a line with fewer than ``SPACED_CJK_MIN_PAIRS`` spaced pairs (``目 录``) is joined only
    when the unit as a whole is spaced-out. A joined line loses its trailing spaces too; line ends
    are kept, so line ranges stay right."""
    if not _CJK_SPACED_ANY.search(text):
        return text
    lines = text.split("\n")
    found: list[tuple[int, str, int, int]] = []      # a line with spaced pairs: index, joined, spaced, pairs
    total_spaced = total_pairs = 0
    for i, line in enumerate(lines):
        joined, spaced = _CJK_SPACED.subn("", line)
        pairs = _cjk_pairs(joined)           # its spaced pairs and its neighbours already joined
        if spaced:
            found.append((i, joined, spaced, pairs))
        total_spaced, total_pairs = total_spaced + spaced, total_pairs + pairs
    whole = total_spaced >= SPACED_CJK_MIN_PAIRS and total_spaced >= SPACED_CJK_MIN_SHARE * total_pairs
    for i, joined, spaced, pairs in found:
        if spaced >= SPACED_CJK_MIN_SHARE * pairs and (whole or spaced >= SPACED_CJK_MIN_PAIRS):
            lines[i] = joined.rstrip(" \u00a0")         # (and the space after its last glyph)
    return "\n".join(lines)


def _paragraphs(lines: list[str], first_line: int = 1, page: int | None = None,
                join_cjk: bool = False) -> list[Block]:
    """Blank-line separated paragraphs of ``lines`` with their line ranges; ``join_cjk``: spaced-out
    CJK lines joined (``join_spaced_cjk``, the paragraph as the unit)."""
    out: list[Block] = []
    start = None
    for i, line in enumerate(lines + [""]):
        if line.strip():
            if start is None:
                start = i
        elif start is not None:
            text = "\n".join(lines[start:i]).strip()
            out.append(Block(join_spaced_cjk(text) if join_cjk else text, 0, page,
                             first_line + start, first_line + i - 1))
            start = None
    return out


def _counted(lines: list[str], budget: Budget, first_line: int = 1, page: int | None = None,
             join_cjk: bool = False) -> list[Block]:
    out = _paragraphs(lines, first_line, page, join_cjk)
    budget.add(sum(len(b.text) for b in out))
    return out


def parse_text(data: bytes, cfg: KnowledgeConfig, budget: Budget) -> list[Block]:
    return _counted(decode_text(data).split("\n"), budget, join_cjk=True)


def _table_cells(line: str) -> int:
    return len(line.strip().strip("|").split("|"))


def _markdown_body(lines: list[str], budget: Budget, first_line: int) -> list[Block]:
    """The blocks of a markdown section (``lines`` begin outside a fenced block): blank-line separated
    paragraphs, spaced-out CJK joined outside fenced code; a table (a row of cells, a delimiter row
    of as many, the rows up to a blank line or a line without ``|``) cut out of its paragraph: its
    header and delimiter rows one block, then its rows one block carrying them as its ``header``, so
    every chunk begun among the rows starts with the header (``chunker``)."""
    code = [False] * len(lines)            # a fence line or a line inside fenced code
    fence = None
    for i, line in enumerate(lines):
        m = _FENCE.match(line)
        if m:
            fence = None if fence == m.group(1) else (fence or m.group(1))
        code[i] = bool(m) or fence is not None
    out: list[Block] = []

    def prose(a: int, b: int) -> None:
        for block in _paragraphs(lines[a:b], first_line + a):
            i, j = block.line_start - first_line, block.line_end - first_line      # type: ignore[operator]
            if not any(code[i:j + 1]):
                block.text = join_spaced_cjk(block.text)
            budget.add(len(block.text))
            out.append(block)

    start = i = 0
    while i + 1 < len(lines):
        head, delim = lines[i], lines[i + 1]
        if (code[i] or code[i + 1] or "|" not in head or "|" not in delim or delim.strip(" \t|:-")
                or not _TABLE_DELIMITER.match(delim) or _table_cells(head) != _table_cells(delim)):
            i += 1
            continue
        prose(start, i)
        header = f"{head.strip()}\n{delim.strip()}"
        out.append(Block(header, 0, None, first_line + i, first_line + i + 1))
        budget.add(len(header))
        i = rows = i + 2
        while i < len(lines) and lines[i].strip() and "|" in lines[i] and not code[i]:
            i += 1
        if i > rows:
            text = "\n".join(lines[rows:i]).strip()
            out.append(Block(text, 0, None, first_line + rows, first_line + i - 1, header))
            budget.add(len(text))
        start = i
    prose(start, len(lines))
    return out


def parse_markdown(data: bytes, cfg: KnowledgeConfig, budget: Budget) -> list[Block]:
    """ATX headings (``#`` .. ``######``) and blank-line paragraphs; fenced code stays one block; a
    table's rows are blocks of their own carrying its header row (``_markdown_body``)."""
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
                out.extend(_markdown_body(lines[body_start:i], budget, body_start + 1))
                out.append(Block(h.group(2), len(h.group(1)), None, i + 1, i + 1))
                budget.add(len(h.group(2)))
                body_start = i + 1
    out.extend(_markdown_body(lines[body_start:], budget, body_start + 1))
    return out


class _CsvLines:
    """The lines of a csv text for ``csv.reader``, cut one at a time (no list of every line), refusing
    a record (a row and the lines its quoted cells span) of over ``csv_max_record_chars`` characters
    before the reader holds it: the reader keeps a record's cells as one list of strings, ~20 times
    the record's size when its cells are short. ``next_record()`` is called at each row read. ``skip``:
    lines not handed to the reader (Excel's ``sep=;`` line), still counted in the line numbers."""

    def __init__(self, text: str, limit: int, skip: int = 0) -> None:
        self.text = text
        self.limit = limit
        self.pos = 0                  # where the next line starts
        self.lines = 0                # lines handed to the reader (and skipped)
        for _ in range(skip):
            self.pos, self.lines = text.find("\n", self.pos) + 1 or len(text), self.lines + 1
        self.first = self.lines + 1   # the line the current record starts on
        self.start = self.pos         # ... and its offset in the text
        self.last_first, self.last_start = self.first, self.start     # the same of the record read last
        self.record = 0               # characters of the current record so far

    def next_record(self) -> None:
        self.last_first, self.last_start = self.first, self.start
        self.first, self.start, self.record = self.lines + 1, self.pos, 0

    def __iter__(self) -> _CsvLines:
        return self

    def __next__(self) -> str:
        text, start = self.text, self.pos
        if start >= len(text):
            raise StopIteration
        end = text.find("\n", start) + 1 or len(text)
        self.record += end - start
        if self.record > self.limit:
            raise unsupported(f"csv record on line {self.first} holds over {self.limit} characters "
                              f"(limit csv_max_record_chars)")
        self.pos, self.lines = end, self.lines + 1
        return text[start:end]


_CSV_QUOTED = re.compile(r'"(?:[^"]|"")*"')
# a quoted cell as the csv reader reads it: possessive, so a '""' at the end is an escaped quote,
# never the closing one (``"a""`` is open)
_CSV_QUOTED_CELL = re.compile(r'"[^"]*+(?:""[^"]*+)*+"')
#: Excel's first line naming the delimiter (``sep=;``): not a header; its delimiter is used
CSV_SEP_LINE = re.compile(r'sep=([^"\r\n])\r?')


def _open_quote(text: str, start: int, delimiter: str) -> int | None:
    """The offset of the quote that opens a cell of the record at ``start`` (the last of ``text``)
    and is never closed, or None. Read as the (non-strict) csv reader reads: a quote opens a cell
    only at the cell's start, ``""`` inside is an escaped quote, and after the closing quote the cell
    runs on to the delimiter. The reader hands such a record every line up to the end of the file as
    one cell, silently."""
    rest = re.compile(f"[^{re.escape(delimiter)}\r\n]*")
    pos, end = start, len(text)
    while pos < end:
        if text[pos] == '"':
            m = _CSV_QUOTED_CELL.match(text, pos)
            if m is None:
                return pos
            pos = m.end()
        pos = rest.match(text, pos).end()            # type: ignore[union-attr]
        if pos >= end or text[pos] != delimiter:     # the record's end
            return None
        pos += 1
    return None


def sniff_delimiter(text: str) -> str:
    """The delimiter of a csv text among ``CSV_DELIMITERS``: the one its first line (header) holds
    and most of its first ``CSV_SNIFF_LINES`` non-blank lines hold as many times (quoted cells left
    out), then the one the header holds most; a comma when the header holds none."""
    sample = text[:CSV_SNIFF_CHARS].split("\n")
    if len(sample) > 1 and len(text) > CSV_SNIFF_CHARS:
        sample.pop()                              # (a line cut by the sample)
    lines = [_CSV_QUOTED.sub("", line) for line in sample if line.strip()][:CSV_SNIFF_LINES]
    best, best_score = ",", (0, 0)
    for d in CSV_DELIMITERS:
        counts = [line.count(d) for line in lines]
        if not counts or not counts[0]:
            continue
        score = (sum(c == counts[0] for c in counts), counts[0])
        if score > best_score:
            best, best_score = d, score
    return best


def parse_csv(data: bytes, cfg: KnowledgeConfig, budget: Budget) -> list[Block]:
    """Rows as ``column: value`` lines, a block per ``CSV_ROWS_PER_BLOCK`` rows, located by the lines
    of the file its records span (a quoted cell may hold line ends: a record is not a line). Blank
    lines before the header are skipped; a cell under an empty column name or beyond the header's
    width is named by its position (``column 3: value``). Column
    names have their whitespace (line ends too) collapsed to single spaces, so a block whose text has
    as many line ends as its range has lines is line for line its source (no empty row or cell was
    dropped) and the chunker cites each row's own lines. Read a record at a time: each row's line is
    counted (its column names too) as it is made, and a record over ``csv_max_record_chars`` is
    refused before it is split into cells. The delimiter is sniffed among ``,;\\t|`` (``sniff_delimiter``),
    or named by an Excel ``sep=;`` first line (``CSV_SEP_LINE``, skipped). A quote that opens a cell
    and is never closed is refused, naming its line: the reader would silently read every line after
    it into that one cell."""
    text = decode_text(data)
    sep = CSV_SEP_LINE.fullmatch(text[:text.find("\n")] if "\n" in text else text)
    delimiter = sep.group(1) if sep else sniff_delimiter(text)
    lines = _CsvLines(text, cfg.csv_max_record_chars, skip=1 if sep else 0)
    reader = csv.reader(lines, delimiter=delimiter)
    out: list[Block] = []
    header: list[str] | None = None
    names: list[str] = []
    part: list[str] = []             # the "column: value" lines of the block being made (empty rows left out)
    rows = first = 0                 # records in that block, and the line it starts on
    try:
        for row in reader:
            start, end = lines.first, lines.lines           # the lines this record spans
            lines.next_record()
            if header is None:
                if not any(c.strip() for c in row):     # blank lines before the header
                    continue
                header, header_start, header_end = row, start, end
                names = [" ".join(h.split()) or f"column {i}" for i, h in enumerate(row, 1)]
                continue
            if len(row) > len(names):                   # cells beyond the header's width
                names.extend(f"column {i}" for i in range(len(names) + 1, len(row) + 1))
            line = "; ".join(f"{h}: {v}" for h, v in zip(names, row) if v.strip())
            if line:
                budget.add(len(line) + (1 if part else 0))   # (the line end joining it to the one before)
                part.append(line)
            rows, first = rows + 1, first if rows else start
            if rows == CSV_ROWS_PER_BLOCK:
                out.append(Block("\n".join(part), 0, None, first, end))
                part, rows = [], 0
    except csv.Error as exc:
        raise unsupported(f"malformed csv: {exc}") from None
    opened = _open_quote(text, lines.last_start, delimiter)
    if opened is not None:
        line = lines.last_first + text.count("\n", lines.last_start, opened)
        raise unsupported(f"malformed csv: the quote opening a cell on line {line} is never closed, so every "
                          f"line after it would be read as that one cell (a stray '\"'? remove it, or quote the "
                          f"whole cell and double the quotes inside: \"\"\")")
    if rows:
        out.append(Block("\n".join(part), 0, None, first, end))
    if header is not None and not out:                  # a header and no rows: the header is the text
        out.append(Block("; ".join(header), 0, None, header_start, header_end))
        budget.add(len(out[-1].text))
    return [b for b in out if b.text]


def _too_deep(kind: str) -> HandlerError:
    return unsupported(f"malformed {kind}: nested too deeply")


def _escaped(m: re.Match) -> str:
    return f"\\u{ord(m.group()):04x}"


#: JSON: at most this many values in one file (the document, array elements and object members;
#: counted before parsing, from the commas and brackets outside strings). Validation keeps no object
#: and no number (``_drop``: objects, numbers and constants are read as None), so what it holds is the
#: arrays' slots, 8 bytes a value: ~80 MB at the limit (before, the parsed tree took ~50-130 bytes a
#: value: a 10 MB file of ``[{},{},...]`` took 1.4 GB and was then refused for its chunks); a data dump
#: of 2 M numbers (4 MB) is read
JSON_MAX_VALUES = 10_000_000
#: pretty-printing a one-line JSON: its text is counted and cancellation checked every this many tokens
JSON_CHECK_EVERY = 4096
_JSON_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"')
_JSON_EMPTY = re.compile(r"\[\s*\]|\{\s*\}")
# the tokens of a valid JSON text: a string, a bracket, a comma or colon, a number or literal
_JSON_TOKEN = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"|[\[\]{},:]|[^\s,:\[\]{}"]++')
_scan_json_string = json.decoder.scanstring                    # type: ignore[attr-defined]
_encode_json_string = json.encoder.encode_basestring           # type: ignore[attr-defined]


def _json_values(text: str) -> int:
    """The values of a JSON text (``JSON_MAX_VALUES``): one, plus its commas, plus its non-empty
    arrays and objects (each holds one value more than its commas), outside strings. Bounded on the
    whole text first (strings included: a quick upper bound); only when that is over the limit are
    the strings left out and the empty ``[]`` / ``{}`` taken off. (Of a malformed text: a guess,
    json.loads then names the error.)"""
    n = text.count(",") + text.count("[") + text.count("{") + 1
    if n <= JSON_MAX_VALUES:
        return n
    bare = _JSON_STRING.sub("", text)
    empty = sum(1 for _ in _JSON_EMPTY.finditer(bare))
    return bare.count(",") + bare.count("[") + bare.count("{") - empty + 1


def _drop(_value: object) -> None:
    """What validation keeps of an object, a number or a constant: nothing."""
    return None


def _pretty_json(text: str, budget: Budget) -> str:
    """A valid one-line JSON text laid out as ``json.dumps(indent=2, ensure_ascii=False)`` lays out
    its value, token by token, without building the value: strings with an escape decoded and
    written back as json.dumps writes them (``\\u4e2d`` becomes ``中``), numbers as written. The
    pieces are joined every ``JSON_CHECK_EVERY`` tokens (a list of every piece took ~50 bytes a
    token), their size counted against the budget and cancellation checked."""
    parts: list[str] = []            # the text so far, a string per JSON_CHECK_EVERY tokens
    batch: list[str] = []
    write = batch.append
    size = depth = 0
    opened = ""                      # a "[" / "{" whose first token is not read yet

    def flush() -> None:
        nonlocal size
        parts.append("".join(batch))
        batch.clear()
        size += len(parts[-1])
        if size > budget.limit - budget.total:
            raise over_limit(budget.total + size, budget.limit)
        budget.check()

    for n, m in enumerate(_JSON_TOKEN.finditer(text), 1):
        tok = m.group()
        c = tok[0]
        if opened:
            if c in "]}":           # empty: [] / {}
                write(opened + tok)
                opened = ""
                continue
            depth += 1
            write(opened + "\n" + "  " * depth)
            opened = ""
        if c in "[{":
            opened = c
        elif c in "]}":
            depth -= 1
            write("\n" + "  " * depth + c)
        elif c == ",":
            write(",\n" + "  " * depth)
        elif c == ":":
            write(": ")
        elif c == '"' and "\\" in tok:
            write(_encode_json_string(_scan_json_string(tok, 1)[0]))
        else:
            write(tok)
        if n % JSON_CHECK_EVERY == 0:
            flush()
    write(opened)
    flush()
    return "".join(parts)


def parse_json(data: bytes, cfg: KnowledgeConfig, budget: Budget) -> list[Block]:
    """Validated, then indexed as written; a file on one line (minified) is indexed pretty-printed
    (keys stay next to their values, chunks end at line ends) and every block is located on that
    one line of the file, not on the lines of the pretty-printed text. A file of over
    ``JSON_MAX_VALUES`` values is refused before it is parsed; it is validated by ``json.loads``
    without keeping its objects, and pretty-printed from its text (``_pretty_json``), so memory stays
    a small multiple of the file. The pretty-printed text is counted as it is produced (deep
    one-line files expand a lot); a lone surrogate stays the escape it was written as."""
    text = decode_text(data)
    values = _json_values(text)
    if values > JSON_MAX_VALUES:
        raise unsupported(f"json holds {values} values (array elements and object members), over the limit "
                          f"of {JSON_MAX_VALUES} (JSON_MAX_VALUES)")
    budget.check()
    try:
        json.loads(text, object_pairs_hook=_drop, parse_int=_drop, parse_float=_drop,
                   parse_constant=_drop)           # validated: objects and numbers dropped once read
    except RecursionError:
        raise _too_deep("json") from None
    except ValueError as exc:
        raise unsupported(f"malformed json: {exc}") from None
    budget.check()
    if "\n" not in text.strip():
        line = 1 + text[:len(text) - len(text.lstrip())].count("\n")     # the line holding the json
        # a lone surrogate escaped in the file ("\\ud800") is a str character once decoded: written
        # back as its escape, so the text stays the file's json and valid unicode
        text = _SURROGATE.sub(_escaped, _pretty_json(text, budget))
        budget.add(len(text))
        # one block (pretty-printed json has no blank line), cited on the file's one line, not on
        # the lines of the pretty-printed text
        return [Block(text, 0, None, line, line)]
    return _counted(text.split("\n"), budget)


#: YAML: at most this many parser events in one file (a scalar, an alias, a collection's start and
#: end: ~2 µs each with libyaml, ~40 µs without)
YAML_MAX_EVENTS = 2_000_000
#: YAML: collections nested at most this deep (a refusal, as deep JSON is)
YAML_MAX_DEPTH = 1000
#: YAML: the budget (cancellation) is checked every this many events
YAML_CHECK_EVERY = 4096
_YAML_PYTHON_TAG = "tag:yaml.org,2002:python/"


def _too_many_events() -> HandlerError:
    return unsupported(f"yaml holds over {YAML_MAX_EVENTS} elements (scalars, collections and aliases, counted "
                       f"as parser events; limit YAML_MAX_EVENTS)")


def parse_yaml(data: bytes, cfg: KnowledgeConfig, budget: Budget) -> list[Block]:
    """Validated as YAML syntax, indexed as written. Read as parser events (libyaml's when installed),
    never composed into nodes or constructed into objects, so memory stays flat and application tags
    (CloudFormation ``!Sub``, GitLab ``!reference``, Ansible ``!vault``) are accepted; an alias must
    name an anchor defined before it in its document, and Python object tags (``!!python/...``) are
    refused. Bounded: ``YAML_MAX_EVENTS`` events, ``YAML_MAX_DEPTH`` levels, the budget checked every
    ``YAML_CHECK_EVERY`` events."""
    import yaml
    text = decode_text(data)
    events = depth = 0
    anchors: set[str] = set()
    loader = None
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
        while (event := loader.get_event()) is not None:
            events += 1
            if events % YAML_CHECK_EVERY == 0:
                if events > YAML_MAX_EVENTS:
                    raise _too_many_events()
                budget.check()
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                depth += 1
                if depth > YAML_MAX_DEPTH:
                    raise _too_deep("yaml")
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
                continue
            elif isinstance(event, yaml.AliasEvent):
                if event.anchor not in anchors:
                    raise unsupported(f"malformed yaml: found undefined alias {event.anchor!r} "
                                      f"(line {event.start_mark.line + 1})")
                continue
            elif isinstance(event, yaml.DocumentStartEvent):
                anchors.clear()
                continue
            elif not isinstance(event, yaml.ScalarEvent):
                continue
            if event.anchor is not None:
                anchors.add(event.anchor)
            if event.tag and event.tag.startswith(_YAML_PYTHON_TAG):
                raise unsupported(f"malformed yaml: a Python object tag {event.tag!r} (line "
                                  f"{event.start_mark.line + 1}): only data is accepted")
    except yaml.YAMLError as exc:
        raise unsupported(f"malformed yaml: {str(exc).splitlines()[0]}") from None
    finally:
        if loader is not None:
            loader.dispose()
    if events > YAML_MAX_EVENTS:
        raise _too_many_events()
    return _counted(text.split("\n"), budget)


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
    and the running total (``max_extracted_chars``); cancellation is checked at every operator. An
    encrypted pdf is read when it opens with the empty password (an owner password only), else
    refused as password-protected. A page's spaced-out CJK lines (justified text: one glyph at a time) are joined (``join_spaced_cjk``)."""
    from pypdf import PdfReader, apply_configuration
    from pypdf.errors import DependencyError, LimitReachedError, PyPdfError
    limit = cfg.pdf_max_stream_bytes
    out: list[Block] = []
    try:
        with apply_configuration(zlib_maximum_output_length=limit, lzw_maximum_output_length=limit,
                                 run_length_maximum_output_length=limit, brotli_maximum_output_length=limit,
                                 array_based_stream_maximum_output_length=limit,
                                 stream_decoding_work_maximum_length=limit):
            reader = PdfReader(io.BytesIO(data))
            # an encrypted pdf every viewer opens (only an owner password: the user password empty) is read;
            # one that needs a password is refused (a cipher the server cannot decrypt: DependencyError below)
            if reader.is_encrypted and not reader.decrypt(""):
                raise unsupported("password-protected pdf: it opens only with its password")
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
                if _SURROGATE.search(text):   # pypdf decodes with "surrogatepass": pairs joined, lone ones U+FFFD
                    text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
                text = join_spaced_cjk(text.replace("\r\n", "\n"))     # justified CJK: "恢 复 超 时"
                out.extend(_counted(text.split("\n"), budget, 1, no))
    except HandlerError:
        raise
    except LimitReachedError as exc:
        raise unsupported(f"pdf over a decompression limit (pdf_max_stream_bytes = {limit}): {exc}") from None
    except DependencyError as exc:        # (AES without the cryptography package, met on the first string)
        raise unsupported(f"encrypted pdf that this server cannot decrypt: {exc}") from None
    except PyPdfError as exc:
        raise unsupported(f"corrupt pdf: {exc or type(exc).__name__}") from None
    except Exception as exc:              # pypdf meets malformed objects with all kinds of errors
        raise unsupported(f"corrupt pdf: {type(exc).__name__}: {exc}") from None
    for b in out:                         # pdf "lines" are extraction artefacts: cite the page only
        b.line_start = b.line_end = None
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
    kind = kind_of(name)
    try:
        blocks = PARSERS[kind](data, cfg, budget)
    except (HandlerError, MemoryError):   # (Cancelled is a HandlerError: it stays SHUTTING_DOWN)
        raise
    except Exception as exc:             # a parser's unexpected error is the document's, not the server's
        raise unsupported(f"malformed {kind}: {type(exc).__name__}: {exc}") from None
    total = sum(len(b.text) for b in blocks)
    if total > cfg.max_extracted_chars:
        raise over_limit(total, cfg.max_extracted_chars)
    budget.check()
    if not any(b.text.strip() for b in blocks):
        raise unsupported("no text found in the document")
    return blocks
