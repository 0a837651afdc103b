"""One chat message: header in the top border, tool call items, and the body (Markdown for answers;
the user's own messages as typed, in plain text).

Rendering cost matters because Textual lays out the whole widget tree on every frame:

- A settled message (history, or a finished answer) is ONE Static holding a Rich Markdown
  renderable, not Textual's Markdown widget (which makes a widget per block and list item).
- A live answer streams into a Textual ``Markdown`` through ``MarkdownStream`` (fragments are
  appended, only the last block is re-parsed). Once the live part grows past ``SEGMENT_CHARS``, the
  text up to the last paragraph break (outside code fences) is frozen into a Static segment and
  the live Markdown restarts with the remainder; past ``MAX_SEGMENTS`` the segments are merged. The
  widget count stays bounded, so the per-delta cost stays flat however long the answer gets.
"""
from __future__ import annotations

import copy
import dataclasses
import re

from markdown_it import MarkdownIt
from rich.console import Group, RenderableType
from rich.markdown import Markdown as RichMarkdown
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.markup import escape
from textual.widget import Widget
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownStream

from protocol.objects import ChatMessage, ToolCall

from client.tui.citations import CitationList, has_sources
from client.tui.state import NOT_SAVED
from client.tui.toolcall import ToolCallItem
from client.wording import clock, counted, printable
from client.turn_errors import error_line

ROLE_LABELS = {"user": "You", "assistant": "Assistant", "system": "System", "tool": "Tool"}
SEGMENT_CHARS = 1200   # live Markdown text kept before freezing completed paragraphs into a Static
MAX_SEGMENTS = 3       # frozen segments per live answer; more are merged into the first one
FENCE = re.compile(r"^\s*(```|~~~)", re.M)
#: a settled answer is rendered as Markdown up to this many characters (cut at a paragraph break);
#: the rest as plain text, up to ``SHOWN_MAX_CHARS`` in all, and past that a note says how much is not
#: shown (``f3`` copies and export writes the whole text). Rich's Markdown parse and layout grow faster
#: than the text: 64 KB take ~30 ms, 1 MB took 7 s on the event loop, again at every re-open and resize
MARKDOWN_MAX_CHARS = 64_000
SHOWN_MAX_CHARS = 256_000


_PROTOTYPE = RichMarkdown("", code_theme="monokai")
_PARSER = MarkdownIt().enable("strikethrough").enable("table")   # the parser rich.markdown configures


def rendered(text: str) -> RichMarkdown:
    """A Rich Markdown renderable sharing one parser (rich builds a new MarkdownIt per instance), of
    ``text`` made printable: its control characters are shown, never run by the terminal."""
    text = printable(text)
    md = copy.copy(_PROTOTYPE)
    md.markup = text
    md.parsed = _PARSER.parse(text)
    return md


def settled(text: str) -> RenderableType:
    """A settled answer's body: ``rendered`` Markdown of at most ``MARKDOWN_MAX_CHARS`` (cut at the last
    paragraph break before it, outside a code fence), then plain printable text up to ``SHOWN_MAX_CHARS``,
    then a note of what is not shown."""
    if len(text) <= MARKDOWN_MAX_CHARS:
        return rendered(text)
    cut = split_point(text[:MARKDOWN_MAX_CHARS]) or MARKDOWN_MAX_CHARS
    parts: list[RenderableType] = [rendered(text[:cut]), Text(printable(text[cut:SHOWN_MAX_CHARS]))]
    if len(text) > SHOWN_MAX_CHARS:
        parts.append(Text(f"[... {len(text) - SHOWN_MAX_CHARS:,} more characters not shown here: f3 copies "
                          "the whole answer, export writes it]", style="italic"))
    return Group(*parts)


def split_point(text: str) -> int:
    """Index just after the last paragraph break outside a code fence (0: none)."""
    pos = text.rfind("\n\n")
    while pos > 0:
        if len(FENCE.findall(text, 0, pos)) % 2 == 0:
            return pos + 2
        pos = text.rfind("\n\n", 0, pos)
    return 0


# why a stored answer has no text; the server saves what it streamed when a turn is cancelled or the
# server shuts down, but a killed server saves nothing of the running answer: nobody knows how much
# was shown, so "interrupted" does not claim that nothing was
ENDINGS = {"cancelled": "Cancelled before any text was streamed.",
           "shutdown": "Stopped (the server shut down) before any text was streamed.",
           "interrupted": "Interrupted (the server stopped): no text of this answer was saved."}
# the header's word for how an answer ended, when the finish reason alone would mislead
CANCEL_REASONS = {"shutdown": "stopped: the server shut down"}
FINISH_WORDS = {"context_budget": "context full: answered without more tools",
                "max_iterations": "tool step limit: answered without more tools"}


def ending(meta: dict) -> str | None:
    """How an answer ended, for its header (None: it simply finished): its finish reason, except a
    turn the server cancelled while shutting down, which the user did not cancel."""
    reason = meta.get("finish_reason")
    if not reason or reason == "stop":
        return None
    if reason == "cancelled" and meta.get("cancel_reason") in CANCEL_REASONS:
        return CANCEL_REASONS[meta["cancel_reason"]]
    return FINISH_WORDS.get(reason, str(reason))


def not_saved_note(meta: dict) -> str | None:
    """The note under an answer shown with the text this client streamed, which the server did not
    save in full (``state.NOT_SAVED``: the characters it kept)."""
    kept = meta.get(NOT_SAVED)
    if not isinstance(kept, int):
        return None
    saved = "none of it" if kept == 0 else f"only its first {counted(kept, 'character')}"
    return (f"Interrupted: the server stopped during this answer. The text above was streamed to this "
            f"window but is not saved on the server (it kept {saved}).")


def error_text(meta: dict) -> str | None:
    """The error line of a failed turn's stored answer (metadata ``error``, ``error_message``, ``attempts``)."""
    return error_line(meta)          # the attempts said once, as nplt-client history does


def marks(message: ChatMessage) -> list[Static]:
    """What a settled answer shows under its body: its error, or why it is empty (cancelled, interrupted)."""
    meta = message.metadata
    out: list[Static] = []
    error = error_text(meta)
    if error is not None:
        out.append(Static(printable(error), markup=False, classes="error mark"))
    elif not_saved_note(meta) is not None:
        out.append(Static(not_saved_note(meta), markup=False, classes="message-note mark"))
    elif not message.content.strip() and message.role == "assistant":
        why = meta.get("finish_reason")
        if why == "cancelled" and meta.get("cancel_reason") == "shutdown":
            why = "shutdown"
        if why in ENDINGS:
            out.append(Static(ENDINGS[why], markup=False, classes="message-note mark"))
    return out


class Segment(Static):
    """A frozen, static part of a live answer."""

    DEFAULT_CLASSES = "message-body segment"

    def __init__(self, text: str) -> None:
        super().__init__(rendered(text))
        self.text = text

    def set_text(self, text: str) -> None:
        self.text = text
        self.update(rendered(text))


class MessageView(Vertical, can_focus=True):
    """A stored message, or the live answer of a running turn (``turn_id`` set)."""

    def __init__(self, message: ChatMessage, *, show_time: bool = True, turn_id: str | None = None) -> None:
        self.message = message
        self.turn_id = turn_id
        self.show_time = show_time
        super().__init__(classes=f"message -{self.role}")
        self.border_title = self._header_text()   # the header lives in the top border: no extra widget
        self.tool_items: dict[str, ToolCallItem] = {}
        self.streamed_chars = len(self.content)     # every character ever shown (reattach never repeats one)
        self.shown_len = len(self.content)          # answer length on screen (ANSWER_DELTA offsets)
        self._stream: MarkdownStream | None = None
        self._live: Markdown | None = None
        self._live_text = ""
        self.body: Widget = self._make_body()

    @property
    def message_id(self) -> int | None:
        return self.message.id

    @property
    def role(self) -> str:
        return self.message.role

    @property
    def content(self) -> str:
        return self.message.content

    @property
    def header_text(self) -> str:
        return str(self.border_title or "")

    @property
    def is_live(self) -> bool:
        return self._live is not None

    def _header_text(self) -> str:
        parts = [f"[b]{ROLE_LABELS.get(self.role, escape(self.role))}[/b]"]
        when = clock(self.message.timestamp) if self.show_time else ""
        if when:
            parts.append(when)
        meta = self.message.metadata
        if meta.get("queued"):
            parts.append("[i]queued[/i]")
        if meta.get("partial"):
            parts.append("[i]partial[/i]")
        end = ending(meta)
        if end:
            parts.append(f"[i]{escape(end)}[/i]")
        if NOT_SAVED in meta:
            parts.append("[i]not saved[/i]")
        return printable(" · ".join(parts))   # the role and finish reason come from the server

    def _settled_body(self) -> RenderableType:
        """A settled message's body: the user's own text as typed (no Markdown: line breaks and
        characters such as ``__init__`` or ``*`` stay), anything else rendered as Markdown; both
        made printable."""
        return Text(printable(self.content)) if self.role == "user" else settled(self.content)

    def _make_body(self) -> Widget:
        if self.turn_id is None:
            return Static(self._settled_body(), classes="message-body")
        self._live_text = self.content
        self._live = Markdown(printable(self.content), classes="message-body live")
        return self._live

    def compose(self) -> ComposeResult:
        for call in self.message.tool_calls:
            item = ToolCallItem(call)
            self.tool_items[item.call_id] = item
            yield item
        yield self.body
        if self.turn_id is None:
            yield from marks(self.message)
            if has_sources(self.message.metadata):
                yield CitationList.of(self.message.metadata)
        if error_text(self.message.metadata):
            self.add_class("-error")

    def _first_body(self) -> Widget | None:
        return next((c for c in self.children if not isinstance(c, ToolCallItem)), None)

    async def add_tool(self, call: ToolCall) -> ToolCallItem:
        cid = call.id
        item = self.tool_items.get(cid)
        if item is not None:
            item.update_call(call)
            return item
        item = ToolCallItem(call)
        self.tool_items[cid] = item
        first = self._first_body()
        await (self.mount(item, before=first) if first is not None else self.mount(item))
        return item

    # -- streaming --------------------------------------------------------------------------------------
    async def append(self, text: str) -> None:
        """Append streamed answer text to the live Markdown (incremental, bounded cost per delta).

        When the live part outgrows ``SEGMENT_CHARS``, its completed paragraphs (new text included)
        go straight to a static segment: a large coalesced batch is never streamed into the live
        Markdown only to be frozen right after.
        """
        if not text or self._live is None:
            return
        self.shown_len += len(text)
        self.streamed_chars += len(text)
        self.message = dataclasses.replace(self.message, content=self.content + text)
        self._live_text += text
        if len(self._live_text) > SEGMENT_CHARS and await self._freeze():
            return
        if self._stream is None:
            self._stream = Markdown.get_stream(self._live)
        await self._stream.write(printable(text))   # per character: the same as the whole text made printable

    async def _freeze(self) -> bool:
        """Move completed paragraphs of the live text into a static segment (False: none to move)."""
        cut = split_point(self._live_text)
        if cut <= 0 or self._live is None:
            return False
        frozen, rest = self._live_text[:cut], self._live_text[cut:]
        await self.stop_stream()
        segments = [c for c in self.children if isinstance(c, Segment)]
        if len(segments) >= MAX_SEGMENTS:   # merge: the widget count stays bounded too
            segments[0].set_text("".join(seg.text for seg in segments) + frozen)
            await self.remove_children(segments[1:])
        else:
            await self.mount(Segment(frozen), before=self._live)
        self._live_text = rest
        await self._live.update(printable(rest))
        return True

    async def stop_stream(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.stop()

    async def finish(self, message: ChatMessage, finish_reason: str | None = None) -> None:
        """Settle into the stored message: one static Markdown body (also fixes any missed delta)."""
        await self.stop_stream()
        if finish_reason:
            message = dataclasses.replace(message, metadata={**message.metadata, "finish_reason": finish_reason})
        self.message = message
        self.turn_id = None
        self.shown_len = len(self.content)
        for call in message.tool_calls:
            await self.add_tool(call)
        if self._live is not None:
            old = [c for c in self.children if not isinstance(c, ToolCallItem)]
            self._live = None
            self.body = Static(self._settled_body(), classes="message-body")
            await self.mount(self.body, before=old[0] if old else None)
            await self.remove_children(old)
        else:
            self.body.update(self._settled_body())
        self.border_title = self._header_text()
        await self.remove_children(".mark, CitationList")
        shown: list[Widget] = list(marks(message))
        if has_sources(message.metadata):
            shown.append(CitationList.of(message.metadata))
        if shown:
            await self.mount_all(shown)
        if error_text(message.metadata):
            self.add_class("-error")

    def set_error(self, text: str) -> None:
        """Show an error under the answer (once: a stored failed answer already shows its own)."""
        self.add_class("-error")
        if not self.query(".error"):
            self.mount(Static(printable(text), markup=False, classes="error"))
