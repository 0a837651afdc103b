"""Citations under an answer (metadata ``citations``, docs/knowledge.md): one item per cited passage;
opening one shows the passage (KB_PASSAGE). Citations the answer writes that match no passage it was
given (metadata ``unverified_citations``: the citation strings) are shown after them, marked
``UNVERIFIED_LABEL``, never as sources."""
from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual import events
from textual.containers import HorizontalGroup, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from protocol.kb import KbHit

from client.wording import printable

#: what the citations an answer writes without a matching passage are shown under
UNVERIFIED_LABEL = "not found in your documents:"
#: the most terminal cells a source's button label takes (less when the chat is narrower): a longer
#: citation is cut in the middle ("…"), its "(group NAME)" kept
SOURCE_LABEL_CELLS = 60
#: the fewest cells of a cut citation shown before its "(group NAME)" (a long group name is cut too)
MIN_CITATION_CELLS = 12


def citations_of(metadata: dict[str, Any]) -> list[dict[str, Any]]:
    """The answer's citations that name a passage (a chunk id)."""
    return [c for c in metadata.get("citations") or () if isinstance(c, dict) and c.get("chunk_id")]


def unverified_of(metadata: dict[str, Any]) -> list[str]:
    """The citations the answer writes that match no passage it was given (``unverified_citations``:
    strings such as ``[vendor.pdf §p. 4]``), each once, in order."""
    raw = metadata.get("unverified_citations")
    out: list[str] = []
    for c in raw if isinstance(raw, (list, tuple)) else ():
        text = c.get("citation") if isinstance(c, dict) else c     # (a server that sends objects)
        if isinstance(text, str) and text.strip() and text not in out:
            out.append(text)
    return out


def has_sources(metadata: dict[str, Any]) -> bool:
    """Whether the answer shows a ``CitationList``: it cites passages, or cites what matches none."""
    return bool(citations_of(metadata) or unverified_of(metadata))


def unverified_text(citations: list[str]) -> str:
    """``not found in your documents: [x §y] [z]`` (made printable)."""
    return printable(" ".join([UNVERIFIED_LABEL, *citations]))


def location_text(location: dict[str, Any] | None) -> str:
    """A passage's location (docs/protocol.md §5.8: ``heading`` path, ``page``, ``lines`` [a, b]) for
    people: ``Runbook › Restore, page 3, lines 3-7`` (``line 3`` for one line)."""
    loc = location or {}
    parts: list[str] = []
    heading = loc.get("heading")
    if heading:
        parts.append(" › ".join(str(h) for h in heading) if isinstance(heading, (list, tuple)) else str(heading))
    if loc.get("page") not in (None, ""):
        parts.append(f"page {loc['page']}")
    lines = loc.get("lines")
    if isinstance(lines, str) and "-" in lines:   # "3-7", as some servers write it
        lines = lines.split("-", 1)
    if isinstance(lines, (list, tuple)) and len(lines) == 2:
        a, b = (str(n).strip() for n in lines)
        parts.append(f"line {a}" if a == b else f"lines {a}-{b}")
    elif lines not in (None, "", []):
        parts.append(f"line {lines}")
    return ", ".join(parts)


def source_parts(cite: dict[str, Any]) -> tuple[str, str]:
    """A source's label in two parts: its citation (else the document's name, else the chunk id),
    and `` (group NAME)`` for a passage of a group's document (``collection`` ``group:NAME``), else
    ""."""
    label = str(cite.get("citation") or cite.get("name") or cite["chunk_id"])
    coll = cite.get("collection")
    if isinstance(coll, str) and coll.startswith("group:") and len(coll) > len("group:"):
        return label, f" (group {coll[len('group:'):]})"
    return label, ""


def source_label(cite: dict[str, Any]) -> str:
    """A source's button label: its citation (else the document's name, else the chunk id), followed
    by ``(group NAME)`` for a passage of a group's document (``collection`` ``group:NAME``), as the
    answer's own source lines say it: a personal and a group document of one name would otherwise
    show as two identical buttons."""
    return "".join(source_parts(cite))


def _middle_cut(text: str, cells: int) -> str:
    """``text`` in at most ``cells`` terminal cells (at least 1), its middle cut to "…"."""
    if cell_len(text) <= cells:
        return text
    keep = max(cells - 1, 0)
    head, tail = "", ""
    i, j = 0, len(text)
    while i < j:                                   # take from both ends, the head first
        if cell_len(head) <= cell_len(tail):
            if cell_len(head) + cell_len(tail) + cell_len(text[i]) > keep:
                break
            head += text[i]
            i += 1
        else:
            if cell_len(head) + cell_len(tail) + cell_len(text[j - 1]) > keep:
                break
            tail = text[j - 1] + tail
            j -= 1
    return head + "…" + tail


def fitted_label(cite: dict[str, Any], cells: int = SOURCE_LABEL_CELLS) -> str:
    """A source's button label (``source_label``, made printable) in at most ``cells`` cells: a
    longer citation is cut in the middle, its `` (group NAME)`` kept whole while it leaves the
    citation ``MIN_CITATION_CELLS`` (a group's name is cut in the middle past that)."""
    head, suffix = (printable(part) for part in source_parts(cite))
    if cell_len(head) + cell_len(suffix) <= cells:
        return head + suffix
    if suffix and cells - cell_len(suffix) < MIN_CITATION_CELLS:
        name = suffix[len(" (group "):-1]
        suffix = f" (group {_middle_cut(name, max(cells - MIN_CITATION_CELLS - len(' (group )'), 1))})"
    return _middle_cut(head, max(cells - cell_len(suffix), MIN_CITATION_CELLS)) + suffix


_BUTTON_PADDING, _BUTTON_MIN = 2, 16     # a compact Button's cells around its label, and its min-width


class CitationList(HorizontalGroup):
    """The sources of an answer as small buttons; pressing one asks the app to open the passage.
    Citations that match no passage (``unverified``) follow as plain text under ``UNVERIFIED_LABEL``:
    nothing to open, and never shown as a source. On one line while they fit the chat's width, else
    one per line, each label cut in the middle to fit (``fitted_label``): a button past the edge
    would be focused by Tab, yet unseen."""

    DEFAULT_CLASSES = "citations"
    DEFAULT_CSS = """
    CitationList .citations-unverified {
        color: $text-warning;
    }
    """

    class Open(Message):
        def __init__(self, chunk_id: str, label: str) -> None:
            super().__init__()
            self.chunk_id, self.label = chunk_id, label

    def __init__(self, citations: list[dict[str, Any]], unverified: list[str] | None = None) -> None:
        super().__init__()
        self.citations = citations
        self.unverified = list(unverified or ())

    @classmethod
    def of(cls, metadata: dict[str, Any]) -> CitationList:
        """The list for an answer's metadata (show it when ``has_sources``)."""
        return cls(citations_of(metadata), unverified_of(metadata))

    def compose(self) -> ComposeResult:
        if self.citations:
            yield Label("Sources:", classes="citations-label")
        for i, cite in enumerate(self.citations):
            yield Button(Text(fitted_label(cite)), compact=True, classes="citation", name=str(i))   # (Text: no markup)
        if self.unverified:
            yield Label(Text(unverified_text(self.unverified)), classes="citations-unverified")

    def on_resize(self, event: events.Resize) -> None:
        self._fit(self.content_size.width)

    def _fit(self, width: int) -> None:
        """One line when everything fits ``width`` cells (each item and its one-cell margin), else
        one item per line, the labels cut to ``width``."""
        if width <= 0:
            return
        labels = [fitted_label(cite) for cite in self.citations]
        one_line = sum(max(cell_len(label) + _BUTTON_PADDING, _BUTTON_MIN) + 1 for label in labels)
        if self.citations:
            one_line += len("Sources:") + 1
        if self.unverified:
            one_line += cell_len(unverified_text(self.unverified)) + 1
        vertical = one_line > width
        if vertical:
            cells = min(SOURCE_LABEL_CELLS, max(width - _BUTTON_PADDING - 1, 1))
            labels = [fitted_label(cite, cells) for cite in self.citations]
        layout = "vertical" if vertical else "horizontal"
        if self.styles.layout is None or self.styles.layout.name != layout:
            self.styles.layout = layout
        for button in self.query(".citation").results(Button):
            label = labels[int(button.name or 0)]
            if str(button.label) != label:
                button.label = Text(label)

    @on(Button.Pressed, ".citation")
    def _open(self, event: Button.Pressed) -> None:
        event.stop()
        cite = self.citations[int(event.button.name or 0)]
        self.post_message(self.Open(str(cite["chunk_id"]), printable(source_label(cite))))


class PassageModal(ModalScreen[None]):
    """One cited passage: where it is, and its text (quoted, never obeyed; made printable)."""

    BINDINGS = [Binding("escape,q", "dismiss(None)", "Close", show=False)]

    def __init__(self, passage: KbHit) -> None:
        super().__init__(classes="modal")
        self.passage = passage

    def compose(self) -> ComposeResult:
        p = self.passage
        where = location_text(p.location)
        with Vertical(classes="dialog wide passage"):
            yield Label(Text(printable(p.citation or p.name)), classes="dialog-title")
            yield Static(printable(f"{p.name} · {p.collection}" + (f" · {where}" if where else "")), markup=False,
                         classes="dialog-note")
            with VerticalScroll(id="passage-body"):
                yield Static(printable(p.text), markup=False, id="passage-text")
            yield Button("Close", id="passage-close")

    @on(Button.Pressed, "#passage-close")
    def _close(self) -> None:
        self.dismiss(None)
