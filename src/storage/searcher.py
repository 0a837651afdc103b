"""Search over a user's sessions: each loaded session is scanned in place, the others are loaded
transiently (never entering the LRU), and only the best ``limit`` hits are kept (a heap).

A session that cannot be read right now (``StorageIOError``) is skipped with a WARNING when all the
user's sessions are searched: the others are still searched (a search of that one session alone
raises it)."""
from __future__ import annotations

import heapq
import logging

from .cache import SessionCache
from .errors import InvalidArgument, NotFound, StorageIOError
from .ids import validate_session_id
from .index import SessionIndex
from .models import SearchHit
from .search import compile_query, searchable, snippet
from .textscan import SEP, session_text

log = logging.getLogger("storage")


class Searcher:
    """Search over the user's sessions: loaded ones in place, others loaded transiently."""

    def __init__(self, index: SessionIndex, cache: SessionCache) -> None:
        self.index = index
        self.cache = cache

    def search(self, user_id: str, query: str, *, session_id: str | None = None, limit: int = 20) -> list[SearchHit]:
        q = compile_query(query)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidArgument(f"limit: expected a positive integer, got {limit!r}")
        if session_id is not None:
            entry = self.index.get(validate_session_id(session_id))
            if entry is None or entry["user_id"] != user_id or entry["deleted"]:
                raise NotFound(f"session {session_id} not found")
            targets = [entry]
        else:
            targets = self.index.user_entries(user_id)
        heap: list[tuple] = []
        n = 0
        for entry in targets:
            if not entry["message_count"]:
                continue
            sid = entry["session_id"]
            try:
                with self.cache.locked(sid, transient=True) as s:
                    title, st = s.state.record.title, s.state
                    if SEP in q.text:             # (a NUL in the query: message by message)
                        found = [(i, *hit) for i, d in enumerate(st.msgs[st.vis_start():], st.vis_start())
                                 if searchable(d) and (hit := q.match(d.get("content"))) is not None]
                    else:
                        st.text = session_text(st.text, st.last_seq, st.vis_start(), st.msgs)
                        found = st.text.scan(q)
                    for i, score, pos in found:
                        d = st.msgs[i]
                        n += 1
                        item = ((score, str(d.get("timestamp", "")), d["id"]), n, sid, title, d, pos)
                        if len(heap) < limit:
                            heapq.heappush(heap, item)
                        elif item[0] > heap[0][0]:
                            heapq.heapreplace(heap, item)
            except NotFound:
                continue
            except StorageIOError as exc:
                if session_id is not None:
                    raise
                log.warning("storage: search of %s's sessions skipped session %s: %s", user_id, sid, exc)
        heap.sort(reverse=True)
        return [SearchHit(sid, title, d["id"], str(d.get("role", "")), snippet(d.get("content", ""), pos),
                          str(d.get("timestamp", "")), key[0]) for key, _, sid, title, d, pos in heap]
