"""The message input: a TextArea where Enter sends, Shift+Enter (or Ctrl+J) inserts a newline and
Up/Down recall earlier inputs when the cursor is on the first/last row on screen (a long line wraps
to several rows: Up/Down move between them first)."""
from __future__ import annotations

from textual import events
from textual.message import Message
from textual.widgets import TextArea

MAX_RECALL = 200   # inputs kept for Up/Down recall
NEWLINE_KEYS = frozenset({"shift+enter", "ctrl+j"})


class ChatInput(TextArea):
    """Multi-line input with send-on-Enter and input history recall."""

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, soft_wrap=True, show_line_numbers=False, tab_behavior="focus",
                         placeholder="Message · Enter sends · Shift+Enter newline · Esc cancels")
        self.recall: list[str] = []
        self._recall_index: int | None = None   # index into history while recalling, None = editing new
        self._draft = ""
        self._submitted: str | None = None   # the text posted and not yet taken (``accept``) or kept (``keep``)

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.submit()
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)

    def submit(self) -> None:
        """Post the text (if not blank). The input keeps it until the app takes it (``accept``): a
        message that cannot be sent stays here (``keep``). Meanwhile Enter does not post it again (two
        quick Enters would send it twice)."""
        text = self.text
        if text.strip() and text != self._submitted:
            self._submitted = text
            self.post_message(self.Submitted(text))

    def keep(self, text: str) -> None:
        """``text`` was not sent: it stays in the input, and Enter submits it again."""
        if self._submitted == text:
            self._submitted = None

    def accept(self, text: str) -> None:
        """``text`` is being sent: remember it for Up/Down and clear the input (if it still holds it)."""
        if not self.recall or self.recall[-1] != text:
            self.recall.append(text)
            del self.recall[:-MAX_RECALL]
        self._recall_index, self._draft = None, ""
        self.keep(text)
        if self.text == text:
            self.clear()

    def give_back(self, text: str) -> None:
        """A message that was refused after all comes back into the input, unless something new was
        typed meanwhile (then it stays reachable with Up)."""
        if not self.text.strip():
            self._show(text, at_end=True)

    def _show(self, text: str, at_end: bool) -> None:
        self.load_text(text)
        lines = text.split("\n")
        self.move_cursor((len(lines) - 1, len(lines[-1])) if at_end else (0, 0))

    def action_cursor_up(self, select: bool = False) -> None:
        if select or not self.navigator.is_first_wrapped_line(self.cursor_location) or not self.recall:
            super().action_cursor_up(select)
            return
        if self._recall_index is None:
            self._draft = self.text
            self._recall_index = len(self.recall) - 1
        elif self._recall_index > 0:
            self._recall_index -= 1
        else:
            return
        self._show(self.recall[self._recall_index], at_end=True)

    def action_cursor_down(self, select: bool = False) -> None:
        if select or not self.navigator.is_last_wrapped_line(self.cursor_location) or self._recall_index is None:
            super().action_cursor_down(select)
            return
        if self._recall_index < len(self.recall) - 1:
            self._recall_index += 1
            self._show(self.recall[self._recall_index], at_end=True)
        else:
            self._recall_index = None
            self._show(self._draft, at_end=True)
