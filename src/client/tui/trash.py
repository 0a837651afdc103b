"""The Trash: deleted sessions, each restorable until purged; purge removes one for good (asks first)."""
from __future__ import annotations

from typing import Awaitable, Callable, Sequence

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, OptionList, Static
from textual.widgets.option_list import Option

from protocol.objects import SessionInfo

from client.tui.modals import ConfirmModal
from client.wording import counted, printable

ListFn = Callable[[], Awaitable[Sequence[SessionInfo]]]
ActFn = Callable[[str], Awaitable[object]]

PURGE_QUESTION = ("Purge session “{title}” for good? Its messages, summaries and search index are removed "
                  "from the server's storage. This cannot be undone.")


def count_text(n: int) -> str:
    return "The trash is empty" if not n else counted(n, "deleted session")


class TrashScreen(ModalScreen[None]):
    """Deleted sessions (newest first): R restores the highlighted one, P purges it (after a confirmation)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Close", show=False),
                Binding("r", "restore", "Restore", show=False),
                Binding("p", "purge", "Purge", show=False)]

    def __init__(self, load: ListFn, restore: ActFn, purge: ActFn) -> None:
        super().__init__(classes="modal")
        self._load, self._restore, self._purge = load, restore, purge
        self.sessions: list[SessionInfo] = []
        self.loaded = False

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("Trash", classes="dialog-title")
            yield Static("Deleted sessions stay here, restorable, until they are purged. "
                         "Purge removes a session for good. R restores, P purges, Esc closes.",
                         classes="dialog-note hint")
            yield Static("Loading…", id="trash-info")
            yield OptionList(id="trash-list")
            with Horizontal(classes="buttons"):
                yield Button("Restore", variant="primary", id="trash-restore")
                yield Button("Purge", variant="error", id="trash-purge")
                yield Button("Close", id="trash-close")

    def on_mount(self) -> None:
        self.refresh_list()

    @work(exclusive=True, group="trash")
    async def refresh_list(self) -> None:
        info = self.query_one("#trash-info", Static)
        try:
            self.sessions = list(await self._load())
        except Exception as exc:  # noqa: BLE001 - shown to the user, the dialog stays usable
            info.update(Text(printable(f"Cannot list the trash: {exc}"), style="red"))
            return
        self._show()
        self.loaded = True
        if self.sessions:
            self.query_one("#trash-list", OptionList).focus()

    def _show(self) -> None:
        listing = self.query_one("#trash-list", OptionList)
        listing.set_options(Option(self._prompt(s), id=s.session_id) for s in self.sessions)
        if self.sessions:
            listing.highlighted = 0
        self.query_one("#trash-info", Static).update(count_text(len(self.sessions)))

    @staticmethod
    def _prompt(session: SessionInfo) -> Text:
        n = session.message_count
        head = Text.assemble((printable(session.title or session.session_id), "bold"),
                             (f"  {counted(n, 'message')}", "dim"))
        if not session.preview:
            return head
        return Text.assemble(head, "\n", printable(session.preview.replace("\n", " ")))

    @property
    def selected(self) -> SessionInfo | None:
        index = self.query_one("#trash-list", OptionList).highlighted
        return self.sessions[index] if index is not None and 0 <= index < len(self.sessions) else None

    @work(group="trash-act")
    async def _act(self, session: SessionInfo, purge: bool) -> None:
        title = session.title or session.session_id
        try:
            await (self._purge if purge else self._restore)(session.session_id)
        except Exception as exc:  # noqa: BLE001 - shown to the user, the dialog stays usable
            self.notify(f"{'Purge' if purge else 'Restore'} failed: {exc}", severity="error")
            return
        self.sessions = [s for s in self.sessions if s.session_id != session.session_id]
        self._show()
        self.notify(f"Purged “{title}”" if purge else f"Restored “{title}”")

    def action_restore(self) -> None:
        session = self.selected
        if session is not None:
            self._act(session, False)

    def action_purge(self) -> None:
        session = self.selected
        if session is None:
            return

        def done(ok: bool | None) -> None:
            if ok:
                self._act(session, True)
        self.app.push_screen(ConfirmModal(PURGE_QUESTION.format(title=session.title or session.session_id),
                                          "Purge"), done)

    @on(OptionList.OptionSelected, "#trash-list")
    def _picked(self) -> None:
        self.action_restore()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        match event.button.id:
            case "trash-restore":
                self.action_restore()
            case "trash-purge":
                self.action_purge()
            case _:
                self.dismiss(None)
