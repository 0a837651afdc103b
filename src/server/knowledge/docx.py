"""Reading a .docx: its zip checked against the limits before anything is decompressed (zip
bombs), then its xml parts streamed as ``xml.etree`` events (never a whole tree), every element
counted toward ``docx_max_xml_elements`` and every character toward the parse's ``Budget``: the body's
paragraphs (``Heading N`` / ``Title`` styles as headings) and its tables' rows, in document order."""
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
_BODY, _P, _TBL, _TR, _TC = _W + "body", _W + "p", _W + "tbl", _W + "tr", _W + "tc"
_RUN, _HYPERLINK, _TEXT, _BREAK = _W + "r", _W + "hyperlink", _W + "t", _W + "br"
_RUN_CHARS = {_W + "tab": "\t", _W + "ptab": "\t", _W + "cr": "\n", _W + "noBreakHyphen": "-"}


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


class _Body(_XmlPart):
    """Blocks of the main document part, in document order, read as its xml streams by: python-docx's
    paragraphs (the body's ``w:p``; the text of the runs and hyperlinks directly in them) and the
    rows of the body's tables (each cell's paragraphs; a cell continuing a vertical merge repeats the
    merge's text; a cell spanning columns is there once). The text is counted as it is read."""

    def __init__(self, counted: list[int], limit: int, styles: _Styles, budget: Budget) -> None:
        super().__init__(counted, limit)
        self.styles = styles
        self.budget = budget
        self.blocks: list[Block] = []
        self.path: list[str] = []
        self.para: list[str] | None = None    # text of the paragraph being read (body or cell)
        self.para_depth = 0
        self.style: str | None = None
        self.in_text = False
        self.row: list[str] | None = None     # cell texts of the body table row being read
        self.cell: list[str] = []
        self.offset = self.span = 0           # grid column of the cell, columns it spans
        self.merged = False                   # the cell continues a vertical merge
        self.above: dict[int, str] = {}       # the row above: cell text by grid column
        self.below: dict[int, str] = {}

    def text(self, text: str) -> None:
        self.para.append(text)
        self.budget.add(len(text))

    def start(self, tag: str, attrib: dict) -> None:
        super().start(tag, attrib)
        path = self.path
        path.append(tag)
        depth = len(path)
        if self.para is not None:
            inner = depth - self.para_depth   # 1: the paragraph's child, 2: its grandchild, ...
            if inner == 2 and path[-2] == _W + "pPr" and tag == _W + "pStyle":
                self.style = attrib.get(_W + "val")
            elif (inner == 2 and path[-2] == _RUN) or (inner == 3 and path[-2] == _RUN and path[-3] == _HYPERLINK):
                if tag == _TEXT:
                    self.in_text = True
                elif tag == _BREAK:
                    if attrib.get(_W + "type", "textWrapping") == "textWrapping":
                        self.text("\n")
                elif tag in _RUN_CHARS:
                    self.text(_RUN_CHARS[tag])
        elif tag == _P and ((depth == 3 and path[1] == _BODY) or (depth == 6 and self.row is not None
                                                                  and path[-2] == _TC)):
            self.para, self.para_depth, self.style = [], depth, None
        elif depth == 3 and tag == _TBL and path[1] == _BODY:
            self.above = {}
        elif depth == 4 and tag == _TR and path[2] == _TBL and path[1] == _BODY:
            self.row, self.offset, self.below = [], 0, {}
        elif self.row is not None:
            if depth == 5 and tag == _TC:
                self.cell, self.span, self.merged = [], 1, False
            elif depth == 6 and tag == _W + "gridBefore" and path[-2] == _W + "trPr":
                self.offset = _number(attrib.get(_W + "val"), 0)
            elif depth == 7 and path[-2] == _W + "tcPr" and path[-3] == _TC:
                if tag == _W + "gridSpan":
                    self.span = _number(attrib.get(_W + "val"), 1)
                elif tag == _W + "vMerge":
                    self.merged = attrib.get(_W + "val", "continue") == "continue"

    def data(self, text: str) -> None:
        if self.in_text:
            self.text(text)

    def end(self, tag: str) -> None:
        depth = len(self.path)
        self.path.pop()
        if self.para is not None:
            if tag == _TEXT:
                self.in_text = False
            elif depth == self.para_depth:
                text = "".join(self.para)
                self.para = None
                if self.row is not None:
                    self.cell.append(text)
                elif text.strip():
                    self.blocks.append(Block(text.strip(), self.styles.level(self.style)))
        elif self.row is not None and depth == 5 and tag == _TC:
            if self.merged:
                text = self.above.get(self.offset, "")
                self.budget.add(len(text))
            else:
                text = "\n".join(self.cell).strip()
            self.row.append(text)
            self.below[self.offset] = text
            self.offset += self.span
        elif self.row is not None and depth == 4 and tag == _TR:
            if any(self.row):
                self.blocks.append(Block(" | ".join(self.row)))
            self.row, self.above = None, self.below


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
