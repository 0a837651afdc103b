"""The sessions sidebar: title, message count and last update of each session, newest first, live-updated."""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from protocol.objects import SessionInfo

from client.wording import compact, counted, printable

TITLE_WIDTH = 28      # title cells before the list is laid out (the sidebar is 32 wide); then its width


class SessionList(OptionList):
    """An OptionList whose option ids are session ids."""


class Sidebar(Vertical):
    """Sessions of the user; ``Selected`` is posted when the user picks one."""

    class Selected(Message):
        def __init__(self, session_id: str) -> None:
            super().__init__()
            self.session_id = session_id

    def __init__(self, *, show_times: bool = True, id: str | None = None) -> None:
        super().__init__(id=id)
        self.show_times = show_times
        self.sessions: dict[str, SessionInfo] = {}
        self.current: str | None = None
        self.list = SessionList(id="session-list")

    def compose(self) -> ComposeResult:
        yield Static("Sessions", classes="sidebar-title")
        yield self.list

    def _prompt(self, s: SessionInfo) -> Text:
        sid = s.session_id
        marker = "● " if sid == self.current else "  "
        running = " ⟳" if s.running else ""
        title = Text(marker + printable(s.title or "(untitled)") + running, style="bold" if sid == self.current else "")
        title.truncate(self._title_width(), overflow="ellipsis")   # one line, never wrapped
        count = s.message_count
        detail = f"  {counted(count, 'msg')}"
        if self.show_times:
            stamp = compact(s.updated_at)
            if stamp:
                detail += f" · {stamp}"
        return Text.assemble(title, "\n", (detail, "dim"))

    def _title_width(self) -> int:
        width = self.list.scrollable_content_region.width
        return width - 1 if width > 8 else TITLE_WIDTH

    def on_resize(self) -> None:
        self._refresh_options()   # titles are cut to the new width

    def _order(self) -> list[SessionInfo]:
        return sorted(self.sessions.values(), key=lambda s: s.updated_at, reverse=True)

    def _refresh_options(self, follow_current: bool = False) -> None:
        """Rebuild the options; the cursor stays where the user put it, or (``follow_current``, or
        when its session is gone) moves to the current session."""
        highlighted = self.list.highlighted_option.id if self.list.highlighted_option else self.current
        options = [Option(self._prompt(s), id=s.session_id) for s in self._order()]
        self.list.set_options(options)
        target = self.current if follow_current or highlighted not in self.sessions else highlighted
        if target in self.sessions:
            self.list.highlighted = self.list.get_option_index(target)

    def set_sessions(self, sessions: Iterable[SessionInfo]) -> None:
        self.sessions = {s.session_id: s for s in sessions}
        self._refresh_options()

    def upsert(self, session: SessionInfo) -> None:
        self.sessions[session.session_id] = session
        self._refresh_options()

    def remove(self, session_id: str) -> None:
        if self.sessions.pop(session_id, None) is not None:
            self._refresh_options()

    def clear_running(self) -> None:
        """The connection is lost: no session is known to run a turn any more (a killed server ran
        none after all), so their ⟳ marks go; the reconnect's listing shows the ones that still run."""
        if any(s.running for s in self.sessions.values()):
            self.sessions = {sid: replace(s, running=False) if s.running else s for sid, s in self.sessions.items()}
            self._refresh_options()

    def set_current(self, session_id: str | None) -> None:
        """Mark the session on screen; the cursor follows it."""
        self.current = session_id
        self._refresh_options(follow_current=True)

    def newest_other(self, session_id: str) -> str | None:
        """The most recently updated session other than ``session_id``."""
        for s in self._order():
            if s.session_id != session_id:
                return s.session_id
        return None

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id:
            self.post_message(self.Selected(event.option.id))
