"""The candidate query of PgHistoryStore.search: the messages that can match, cut down in SQL,
scored in Python with the JSON backend's rules (storage/search.py).

``search_text`` holds ``content.casefold()`` (NUL characters as spaces), and the query is folded the
same way, so ``LIKE`` on the trigram-indexed column finds exactly the messages containing the
phrase or one of its tokens. A query with a NUL character reads every visible message of the
user's sessions (or of the one session) and scores them all.
"""
from __future__ import annotations

from typing import Any

from ..search import Query

_BASE = ("SELECT m.session_id, s.title, m.id, m.body FROM nplt_messages m JOIN nplt_sessions s "
         "ON s.session_id = m.session_id WHERE s.user_id = $1 AND NOT s.deleted AND m.id > s.cleared_through "
         "AND ($2::text IS NULL OR m.session_id = $2)")
_ORDER = " ORDER BY s.updated_at DESC, s.session_id DESC, m.id"


def search_text(content: str) -> str:
    """What ``search_text`` stores for a message's content."""
    return content.casefold().replace("\x00", " ")


def _like(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def candidates_sql(q: Query, user_id: str, session_id: str | None) -> tuple[str, list[Any]]:
    """(SQL, arguments) selecting session_id, title, id, body of the candidate messages."""
    if "\x00" in q.text:
        return _BASE + _ORDER, [user_id, session_id]
    patterns = [_like(q.text)]
    if len(q.tokens) >= 2:
        patterns += [_like(t) for t in q.tokens]
    # OR of LIKEs rather than LIKE ANY(array): a GIN index serves each LIKE, not an array of them.
    likes = " OR ".join(f"m.search_text LIKE ${i}" for i in range(3, 3 + len(patterns)))
    return _BASE + f" AND ({likes})" + _ORDER, [user_id, session_id, *patterns]
