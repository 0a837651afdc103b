"""A settled answer of a megabyte is not parsed as Markdown whole on the event loop.

Before, a 1 MB answer was one Rich Markdown renderable: parsed and laid out in full (7 s loop stalls
when it settled, again at every re-open and resize). Now Markdown covers its first MARKDOWN_MAX_CHARS,
plain text follows up to SHOWN_MAX_CHARS, and a note says how much is not shown."""
from __future__ import annotations

import io

from rich.console import Console, Group
from rich.markdown import Markdown
from rich.text import Text

from client.tui.message import MARKDOWN_MAX_CHARS, SHOWN_MAX_CHARS, settled


def _lines(renderable) -> list[str]:
    console = Console(file=io.StringIO(), width=100, color_system=None)
    console.print(renderable)
    return console.file.getvalue().splitlines()


def test_a_short_answer_is_markdown_as_before():
    body = settled("# Title\n\nSome **bold** text.")
    assert isinstance(body, Markdown)


def test_a_huge_answer_is_markdown_at_its_start_then_text_then_a_note():
    paragraph = "The backup of db-{0} ran at 02:00 UTC and kept 14 days of archives. " * 3
    text = "\n\n".join(paragraph.format(i) for i in range(6000))      # ~1.2 MB
    body = settled(text)
    assert isinstance(body, Group)
    markdown, plain, note = body.renderables
    assert isinstance(markdown, Markdown) and len(markdown.markup) <= MARKDOWN_MAX_CHARS
    assert markdown.markup.endswith("\n\n")                             # cut at a paragraph break
    assert isinstance(plain, Text) and len(markdown.markup) + len(plain.plain) == SHOWN_MAX_CHARS
    assert isinstance(note, Text) and f"{len(text) - SHOWN_MAX_CHARS:,} more characters" in note.plain
    shown = "\n".join(_lines(body))
    assert "db-0 " in shown and "more characters not shown here" in shown


def test_controls_in_the_plain_part_are_shown_escaped():
    text = "a" * MARKDOWN_MAX_CHARS + "\n\nend \x1b]0;title\x07 \u202e"
    markdown, plain = settled(text).renderables
    assert "\x1b" not in plain.plain and "\u202e" not in plain.plain and "\\u001b" in plain.plain
