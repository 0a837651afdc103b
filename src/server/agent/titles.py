"""The automatic title of a session, from its first user message, without Markdown.

``title_from_message("## Why is **nginx** `502`? See [logs](http://x)")`` is
``"Why is nginx 502? See logs"``: the message is parsed with markdown-it (CommonMark, plus tables
and strikethrough) and only its text is kept: emphasis, headings, list and quote markers, link
targets, images (their alt text stays) and code fences go, code keeps its text. Then whitespace is
collapsed and a title over ``max_chars`` is cut at a word boundary with an ellipsis. Only the first
``PARSE_CHARS`` characters are parsed (a title needs no more, and a huge message must not hold up
the event loop). Pure; a message with no text at all (say, a lone rule) falls back to its raw words.
"""
from __future__ import annotations

import re

from markdown_it import MarkdownIt

PARSE_CHARS = 2000
TITLE_CHARS = 60          # automatic titles, and titles shown in v2 session lists, are at most this long
_WS = re.compile(r"\s+")
_MD = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
_TEXT_KINDS = {"text", "code_inline"}
_BLOCK_TEXT = {"fence", "code_block"}


def markdown_text(text: str) -> str:
    """The plain text of Markdown ``text`` (blocks joined by spaces)."""
    parts: list[str] = []
    for token in _MD.parse(text):
        if token.type == "inline":
            for child in token.children or ():
                if child.type in _TEXT_KINDS:
                    parts.append(child.content)
                elif child.type == "image":
                    parts.append(child.content)         # the alt text
                elif child.type in ("softbreak", "hardbreak"):
                    parts.append(" ")
            parts.append(" ")
        elif token.type in _BLOCK_TEXT:
            parts.append(token.content)
            parts.append(" ")
    return "".join(parts)


def title_from_message(text: str, max_chars: int = TITLE_CHARS) -> str:
    """A one-line title of at most ~``max_chars`` characters, Markdown removed (see module doc)."""
    head = text[:PARSE_CHARS]
    line = _WS.sub(" ", markdown_text(head)).strip()
    if not line:
        line = _WS.sub(" ", head).strip()
    if len(line) <= max_chars:
        return line
    cut = line[:max_chars]
    space = cut.rfind(" ")
    if space >= max_chars // 2:
        cut = cut[:space]
    return cut.rstrip() + "…"
