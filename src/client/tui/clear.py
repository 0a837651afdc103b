"""The clear dialog: hide every message (still stored until purged) or hide and purge them for good."""
from __future__ import annotations

from typing import Literal

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from client.wording import printable

ClearChoice = Literal["clear", "purge"]

QUESTION = ("Clear every message of “{title}”?\n\n"
            "Clear hides them from the chat, history, search and the model, and drops the session's summaries; "
            "the hidden text stays stored on the server until it is purged.\n"
            "Clear and purge also removes the hidden messages from the server's storage for good.")


class ClearModal(ModalScreen[ClearChoice | None]):
    """Returns "clear" (C), "purge" (clear and purge; P) or None (cancelled; Esc or N)."""

    BINDINGS = [Binding("escape,n", "dismiss(None)", "Cancel", show=False),
                Binding("c", "dismiss('clear')", "Clear", show=False),
                Binding("p", "dismiss('purge')", "Clear and purge", show=False)]

    def __init__(self, title: str) -> None:
        super().__init__(classes="modal")
        self.title_text = title

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Static(QUESTION.format(title=printable(self.title_text)), markup=False,
                         classes="dialog-title question")
            with Horizontal(classes="buttons"):
                yield Button("Clear", variant="warning", id="clear-hide")
                yield Button("Clear and purge", variant="error", id="clear-purge")
                yield Button("Cancel", id="clear-cancel")

    def on_mount(self) -> None:
        self.query_one("#clear-cancel", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss({"clear-hide": "clear", "clear-purge": "purge"}.get(event.button.id or ""))
