"""Session titles for the memory block: an item names the session it came from by the title the
user gave it (``SESSION_RENAME``). An automatic title (``title_auto``: the first message's text) or
the default one is not used: the first would quote the user's words again, beside the item and after
an item was forgotten or its message edited; the item's session is then named by its id.

``SessionTitles.of(ids)`` reads each session's record (``store.get``, at most ``user_memory.k``
sessions a turn, concurrently) and keeps its title for ``TTL_S`` seconds, so a user who keeps
asking in one session costs no read a turn; a rename shows up within that time. A session that
cannot be read (deleted, purged, storage down) is named by its id too.
"""
from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any, Callable, Iterable

from storage.models import DEFAULT_TITLE

TTL_S = 60.0             # a title is read again after this long (renames show up within it)
MAX_CACHED = 4096        # titles kept (LRU); ~100 bytes each
MAX_TITLE_CHARS = 60     # longer titles are cut, with "…"


def shown_title(title: str) -> str:
    """The title as an item line quotes it: one line, no double quote, at most ``MAX_TITLE_CHARS``."""
    one = " ".join(title.split()).replace('"', "'")
    return one if len(one) <= MAX_TITLE_CHARS else one[: MAX_TITLE_CHARS - 1].rstrip() + "…"


class SessionTitles:
    """See the module docstring. ``clock`` is injectable for tests."""

    def __init__(self, store: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self._cache: OrderedDict[str, tuple[str, float]] = OrderedDict()   # id -> (title, read at)

    async def of(self, session_ids: Iterable[str]) -> dict[str, str]:
        """The titles of these sessions that have one the user gave them (the others are left out)."""
        now = self.clock()
        out: dict[str, str] = {}
        missing: list[str] = []
        for sid in dict.fromkeys(session_ids):
            hit = self._cache.get(sid)
            if hit is not None and now - hit[1] < TTL_S:
                self._cache.move_to_end(sid)
                if hit[0]:
                    out[sid] = hit[0]
            else:
                missing.append(sid)
        if missing:
            records = await asyncio.gather(*(self.store.get(sid) for sid in missing), return_exceptions=True)
            for sid, rec in zip(missing, records):
                if isinstance(rec, BaseException):
                    if not isinstance(rec, Exception):
                        raise rec                        # (cancellation and the like are not swallowed)
                    continue                             # named by its id this turn, read again next turn
                chosen = not (rec.deleted or rec.title_auto or rec.title == DEFAULT_TITLE)
                title = shown_title(rec.title or "") if chosen else ""
                self._cache[sid] = (title, now)
                self._cache.move_to_end(sid)
                if title:
                    out[sid] = title
            while len(self._cache) > MAX_CACHED:
                self._cache.popitem(last=False)
        return out

    def forget(self, session_id: str) -> None:
        """Drop a cached title (this node renamed or removed the session)."""
        self._cache.pop(session_id, None)
