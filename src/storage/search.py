"""Search scoring: case-insensitive substring of the whole query plus token matching.

A message matches when the whole query occurs in it (score 1.5, +0.1 per extra occurrence up to
+0.4) or, failing that, when some of the query's tokens do (score = fraction of tokens found, < 1
unless all are found). Tokens are runs of word characters (``\\w+``); matching is by substring,
so Chinese, Japanese and Korean text (no spaces between words) is found by any part of a phrase.
Messages marked ``metadata.canned`` (the offline agent's fixed help and "not understood" texts) or
``metadata.history_listing`` (its answers that list earlier messages: copies of what would be found
anyway) are never matched: they say nothing new about the user's topics; nor are messages
superseded by a regenerate or an edit (``searchable``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgument

SNIPPET_BEFORE = 60
SNIPPET_CHARS = 160
MAX_QUERY_CHARS = 1000
_TOKEN_RE = re.compile(r"\w+")
_SPACE_RE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class Query:
    text: str                  # folded whole query
    tokens: tuple[str, ...]    # folded distinct tokens

    def match(self, content: object) -> tuple[float, int] | None:
        """(score, position of the first match) or None."""
        if not isinstance(content, str) or not content:
            return None
        c = content.casefold()
        pos = c.find(self.text)
        if pos >= 0:
            extra = min(c.count(self.text) - 1, 4)
            return 1.5 + 0.1 * extra, pos
        if len(self.tokens) < 2:
            return None
        found = [p for p in (c.find(t) for t in self.tokens) if p >= 0]
        if not found:
            return None
        return round(len(found) / len(self.tokens), 4), min(found)


def searchable(message: dict[str, Any]) -> bool:
    """Whether search may match a stored message (its dict form): not a canned reply nor a listing
    of earlier messages, and not superseded by a regenerate or an edit (default history pages leave
    those out too)."""
    meta = message.get("metadata")
    return not (isinstance(meta, dict) and (meta.get("canned") or meta.get("history_listing")
                                            or meta.get("superseded")))


def compile_query(query: object) -> Query:
    if not isinstance(query, str) or not query.strip():
        raise InvalidArgument("search query: expected a non-empty string")
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidArgument(f"search query: longer than {MAX_QUERY_CHARS} characters")
    text = _SPACE_RE.sub(" ", query.strip()).casefold()
    tokens = tuple(dict.fromkeys(_TOKEN_RE.findall(text)))
    return Query(text, tokens)


def snippet(content: str, pos: int) -> str:
    """About SNIPPET_CHARS characters of ``content`` around ``pos``, on one line."""
    start = max(0, min(pos, len(content)) - SNIPPET_BEFORE)
    end = min(len(content), start + SNIPPET_CHARS)
    text = _SPACE_RE.sub(" ", content[start:end]).strip()
    return ("…" if start > 0 else "") + text + ("…" if end < len(content) else "")
