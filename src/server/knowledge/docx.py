"""Reading a .docx: its zip checked against the limits before anything is decompressed (zip
bombs), then its xml parts streamed as ``xml.etree`` events (never a whole tree), every element
counted toward ``docx_max_xml_elements`` and every character toward the parse's ``Budget``: the
document's paragraphs as Word shows them (``Heading N`` / ``Title`` styles as headings; tracked
insertions and moves, content controls, fields, text boxes in; deleted and hidden text out) and its tables' rows,
in document order."""
from __future__ import annotations

import io
import posixpath
import re
import zipfile
import zlib
from xml.etree import ElementTree

from server.errors import HandlerError
from server.knowledge.blocks import Block
from server.knowledge.budget import Budget
from server.knowledge.config import KnowledgeConfig
from server.knowledge.encodings import unsupported


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


DOCX_FEED_BYTES = 1 << 16          # xml read from the zip at a time
_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_RELATIONSHIP = "{http://schemas.openxmlformats.org/package/2006/relationships}Relationship"
_RELATIONSHIPS = "http://schemas.openxmlformats.org/officeDocument/2006/relationships/"
_P, _TBL, _TR, _TC = _W + "p", _W + "tbl", _W + "tr", _W + "tc"
_RUN, _TEXT, _BREAK = _W + "r", _W + "t", _W + "br"
_RUN_CHARS = {_W + "tab": "\t", _W + "ptab": "\t", _W + "cr": "\n", _W + "noBreakHyphen": "-"}
# what Word does not show: deleted and moved-away text, and the fallback copy of a drawing (a text
# box is in the drawing's mc:Choice and again in its mc:Fallback)
_HIDDEN = {_W + "del", _W + "moveFrom", "{http://schemas.openxmlformats.org/markup-compatibility/2006}Fallback"}
# a run whose properties hide it (Word's "Hidden" font effect): its text is not shown, so not indexed
_VANISH = {_W + "vanish", _W + "specVanish"}
_OFF = {"0", "false", "off"}


class _XmlPart:
    """A target for ``xml.etree.ElementTree.XMLParser``: a docx part read as events, no tree built.
    Every element of every part of the file counts toward ``docx_max_xml_elements``."""

    def __init__(self, counted: list[int], limit: int) -> None:
        self.counted = counted        # elements read so far, shared by the parts of one file
        self.limit = limit

    def start(self, tag: str, attrib: dict) -> None:
        self.counted[0] += 1
        if self.counted[0] > self.limit:
            raise unsupported(f"docx holds over {self.limit} xml elements (limit docx_max_xml_elements)")

    def end(self, tag: str) -> None:
        pass

    def data(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class _Relationships(_XmlPart):
    """The part each wanted relationship type (``officeDocument``, ``styles``) points to."""

    def __init__(self, counted: list[int], limit: int, folder: str, wanted: set[str]) -> None:
        super().__init__(counted, limit)
        self.folder = folder
        self.wanted = wanted
        self.targets: dict[str, str] = {}

    def start(self, tag: str, attrib: dict) -> None:
        super().start(tag, attrib)
        kind = attrib.get("Type", "").removeprefix(_RELATIONSHIPS)
        if tag == _RELATIONSHIP and kind in self.wanted and attrib.get("TargetMode") != "External":
            target = posixpath.normpath(posixpath.join("/" + self.folder, attrib.get("Target", "")))
            self.targets.setdefault(kind, target.lstrip("/"))


class _Styles(_XmlPart):
    """Paragraph styles: the heading level of each style id (``Heading N`` / ``Title`` names, as
    python-docx names them), and of the default paragraph style (paragraphs without a style, or
    with an unknown one or one of another type)."""

    def __init__(self, counted: list[int], limit: int) -> None:
        super().__init__(counted, limit)
        from docx.styles import BabelFish          # "heading 1" in styles.xml is "Heading 1"
        self.ui_name = BabelFish.internal2ui
        self.levels: dict[str, int] = {}          # by the first style of each id; -1: not a paragraph style
        self.default = 0
        self.depth = 0
        self.style: tuple[str, bool, bool] | None = None   # paragraph style being read: id, default, first of its id

    def start(self, tag: str, attrib: dict) -> None:
        super().start(tag, attrib)
        self.depth += 1
        if self.depth == 2 and tag == _W + "style":
            sid = attrib.get(_W + "styleId", "")
            paragraph = attrib.get(_W + "type", "paragraph") == "paragraph"
            first = sid not in self.levels
            if first:
                self.levels[sid] = 0 if paragraph else -1
            default = paragraph and attrib.get(_W + "default") in ("1", "true", "on")
            if default:
                self.default = 0                  # (the last default style is the one, named or not)
            self.style = (sid, default, first) if paragraph else None
        elif self.depth == 3 and tag == _W + "name" and self.style is not None:
            name = self.ui_name(attrib.get(_W + "val", ""))
            m = re.match(r"Heading (\d)", name)
            level = int(m.group(1)) if m else (1 if name == "Title" else 0)
            sid, default, first = self.style
            if first:
                self.levels[sid] = level
            if default:
                self.default = level

    def end(self, tag: str) -> None:
        if self.depth == 2:
            self.style = None
        self.depth -= 1

    def level(self, style_id: str | None) -> int:
        level = self.levels.get(style_id, -1) if style_id is not None else -1
        return self.default if level < 0 else level


class _Table:
    """A table being read (tables nest: a table in a cell is read inside the outer one)."""

    __slots__ = ("depth", "row", "row_depth", "cell", "cell_depth", "offset", "span", "merged", "above", "below",
                 "header")

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.row: list[str] | None = None     # cell texts of the row being read
        self.row_depth = self.cell_depth = -1  # -1: no row / cell open
        self.cell: list[str] = []
        self.offset = self.span = 0           # grid column of the cell, columns it spans
        self.merged = False                   # the cell continues a vertical merge
        self.above: dict[int, str] = {}       # the row above: cell text by grid column
        self.below: dict[int, str] = {}
        self.header: str | None = None        # its first row: the header the other rows' blocks carry


class _Body(_XmlPart):
    """Blocks of the main document part, in document order, read as its xml streams by: every
    paragraph (``w:p``) with the text of its runs wherever Word shows them (in hyperlinks, tracked
    insertions and moves, content controls, smart tags, simple fields), never deleted or moved-away
    text (``w:del``, ``w:moveFrom``), hidden runs (``w:vanish``) nor the fallback copy of a drawing (``mc:Fallback``); the
    paragraphs of a text box join the paragraph that holds it. Tables give a block per row of the
    outermost table (each cell's paragraphs; a cell continuing a vertical merge repeats the merge's
    text; a cell spanning columns is there once), the rows after the first carrying it as their
    ``header`` (the chunker repeats it atop a chunk begun among them); a table in a cell gives its rows
    as lines of that cell. The text is counted as it is read."""

    def __init__(self, counted: list[int], limit: int, styles: _Styles, budget: Budget) -> None:
        super().__init__(counted, limit)
        self.styles = styles
        self.budget = budget
        self.blocks: list[Block] = []
        self.path: list[str] = []
        self.paras: list[tuple[list[str], int, list[str | None]]] = []   # open paragraphs: text, depth, [style]
        self.tables: list[_Table] = []
        self.hidden = 0                       # deleted / moved-away / fallback elements open
        self.vanished = -1                    # depth of the open run marked hidden (w:vanish), else -1
        self.in_text = False

    def text(self, text: str) -> None:
        self.paras[-1][0].append(text)
        self.budget.add(len(text))

    def start(self, tag: str, attrib: dict) -> None:
        super().start(tag, attrib)
        path = self.path
        path.append(tag)
        depth = len(path)
        if tag in _HIDDEN:
            self.hidden += 1
        elif self.hidden:
            pass
        elif tag == _P:
            self.paras.append(([], depth, [None]))
        elif tag == _TBL:
            self.tables.append(_Table(depth))
        elif tag == _TR and self.tables and self.tables[-1].row is None:
            t = self.tables[-1]
            t.row, t.row_depth, t.offset, t.below = [], depth, 0, {}
        elif tag == _TC and self.tables and self.tables[-1].row is not None and self.tables[-1].cell_depth < 0:
            t = self.tables[-1]
            t.cell, t.cell_depth, t.span, t.merged = [], depth, 1, False
        elif self.paras and path[-2] == _RUN and self.vanished < 0:
            if tag == _TEXT:
                self.in_text = True
            elif tag == _BREAK:
                if attrib.get(_W + "type", "textWrapping") == "textWrapping":
                    self.text("\n")
            elif tag in _RUN_CHARS:
                self.text(_RUN_CHARS[tag])
        elif tag in _VANISH and path[-2] == _W + "rPr" and depth > 2 and path[-3] == _RUN:
            if attrib.get(_W + "val", "1") not in _OFF:
                self.vanished = depth - 2
        elif self.paras and tag == _W + "pStyle" and path[-2] == _W + "pPr" and depth == self.paras[-1][1] + 2:
            self.paras[-1][2][0] = attrib.get(_W + "val")
        elif self.tables and self.tables[-1].row is not None:
            t = self.tables[-1]
            if tag == _W + "gridBefore" and path[-2] == _W + "trPr" and depth == t.row_depth + 2:
                t.offset = _number(attrib.get(_W + "val"), 0)
            elif path[-2] == _W + "tcPr" and depth == t.cell_depth + 2:
                if tag == _W + "gridSpan":
                    t.span = _number(attrib.get(_W + "val"), 1)
                elif tag == _W + "vMerge":
                    t.merged = attrib.get(_W + "val", "continue") == "continue"

    def data(self, text: str) -> None:
        if self.in_text:
            self.text(text)

    def _place(self, text: str, depth: int, block: Block) -> None:
        """``text`` that ended at ``depth`` (a paragraph, a nested table's row): into the innermost
        open paragraph (a text box's) or cell holding it, else ``block`` is a block of its own."""
        para = self.paras[-1][1] if self.paras else -1
        cell = next((t for t in reversed(self.tables) if 0 <= t.cell_depth < depth), None)
        if para > (cell.cell_depth if cell is not None else -1):
            if text.strip():
                self.paras[-1][0].append("\n" + text.strip())
                self.budget.add(1)
        elif cell is not None:
            cell.cell.append(text)
        elif block.text.strip():
            self.blocks.append(block)

    def end(self, tag: str) -> None:
        depth = len(self.path)
        self.path.pop()
        if tag == _TEXT:
            self.in_text = False
        elif tag == _RUN and depth == self.vanished:
            self.vanished = -1
        elif tag in _HIDDEN:
            self.hidden -= 1
        elif tag == _P and self.paras and self.paras[-1][1] == depth:
            parts, _, style = self.paras.pop()
            text = "".join(parts)
            self._place(text, depth, Block(text.strip(), self.styles.level(style[0])))
        elif tag == _TBL and self.tables and self.tables[-1].depth == depth:
            self.tables.pop()
        elif tag == _TC and self.tables and self.tables[-1].cell_depth == depth:
            t = self.tables[-1]
            if t.merged:
                text = t.above.get(t.offset, "")
                self.budget.add(len(text))
            else:
                text = "\n".join(t.cell).strip()
            t.row.append(text)
            t.below[t.offset] = text
            t.offset += t.span
            t.cell, t.cell_depth = [], -1
        elif tag == _TR and self.tables and self.tables[-1].row_depth == depth:
            t = self.tables[-1]
            row, t.row, t.row_depth, t.above = t.row, None, -1, t.below
            if any(row):
                text = " | ".join(row)
                self._place(text, depth, Block(text, header=t.header))
                if t.header is None:
                    t.header = text


def _number(value: str | None, default: int) -> int:
    try:
        return int(value or default)
    except ValueError:
        return default


def _read_xml(zf: zipfile.ZipFile, name: str, target: _XmlPart, budget: Budget) -> None:
    """Stream the zip member ``name`` through ``target`` (never a whole tree in memory)."""
    try:
        member = zf.open(name)
    except KeyError:
        raise unsupported(f"corrupt docx: no {name!r} in the package") from None
    parser = ElementTree.XMLParser(target=target)
    with member:
        while piece := member.read(DOCX_FEED_BYTES):
            parser.feed(piece)
            budget.check()
        parser.close()


def parse_docx(data: bytes, cfg: KnowledgeConfig, budget: Budget) -> list[Block]:
    """Paragraphs (``Heading N`` / ``Title`` styles become headings) and table rows, in document
    order. The parts' xml is streamed (``xml.etree`` events, no tree): the work is bounded by the
    elements read (``docx_max_xml_elements``, every part together) and the text by the budget,
    counted as it is read (a cell continuing a vertical merge counts its repeated text)."""
    check_zip(data, cfg)
    counted, limit = [0], cfg.docx_max_xml_elements
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            package = _Relationships(counted, limit, "", {"officeDocument"})
            _read_xml(zf, "_rels/.rels", package, budget)
            main = package.targets.get("officeDocument")
            if main is None:
                raise unsupported("corrupt docx: no main document part")
            folder, base = posixpath.split(main)
            styles = _Styles(counted, limit)
            related = _Relationships(counted, limit, folder, {"styles"})
            rels = posixpath.join(folder, "_rels", base + ".rels")
            if rels in zf.namelist():
                _read_xml(zf, rels, related, budget)
            if "styles" in related.targets:
                _read_xml(zf, related.targets["styles"], styles, budget)
            body = _Body(counted, limit, styles, budget)
            _read_xml(zf, main, body, budget)
    except HandlerError:
        raise
    except ElementTree.ParseError as exc:
        raise unsupported(f"corrupt docx: {exc}") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, ValueError) as exc:
        raise unsupported(f"corrupt docx: {type(exc).__name__}: {exc}") from None
    return body.blocks
