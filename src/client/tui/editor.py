"""A multi-line text editor dialog: a session's system prompt, or a sent message to edit and resend."""
from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static, TextArea


class TextEditModal(ModalScreen[str | None]):
    """Edit ``text``; Ctrl+S or the OK button returns it (stripped), Esc cancels (None).

    ``allow_empty``: an empty text is a valid answer (a system prompt reset to the server's default);
    ``max_chars``: a longer text is refused here, with the limit (the server would refuse it)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel", show=False),
                Binding("ctrl+s", "save", "Save", show=False, priority=True)]

    def __init__(self, title: str, text: str, *, note: str = "", ok_label: str = "Save",
                 allow_empty: bool = False, max_chars: int | None = None) -> None:
        super().__init__(classes="modal")
        self.title_text, self.text, self.note = title, text, note
        self.ok_label, self.allow_empty, self.max_chars = ok_label, allow_empty, max_chars

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide editor"):
            yield Label(self.title_text, classes="dialog-title")
            if self.note:
                yield Static(self.note, markup=False, classes="dialog-note hint")
            yield TextArea(self.text, id="editor-text", soft_wrap=True, show_line_numbers=False)
            with Horizontal(classes="buttons"):
                yield Button(self.ok_label, variant="primary", id="editor-ok")
                yield Button("Cancel", id="editor-cancel")

    def on_mount(self) -> None:
        area = self.query_one("#editor-text", TextArea)
        area.focus()
        area.move_cursor(area.document.end)

    def action_save(self) -> None:
        text = self.query_one("#editor-text", TextArea).text.strip()
        if self.max_chars is not None and len(text) > self.max_chars:
            self.notify(f"The text has {len(text):,} characters; the server takes at most {self.max_chars:,}.",
                        severity="warning")
        elif text or self.allow_empty:
            self.dismiss(text)
        else:
            self.notify("The text is empty", severity="warning")

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "editor-ok":
            self.action_save()
        else:
            self.dismiss(None)
