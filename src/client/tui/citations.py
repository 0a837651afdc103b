"""Citations under an answer (metadata ``citations``, docs/knowledge.md): one item per cited passage;
opening one shows the passage (KB_PASSAGE). Citations the answer writes that match no passage it was
given (metadata ``unverified_citations``: the citation strings) are shown after them, marked
``UNVERIFIED_LABEL``, never as sources."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import HorizontalGroup, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from protocol.kb import KbHit

from client.wording import printable

#: what the citations an answer writes without a matching passage are shown under
UNVERIFIED_LABEL = "not found in your documents:"


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


def source_label(cite: dict[str, Any]) -> str:
    """A source's button label: its citation (else the document's name, else the chunk id), followed
    by ``(group NAME)`` for a passage of a group's document (``collection`` ``group:NAME``), as the
    answer's own source lines say it: a personal and a group document of one name would otherwise
    show as two identical buttons."""
    label = str(cite.get("citation") or cite.get("name") or cite["chunk_id"])
    coll = cite.get("collection")
    if isinstance(coll, str) and coll.startswith("group:") and len(coll) > len("group:"):
        label += f" (group {coll[len('group:'):]})"
    return label


class CitationList(HorizontalGroup):
    """The sources of an answer as small buttons; pressing one asks the app to open the passage.
    Citations that match no passage (``unverified``) follow as plain text under ``UNVERIFIED_LABEL``:
    nothing to open, and never shown as a source."""

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
            label = source_label(cite)
            yield Button(Text(printable(label)), compact=True, classes="citation", name=str(i))   # (Text: no markup)
        if self.unverified:
            yield Label(Text(unverified_text(self.unverified)), classes="citations-unverified")

    @on(Button.Pressed, ".citation")
    def _open(self, event: Button.Pressed) -> None:
        event.stop()
        cite = self.citations[int(event.button.name or 0)]
        self.post_message(self.Open(str(cite["chunk_id"]), str(event.button.label)))


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
