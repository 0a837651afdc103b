"""Modal screens: rename, confirm, search, export, help."""
from __future__ import annotations

import os
import unicodedata
from pathlib import Path
from typing import Awaitable, Callable, Sequence

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Markdown, OptionList, Static
from textual.widgets.option_list import Option

from protocol.messages import MAX_TITLE_CHARS
from protocol.objects import SearchHit

from client.files import SEPARATORS
from client.wording import counted, printable

MAX_TITLE = MAX_TITLE_CHARS   # the server's limit on a session title (protocol.messages)


def title_problem(title: str) -> str | None:
    """Why the server would refuse ``title`` (stripped) as a session title, in words (None: it is fine)."""
    if all(c.isspace() or unicodedata.category(c) == "Cf" for c in title):
        return "The title is empty: type one, or press Esc to keep the current title."
    if len(title) > MAX_TITLE:
        return f"The title has {len(title):,} characters; a title has at most {MAX_TITLE}."
    if any(unicodedata.category(c) == "Cc" for c in title):
        return "The title must be one line of text, without control characters."
    return None


class TitleInput(Input):
    """A title input: a paste longer than the room left is cut to fit (and says so) instead of being
    dropped whole, as Input does with a paste over ``max_length``."""

    def _on_paste(self, event: events.Paste) -> None:
        lines = event.text.splitlines()
        text = lines[0] if lines else ""
        start, end = sorted(self.selection)
        room = self.max_length - (len(self.value) - (end - start)) if self.max_length else len(text)
        if len(text) > room:
            text = text[:max(0, room)]
            self.notify(f"A title has at most {self.max_length} characters: the pasted text was cut.",
                        severity="warning")
        self.replace(text, start, end)
        event.stop()
        event.prevent_default()


class RenameModal(ModalScreen[str | None]):
    """Ask for a new session title (1..MAX_TITLE characters, one line); a title the server would
    refuse is explained here and the dialog stays open. The current title is shown made printable
    (the server refuses a title with control characters anyway)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel", show=False)]

    def __init__(self, title: str) -> None:
        super().__init__(classes="modal")
        self.current = title

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Rename session", classes="dialog-title")
            yield TitleInput(printable(self.current), max_length=MAX_TITLE, id="rename-input")
            with Horizontal(classes="buttons"):
                yield Button("Rename", variant="primary", id="rename-ok")
                yield Button("Cancel", id="rename-cancel")

    @on(Input.Submitted)
    @on(Button.Pressed, "#rename-ok")
    def _ok(self) -> None:
        title = self.query_one("#rename-input", Input).value.strip()
        problem = title_problem(title)
        if problem is not None:
            self.notify(problem, severity="warning")
            return
        self.dismiss(title)

    @on(Button.Pressed, "#rename-cancel")
    def _cancel(self) -> None:
        self.dismiss(None)


class ConfirmModal(ModalScreen[bool]):
    """A yes/no question; Y (or Enter on the confirm button) confirms, Esc, N (or Enter on Cancel, where the
    focus starts: a stray Enter never deletes) cancels. The question is shown made printable (it quotes
    names and texts from the server)."""

    BINDINGS = [Binding("escape,n", "dismiss(False)", "No", show=False),
                Binding("y", "dismiss(True)", "Yes", show=False)]

    def __init__(self, question: str, confirm_label: str = "Delete") -> None:
        super().__init__(classes="modal")
        self.question, self.confirm_label = question, confirm_label

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(printable(self.question), markup=False, classes="dialog-title question")
            with Horizontal(classes="buttons"):
                yield Button(self.confirm_label, variant="error", id="confirm-yes")
                yield Button("Cancel", id="confirm-no")

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")


SearchFn = Callable[[str], Awaitable[Sequence[SearchHit]]]


class SearchModal(ModalScreen[SearchHit | None]):
    """Search across sessions; picking a hit returns it (the app then jumps to the message)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Close", show=False)]

    def __init__(self, search: SearchFn) -> None:
        super().__init__(classes="modal")
        self._search = search
        self.hits: list[SearchHit] = []

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("Search all sessions", classes="dialog-title")
            yield Input(placeholder="words to find, Enter to search", id="search-input")
            yield Static("", id="search-info")
            yield OptionList(id="search-results")

    @on(Input.Submitted, "#search-input")
    def _submitted(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.run_search(event.value.strip())

    @work(exclusive=True, group="search")
    async def run_search(self, query: str) -> None:
        info = self.query_one("#search-info", Static)
        info.update("Searching…")
        try:
            self.hits = list(await self._search(query))
        except Exception as exc:  # noqa: BLE001 - shown to the user, the modal stays usable
            info.update(Text(printable(f"Search failed: {exc}"), style="red"))
            return
        results = self.query_one("#search-results", OptionList)
        results.set_options(Option(self._prompt(h), id=str(i)) for i, h in enumerate(self.hits))
        info.update(counted(len(self.hits), "result"))
        if self.hits:
            results.highlighted = 0
            results.focus()

    @staticmethod
    def _prompt(hit: SearchHit) -> Text:
        head = Text.assemble((printable(hit.title or hit.session_id), "bold"),
                             (printable(f"  #{hit.message_id} {hit.role}"), "dim"))
        return Text.assemble(head, "\n", printable(hit.snippet.replace("\n", " ")))

    @on(OptionList.OptionSelected, "#search-results")
    def _picked(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.hits[int(event.option.id or 0)])


class ExportModal(ModalScreen[tuple[str, str] | None]):
    """Choose Markdown or JSON and a file path; returns (format, path)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel", show=False)]

    def __init__(self, default_stem: str, folder: Path) -> None:
        super().__init__(classes="modal")
        self.default_path = str(folder / f"{default_stem}.md")

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("Export session", classes="dialog-title")
            yield Input(self.default_path, id="export-path")
            with Horizontal(classes="buttons"):
                yield Button("Markdown", variant="primary", id="export-markdown")
                yield Button("JSON", variant="primary", id="export-json")
                yield Button("Cancel", id="export-cancel")

    @on(Input.Submitted, "#export-path")
    def _submitted(self, event: Input.Submitted) -> None:
        """Enter saves; the format follows the file name (``.json``: JSON, else Markdown)."""
        path = event.value.strip()
        self._save("json" if path.lower().endswith(".json") else "markdown")

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "export-cancel":
            self.dismiss(None)
            return
        self._save("json" if event.button.id == "export-json" else "markdown")

    def _save(self, fmt: str) -> None:
        """Return (format, path): ``~`` expanded, a ``.md``/``.json`` suffix following the format. A
        trailing separator is kept (it names a folder: ``client.files.export_target``; ``Path()``
        would drop it and the export would become a file of the folder's name)."""
        path = os.path.expanduser(self.query_one("#export-path", Input).value.strip())
        if not path:
            return
        if not path.endswith(SEPARATORS):
            p = Path(path)
            if p.suffix in (".md", ".json"):
                path = str(p.with_suffix(".json" if fmt == "json" else ".md"))
        self.dismiss((fmt, path))


#: the narrowest help screen (columns) that shows the bindings as a table: narrower, the table's
#: Key column was squeezed to "K…" (keys unreadable) while the binding ids kept their width, so
#: the bindings are a list instead, keys first
HELP_TABLE_MIN_WIDTH = 60


class HelpScreen(ModalScreen[None]):
    """Key bindings with their ids (remappable in the config keymap) and short usage notes: a table,
    or on a screen narrower than ``HELP_TABLE_MIN_WIDTH`` a list (``- keys: action · id``)."""

    BINDINGS = [Binding("escape,f1,q,question_mark", "dismiss(None)", "Close", show=False)]

    def __init__(self, rows: list[tuple[str, str, str]]) -> None:
        super().__init__(classes="modal")
        self.rows = rows

    def compose(self) -> ComposeResult:
        notes = ["", "Enter sends, Shift+Enter (or Ctrl+J) inserts a newline, Up/Down on the first/last line "
                     "recall earlier inputs. Scroll to the top of the chat to load older messages.",
                 "Remap keys in the `[keymap]` table of the client config file (binding id = \"keys\").",
                 "", "Press Esc to close."]
        table = ["# Help", "", "| Key | Action | Binding id |", "|---|---|---|"]
        table += [f"| {self.key_display(keys)} | {desc} | `{bid}` |" for bid, keys, desc in self.rows]
        listed = ["# Help", ""] + [f"- {self.key_display(keys)}: {desc} · `{bid}`" for bid, keys, desc in self.rows]
        with VerticalScroll(classes="dialog help"):
            yield Markdown("\n".join(table + notes), id="help-text")
            yield Markdown("\n".join(listed + notes), id="help-list")

    def on_mount(self) -> None:
        self._fit(self.size.width)

    def on_resize(self, event: events.Resize) -> None:
        self._fit(event.size.width)

    def _fit(self, width: int) -> None:
        """The table where it fits, else the list."""
        narrow = width < HELP_TABLE_MIN_WIDTH
        self.query_one("#help-text", Markdown).display = not narrow
        self.query_one("#help-list", Markdown).display = narrow

    def key_display(self, keys: str) -> str:
        """Comma-separated binding keys as the footer shows them (``f1,question_mark``: ``f1, ?``), as
        a code span of a Markdown table cell."""
        shown = [self.app.get_key_display(Binding(key.strip(), "")) for key in keys.split(",") if key.strip()]
        text = ",".join(shown).replace("|", "\\|")   # no space: the table would break the cell there
        return f"`` {text} ``" if "`" in text else f"`{text}`"
