"""Citations under an answer (metadata ``citations``, docs/knowledge.md): one item per cited passage;
opening one shows the passage (KB_PASSAGE)."""
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


def citations_of(metadata: dict[str, Any]) -> list[dict[str, Any]]:
    """The answer's citations that name a passage (a chunk id)."""
    return [c for c in metadata.get("citations") or () if isinstance(c, dict) and c.get("chunk_id")]


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


class CitationList(HorizontalGroup):
    """The sources of an answer as small buttons; pressing one asks the app to open the passage."""

    DEFAULT_CLASSES = "citations"

    class Open(Message):
        def __init__(self, chunk_id: str, label: str) -> None:
            super().__init__()
            self.chunk_id, self.label = chunk_id, label

    def __init__(self, citations: list[dict[str, Any]]) -> None:
        super().__init__()
        self.citations = citations

    def compose(self) -> ComposeResult:
        yield Label("Sources:", classes="citations-label")
        for i, cite in enumerate(self.citations):
            label = str(cite.get("citation") or cite.get("name") or cite["chunk_id"])
            yield Button(Text(printable(label)), compact=True, classes="citation", name=str(i))   # (Text: no markup)

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
