"""The status line: a spinner with the turn status (thinking / calling tool / generating) and the connection state."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.markup import escape
from textual.reactive import reactive
from textual.widgets import LoadingIndicator, Static

TURN_LABELS = {"thinking": "Thinking", "tool_call": "Calling tool", "generating": "Generating",
               "queued": "Queued", "sending": "Sending"}
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
        label = TURN_LABELS.get(status, status.replace("_", " ").capitalize())
        if self.detail:
            label += f": {escape(self.detail)}"
        self._turn.update(label + " · Esc to cancel")

    def _render_connection(self) -> None:
        text = STATE_LABELS.get(self.connection, escape(self.connection))
        extra = self.detail_conn
        self.connection_text = " ".join(p for p in (self.connection, extra) if p)
        if extra:
            text += f" [dim]{escape(extra)}[/]"
        if self.address:
            text += f" [dim]{escape(self.address)}[/]"
        self._conn.update(text)
