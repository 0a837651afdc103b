"""The status line: a spinner with the turn status (thinking / calling tool / generating) and the connection state."""
from __future__ import annotations

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.content import Content
from textual.containers import Horizontal
from textual.markup import escape
from textual.reactive import reactive
from textual.widgets import LoadingIndicator, Static

from client.wording import printable

TURN_LABELS = {"thinking": "Thinking", "tool_call": "Calling tool", "generating": "Generating",
               "queued": "Queued", "sending": "Sending"}
TURN_ROOM = 12           # cells kept for the turn status while a turn runs, before the address is dropped
CONNECTION_PADDING = 2  # the connection text's horizontal padding (app.tcss)
SPINNER_CELLS = 6       # the spinner's width (app.tcss)
STATE_LABELS = {"connected": "[green]● connected[/]", "connecting": "[yellow]◌ connecting[/]",
                "reconnecting": "[yellow]◌ reconnecting[/]", "disconnected": "[red]○ disconnected[/]",
                "closed": "[red]○ closed[/]"}


class StatusLine(Horizontal):
    """Left: spinner + turn status while a turn runs. Right: connection state (and address)."""

    turn_status: reactive[str | None] = reactive(None)
    connection: reactive[str] = reactive("connecting")

    def __init__(self, *, address: str = "", id: str | None = None) -> None:
        super().__init__(id=id)
        self.address = address
        self.detail = ""
        self.detail_conn = ""
        self.connection_text = ""
        self._spinner = LoadingIndicator(classes="spinner")
        self._turn = Static("", classes="turn-status")
        self._conn = Static("", classes="connection-state")

    def compose(self) -> ComposeResult:
        yield self._spinner
        yield self._turn
        yield self._conn

    def on_mount(self) -> None:
        self._spinner.display = False
        self._render_connection()

    def set_turn(self, status: str | None, detail: str | None = None) -> None:
        self.detail = detail or ""
        self.turn_status = status
        self._render_turn()
        self._render_connection()   # a running turn's status needs room too

    def set_connection(self, state: str, detail: str = "") -> None:
        self.detail_conn = detail
        self.connection = state
        self._render_connection()

    def _render_turn(self) -> None:
        status = self.turn_status
        self._spinner.display = status is not None
        if status is None:
            self._turn.update("")
            return
        # an unknown status and the detail (a tool's name) come from the server: escaped, made printable
        label = TURN_LABELS.get(status) or escape(printable(status.replace("_", " ").capitalize()))
        if self.detail:
            label += f": {escape(printable(self.detail))}"
        self._turn.update(label + " · Esc to cancel")

    def on_resize(self) -> None:
        self._render_connection()   # the address may fit again, or no longer

    def _render_connection(self) -> None:
        """The state, its detail and the address, as much as fits: the address (then the detail) is
        left out rather than cut at the edge, where a cut port would read as another address."""
        text = STATE_LABELS.get(self.connection, escape(self.connection))
        extra = printable(self.detail_conn)   # may quote the server (an error code)
        self.connection_text = " ".join(p for p in (self.connection, extra) if p)
        room = self._room()
        used = Content.from_markup(text).cell_length
        for part in (extra, self.address):
            if part and room is not None and used + 1 + cell_len(part) > room:
                break
            if part:
                text += f" [dim]{escape(part)}[/]"
                used += 1 + cell_len(part)
        self._conn.update(text)

    def _room(self) -> int | None:
        """Cells the connection text may take (None before the first layout): the line's width less the
        connection's padding, the spinner and some room for the turn status while a turn runs."""
        width = self.size.width
        if not width:
            return None
        if self.turn_status is not None:
            width -= SPINNER_CELLS + TURN_ROOM
        return max(0, width - CONNECTION_PADDING)
