"""The chat view: messages as Markdown, a streaming answer, tool call items, inline errors, paging by cursor.

It renders the ``Change``s that ``ChatState`` decides (``apply``); its own maps (``by_id``, ``live``,
``pending``) only index the widgets on screen.
"""
from __future__ import annotations

import re

from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Static
from textual.worker import Worker, WorkerCancelled, WorkerFailed

from protocol.objects import ChatMessage
from protocol.replies import HistoryPageReply

from client.tui.message import MessageView
from client.tui.state import (AppendAnswer, Change, EndAnswer, OpenAnswer, SettleQueued, ShowMessage, ShowQueued,
                              ShowTool)
from client.wording import printable

CODE_BLOCK = re.compile(r"```[^\n]*\n(.*?)```", re.S)
FIRST_PAINT = 12      # newest messages mounted before the first paint (about a screenful)


def code_blocks(text: str) -> list[str]:
    """The fenced code blocks of a Markdown text, in order."""
    return [m.group(1) for m in CODE_BLOCK.finditer(text)]


class ChatView(VerticalScroll):
    """Messages of the current session; pages run newest-first, older pages are prepended on scroll to top."""

    class NeedOlder(Message):
        """Posted when the view is scrolled to the top and older messages exist."""

    def __init__(self, *, show_times: bool = True, id: str | None = None) -> None:
        super().__init__(id=id)
        self.show_times = show_times
        self.session_id: str | None = None
        self.has_more = False
        self.next_before: int | None = None
        self.loading_older = False
        self.by_id: dict[int, MessageView] = {}
        self.live: dict[str, MessageView] = {}
        # user messages of turns queued behind the running one (turn id -> view), kept at the bottom
        self.pending: dict[str, MessageView] = {}
        self._backfill: Worker[None] | None = None
        self._backfill_views: list[ChatMessage] | None = None

    def on_mount(self) -> None:
        self.anchor()

    async def reset(self, session_id: str | None) -> None:
        for view in self.live.values():
            await view.stop_stream()
        if self._backfill is not None:
            self._backfill.cancel()
        self._backfill, self._backfill_views = None, None
        self.session_id = session_id
        self.has_more, self.next_before, self.loading_older = False, None, False
        self.by_id.clear()
        self.live.clear()
        self.pending.clear()
        await self.remove_children()
        self.anchor()

    def _view(self, message: ChatMessage, turn_id: str | None = None) -> MessageView:
        view = MessageView(message, show_time=self.show_times, turn_id=turn_id)
        if view.message_id is not None:
            self.by_id[view.message_id] = view
        return view

    async def show_page(self, page: HistoryPageReply) -> None:
        """Show the newest page of a freshly reset session.

        The newest ``FIRST_PAINT`` messages (a screenful) are mounted at once; the rest of the page is
        built and mounted above them after the first paint, so it does not wait for the whole page.
        """
        messages = [m for m in page.messages if m.id not in self.by_id]
        self.has_more, self.next_before = page.has_more, page.next_before
        head, tail = messages[:-FIRST_PAINT], messages[-FIRST_PAINT:]
        if tail:
            await self.mount_all([self._view(m) for m in tail])
        self.scroll_end(animate=False, immediate=True)
        if head:
            self._backfill_views = head
            self.call_after_refresh(self._start_backfill)

    def _start_backfill(self) -> None:
        if self._backfill_views is not None and self._backfill is None:
            views, self._backfill_views = self._backfill_views, None
            self._backfill = self.run_worker(self._mount_backfill(views), group="backfill", exclusive=True)

    async def _mount_backfill(self, messages: list[ChatMessage]) -> None:
        await self._prepend([self._view(m) for m in messages if m.id not in self.by_id])
        self._backfill = None
        self.call_after_refresh(self.check_top)

    @property
    def backfilling(self) -> bool:
        """True while the older part of the first page is still being mounted."""
        return self._backfill is not None or self._backfill_views is not None

    async def settle(self) -> None:
        """Wait until the whole current page is mounted."""
        self._start_backfill()
        worker = self._backfill
        if worker is not None:
            try:
                await worker.wait()
            except (WorkerCancelled, WorkerFailed) as exc:  # a reset cancelled it: nothing left to wait for
                self.log.debug(f"backfill ended early: {exc!r}")

    async def prepend_page(self, page: HistoryPageReply) -> None:
        """Insert an older page at the top, keeping what the user looks at in place."""
        await self.settle()
        views = [self._view(m) for m in page.messages if m.id not in self.by_id]
        self.has_more, self.next_before = page.has_more, page.next_before
        await self._prepend(views)

    async def _prepend(self, views: list[MessageView]) -> None:
        if not views:
            return
        before_height, before_y = self.virtual_size.height, self.scroll_y
        if self.children:
            await self.mount_all(views, before=self.children[0])
        else:
            await self.mount_all(views)

        def keep_position() -> None:
            if self.is_anchored and not self._anchor_released:
                return   # following the bottom: the anchor keeps it in view
            self.scroll_to(y=before_y + (self.virtual_size.height - before_height), animate=False, immediate=True)
        self.call_after_refresh(keep_position)

    def follow(self) -> None:
        """Scroll to the end and follow new output again (the user just sent a message: it and its
        answer must be in view). Anything else added while the user has scrolled up (other clients'
        turns, older pages) leaves the view where it is: the anchor only follows until released."""
        self.anchor()

    async def add_message(self, message: ChatMessage, turn_id: str | None = None) -> MessageView:
        """Append a message (deduplicated by id) at the bottom, above the queued messages."""
        mid = message.id
        if mid is not None and mid in self.by_id:
            return self.by_id[mid]
        view = self._view(message, turn_id)
        if turn_id:
            self.live[turn_id] = view
        first_pending = next(iter(self.pending.values()), None)
        await self.mount(view, before=first_pending)
        return view

    async def add_pending(self, turn_id: str, message: ChatMessage) -> MessageView:
        """Show the user message of a queued turn (not stored yet, ``id`` null) at the very bottom."""
        if turn_id in self.pending:
            return self.pending[turn_id]
        view = self._view(message)
        self.pending[turn_id] = view
        await self.mount(view)
        return view

    async def settle_pending(self, turn_id: str, message: ChatMessage | None) -> bool:
        """A queued turn started (``message``: its stored user message) or was withdrawn (None)."""
        view = self.pending.pop(turn_id, None)
        if view is None:
            return False
        if message is None:
            await view.remove()
        else:
            await view.finish(message)
            self.register_id(view)
        return True

    async def add_error(self, text: str) -> Static:
        line = Static(printable(text), markup=False, classes="error")   # errors quote the server
        await self.mount(line)
        return line

    # -- rendering ChatState's changes ---------------------------------------------------------------
    async def apply(self, change: Change) -> None:
        """Apply one change decided by ChatState (StatusChanged is the status line's, not ours)."""
        match change:
            case ShowMessage(message=message):
                await self.add_message(message)
            case OpenAnswer(turn_id=turn_id, message=message):
                if turn_id not in self.live:
                    await self.add_message(message, turn_id=turn_id)
            case AppendAnswer(turn_id=turn_id, text=text):
                view = self.live.get(turn_id)
                if view is not None:
                    await view.append(text)
            case ShowTool(turn_id=turn_id, call=call):
                view = self.live.get(turn_id)
                if view is not None:
                    await view.add_tool(call)
            case ShowQueued(turn_id=turn_id, message=message):
                await self.add_pending(turn_id, message)
            case SettleQueued(turn_id=turn_id, message=message):
                if not await self.settle_pending(turn_id, message) and message is not None:
                    await self.add_message(message)
            case EndAnswer():
                await self._end(change)

    async def _end(self, change: EndAnswer) -> None:
        view = self.live.pop(change.turn_id, None)
        message = change.message
        if message is None:
            if view is not None:
                await view.stop_stream()
        else:
            existing = self.by_id.get(message.id) if message.id is not None else None
            if existing is not None and existing is not view:   # already shown (e.g. by a reload)
                if view is not None:
                    await view.stop_stream()
                    await view.remove()
                view = existing
            else:
                if view is None:
                    view = await self.add_message(message)
                await view.finish(message, change.finish_reason)
                self.register_id(view)
        if change.error is not None:
            if view is not None:
                view.set_error(change.error)
            else:
                await self.add_error(change.error)

    def register_id(self, view: MessageView) -> None:
        if view.message_id is not None:
            self.by_id[view.message_id] = view

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self.check_top()

    def check_top(self) -> None:
        """Ask for an older page when scrolled to the top (or the content does not fill the view)."""
        if (self.scroll_y <= 0 and self.has_more and not self.loading_older and self.session_id
                and not self.backfilling):
            self.loading_older = True
            self.post_message(self.NeedOlder())

    def messages(self) -> list[MessageView]:
        return [c for c in self.children if isinstance(c, MessageView)]
