"""The long-term memory panel: what the assistant remembers about the user, each item deletable."""
from __future__ import annotations

from typing import Awaitable, Callable

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, OptionList, Static
from textual.widgets.option_list import Option

from protocol.objects import MemoryItem
from protocol.replies import MemoryListReply

from client.tui.modals import ConfirmModal
from client.wording import counted, minute, printable

ListFn = Callable[[], Awaitable[MemoryListReply]]
ForgetFn = Callable[[str], Awaitable[object]]
TitleFn = Callable[[str], str | None]


def item_prompt(item: MemoryItem, title: str | None = None) -> Text:
    """An item: its kind and text, then its id, where it was said (the session's title when the
    client knows the session, else its id) and when; made printable."""
    when = minute(item.created_at)
    where = f"session {item.session_id}" if title is None else f"in “{title}”"
    return Text.assemble((printable(f"{item.kind:<10}"), "bold"), printable(item.text), "\n",
                         (printable(f"  {item.id} · {where} · {when}"), "dim"))


class MemoryPanel(ModalScreen[None]):
    """Lists the items (MEMORY_LIST); Delete (or the Forget button) removes the highlighted one.
    ``title_of``: a session's title if the client knows it (the sidebar's sessions)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Close", show=False),
                Binding("delete,d", "forget", "Forget", show=False)]

    def __init__(self, list_items: ListFn, forget: ForgetFn, title_of: TitleFn = lambda _sid: None) -> None:
        super().__init__(classes="modal")
        self._list, self._forget, self._title_of = list_items, forget, title_of
        self.items: list[MemoryItem] = []
        self.enabled = True

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("Long-term memory", classes="dialog-title")
            yield Static("Loading…", id="memory-info")
            yield OptionList(id="memory-items")
            with Horizontal(classes="buttons"):
                yield Button("Forget", variant="error", id="memory-forget")
                yield Button("Close", id="memory-close")

    def on_mount(self) -> None:
        self.reload()

    @work(exclusive=True, group="memory")
    async def reload(self) -> None:
        info = self.query_one("#memory-info", Static)
        try:
            reply = await self._list()
        except Exception as exc:  # noqa: BLE001 - shown to the user, the panel stays usable
            info.update(Text(printable(f"Could not load the memory: {exc}"), style="red"))
            return
        self.enabled, self.items = reply.enabled, list(reply.items)
        options = self.query_one("#memory-items", OptionList)
        options.set_options(Option(item_prompt(i, self._title_of(i.session_id)), id=i.id) for i in self.items)
        if not self.enabled:
            info.update("Long-term memory is turned off on this server.")
        elif not self.items:
            info.update("Nothing remembered yet. Facts and preferences you state are kept here.")
        else:
            n = len(self.items)
            info.update(f"{counted(n, 'item')} · Delete forgets the highlighted one")
            options.highlighted = 0
            options.focus()

    def action_forget(self) -> None:
        options = self.query_one("#memory-items", OptionList)
        if options.highlighted is None or not self.items:
            return
        option = options.get_option_at_index(options.highlighted)
        item = next((i for i in self.items if i.id == option.id), None)
        if item is None:
            return

        def done(ok: bool | None) -> None:
            if ok:
                self.forget_item(item.id)
        self.app.push_screen(ConfirmModal(f"Forget this {item.kind}?\n\n“{item.text}”\n\n"
                                          "It is deleted for good and no longer reaches your other sessions.",
                                          "Forget"), done)

    @work(exclusive=True, group="memory")
    async def forget_item(self, item_id: str) -> None:
        try:
            await self._forget(item_id)
        except Exception as exc:  # noqa: BLE001
            self.query_one("#memory-info", Static).update(Text(printable(f"Could not forget it: {exc}"), style="red"))
            return
        self.notify("Forgotten")
        self.reload()

    @on(Button.Pressed, "#memory-forget")
    def _forget_pressed(self) -> None:
        self.action_forget()

    @on(Button.Pressed, "#memory-close")
    def _close(self) -> None:
        self.dismiss(None)
