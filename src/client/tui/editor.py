"""A multi-line text editor dialog: a session's system prompt, or a sent message to edit and resend."""
from __future__ import annotations

import difflib

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static, TextArea

from client.wording import printable

#: the note added under an editor's own note when the text holds control characters
CONTROLS_NOTE = ("Control characters are shown as \\uXXXX escapes, never run; "
                 "an escape left as it is keeps its character.")


def _escapes(original: str) -> list[tuple[int, int, str]]:
    """The control characters of ``original`` as ``printable`` shows them: (start, end, character)
    in the shown text, in order."""
    out: list[tuple[int, int, str]] = []
    at = 0
    for ch in original:
        shown = printable(ch)
        if shown != ch:
            out.append((at, at + len(shown), ch))
        at += len(shown)
    return out


def restored(original: str, edited: str) -> str:
    """What an editor that showed ``printable(original)`` returns for its ``edited`` text: each
    ``\\uXXXX`` escape of a control character of ``original`` the edit left whole and untouched is
    its character again; what was typed (an escape too) stays as typed. Nothing is lost: an escape
    that was edited, or typed, is kept as its visible text."""
    shown = printable(original)
    if shown == original:
        return edited
    if edited == shown:
        return original
    # the untouched parts: the common head and tail, and what a diff of the middle matches
    n = min(len(shown), len(edited))
    head = 0
    while head < n and shown[head] == edited[head]:
        head += 1
    tail = 0
    while tail < n - head and shown[-1 - tail] == edited[-1 - tail]:
        tail += 1
    blocks: list[tuple[int, int, int]] = [(0, 0, head)]          # (in shown, in edited, length)
    middle = difflib.SequenceMatcher(None, shown[head:len(shown) - tail], edited[head:len(edited) - tail])
    blocks += [(head + a, head + b, size) for a, b, size in middle.get_matching_blocks() if size]
    blocks.append((len(shown) - tail, len(edited) - tail, tail))
    merged: list[list[int]] = []
    for a, b, size in blocks:
        if merged and merged[-1][0] + merged[-1][2] == a and merged[-1][1] + merged[-1][2] == b:
            merged[-1][2] += size
        elif size:
            merged.append([a, b, size])
    escapes = _escapes(original)
    out: list[str] = []
    at_edited = 0
    k = 0
    for a, b, size in merged:
        out.append(edited[at_edited:b])                  # typed (or changed) text before the block
        at = a
        while k < len(escapes) and escapes[k][0] < a:
            k += 1
        while k < len(escapes) and escapes[k][1] <= a + size:   # an escape left whole: its character
            start, end, ch = escapes[k]
            out.append(shown[at:start] + ch)
            at = end
            k += 1
        out.append(shown[at:a + size])
        at_edited = b + size
    out.append(edited[at_edited:])
    return "".join(out)


class TextEditModal(ModalScreen[str | None]):
    """Edit ``text``; Ctrl+S or the OK button returns it (stripped), Esc cancels (None).

    The text is stored text (a sent message, a system prompt): its control characters are shown
    as ``printable`` escapes, never written to the terminal, and ``restored`` on save.

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
            note = self.note
            if printable(self.text) != self.text:
                note = f"{note}\n{CONTROLS_NOTE}" if note else CONTROLS_NOTE
            if note:
                yield Static(note, markup=False, classes="dialog-note hint")
            yield TextArea(printable(self.text), id="editor-text", soft_wrap=True, show_line_numbers=False)
            with Horizontal(classes="buttons"):
                yield Button(self.ok_label, variant="primary", id="editor-ok")
                yield Button("Cancel", id="editor-cancel")

    def on_mount(self) -> None:
        area = self.query_one("#editor-text", TextArea)
        area.focus()
        area.move_cursor(area.document.end)

    def action_save(self) -> None:
        text = restored(self.text, self.query_one("#editor-text", TextArea).text).strip()
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
