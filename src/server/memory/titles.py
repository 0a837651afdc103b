"""Session titles for the memory block: an item names the session it came from by the title the
user gave it (``SESSION_RENAME``). An automatic title (``title_auto``: the first message's text) or
the default one is not used: the first would quote the user's words again, beside the item and after
an item was forgotten or its message edited; the item's session is then named by its id.

``SessionTitles.of(ids)`` reads the records of the sessions it has not seen lately in one go
(``store.records``: the JSON store's in-memory index, or one PostgreSQL statement) and keeps each
title for ``TTL_S`` seconds, so a user who keeps asking costs no read a turn; a rename made on
another node shows up within that time (this node's own renames, clears and deletes drop the cached
title at once). A session that is gone, deleted or unreadable (storage down) is named by its id too.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any, Callable, Iterable

from storage.models import DEFAULT_TITLE

log = logging.getLogger("nplt.memory")
TTL_S = 60.0             # a title is read again after this long (renames on other nodes show up within it)
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
        if not missing:
            return out
        try:
            records = await self.store.records(missing)
        except Exception:
            log.warning("session titles unreadable (memory items named by session id this turn)", exc_info=True)
            return out                                   # nothing cached: read again next turn
        for sid in missing:
            rec = records.get(sid)
            given = rec is not None and not (rec.deleted or rec.title_auto or rec.title == DEFAULT_TITLE)
            title = shown_title(rec.title) if given and rec is not None else ""
            self._cache[sid] = (title, now)
            self._cache.move_to_end(sid)
            if title:
                out[sid] = title
        while len(self._cache) > MAX_CACHED:
            self._cache.popitem(last=False)
        return out

    def forget(self, session_id: str) -> None:
        """Drop a cached title (this node renamed, cleared or removed the session)."""
        self._cache.pop(session_id, None)
