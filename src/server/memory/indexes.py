"""Per-user recall indexes kept in step with storage (LRU of ``recall.max_users_cached`` users).

A session's finished turns are indexed incrementally and lazily, when a search needs them (a
prompt's recall in that session, or a search across the user's sessions, which first syncs the
sessions marked stale since): only the messages after the last one consumed are read (from the
session's ``SessionView`` when it holds them, else from storage). A session whose visible message
count no longer adds up (clear/restore), or whose new messages replace indexed turns (an edit or a
regenerate on another node), is re-indexed; deleted and purged sessions are dropped (at once for
searches; their postings in background slices, ``_drop``). Before a search
across sessions, the sessions whose ``updated_at`` moved since their last sync are synced too (what
other nodes changed). Optional embeddings are computed in the background.
"""
from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from storage.models import SessionRecord

from server.memory.bm25 import GroupDrop
from server.memory.config import RecallConfig
from server.memory.context import in_prompt
from server.memory.embeddings import Embedder, EmbeddingError
from server.memory.recall import RecallIndex, analyze_turns, rank_vectors, turn_docs
from server.memory.view import SessionView

log = logging.getLogger("nplt.memory")
INDEX_INLINE_CHARS = 8_000       # new turns' text analyzed on the event loop up to this size (~5 ms); more: in a thread
INDEX_SLICE_TERMS = 5_000        # terms posted to (or dropped from) the index between two yields to the event loop (~5-10 ms)


@dataclass
class UserIndex:
    index: RecallIndex = field(default_factory=RecallIndex)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    counts: dict[str, int] = field(default_factory=dict)      # visible messages consumed per session
    titles: dict[str, str] = field(default_factory=dict)
    complete: bool = False                                    # every session of the user synced once
    stale: set[str] = field(default_factory=set)              # sessions with turns finished since their last sync
    seen: dict[str, str] = field(default_factory=dict)        # each session's updated_at at its last sync
    embed_task: asyncio.Task | None = None


class UserIndexes:
    """The recall indexes of recently active users; ``spawn`` starts a background task."""

    def __init__(self, config: RecallConfig, store: Any, embedder: Embedder | None,
                 spawn: Callable[[Awaitable[Any]], asyncio.Task]) -> None:
        self.config = config
        self.store = store
        self.embedder = embedder
        self.spawn = spawn
        self.closed = False
        self._users: OrderedDict[str, UserIndex] = OrderedDict()

    def user(self, user_id: str) -> UserIndex:
        uidx = self._users.get(user_id)
        if uidx is None:
            uidx = self._users[user_id] = UserIndex()
            while len(self._users) > self.config.max_users_cached:
                self._users.popitem(last=False)
        self._users.move_to_end(user_id)
        return uidx

    def mark_stale(self, user_id: str, session_id: str) -> None:
        """A turn of the session finished: it is indexed when a search needs it (``sync``; a search
        across the user's sessions syncs every stale one first), not after every turn."""
        uidx = self._users.get(user_id)
        if uidx is not None:                      # (an index built later reads the session anyway)
            uidx.stale.add(session_id)

    async def sync(self, uidx: UserIndex, session_id: str, record: SessionRecord | None = None,
                   view: SessionView | None = None) -> bool:
        """Index the session's newly finished turns (rebuilding it after a clear/restore). Caller holds the lock.

        With a synced ``view`` holding every message after the last one consumed, nothing is read
        from storage. Returns True when the session's documents changed.

        The event loop is never held for long: the turns' text is analyzed in a worker thread when
        it is longer than ``INDEX_INLINE_CHARS``, and the documents are posted in slices of about
        ``INDEX_SLICE_TERMS`` terms with a yield to the loop in between. A session forgotten
        meanwhile (``forget_session``: a clear, an edit, a delete) is read again from storage.
        """
        restarted = False
        while True:
            changed = await self._sync(uidx, session_id, record, view)
            if changed is not None:
                return changed or restarted
            record, view, restarted = None, None, True

    async def _sync(self, uidx: UserIndex, session_id: str, record: SessionRecord | None,
                    view: SessionView | None) -> bool | None:
        """``sync`` once; None when the session was forgotten before it was done (nothing of this
        sync stays indexed then)."""
        index = uidx.index
        upto = index.indexed_upto.get(session_id, 0)
        new = view.after(upto) if view is not None and view.record is not None else None
        if new is not None:
            record = view.record                  # consistent with what the view holds
        elif record is None:
            record = await self.store.get(session_id)
        assert record is not None
        if record.deleted:
            had = session_id in index.indexed_upto
            self.forget_session(session_id)
            return had
        uidx.titles[session_id] = record.title
        uidx.seen[session_id] = record.updated_at
        if new is None:
            new = await self.store.messages(session_id, after_id=upto)
        rebuilt = record.message_count != uidx.counts.get(session_id, 0) + len(new) or _replaces(new, upto)
        if rebuilt:             # messages hidden, restored or superseded (on another node) since the last sync
            self._drop(index, session_id)
            uidx.counts[session_id] = 0
            new = await self.store.messages(session_id)
        docs, consumed = turn_docs(session_id, [m for m in new if in_prompt(m)], final=False)   # not superseded
        terms = None
        if sum(len(d.user_text) + len(d.answer_text) for d in docs) > INDEX_INLINE_CHARS:
            terms = await asyncio.to_thread(analyze_turns, docs)
        if docs and session_id in uidx.seen:      # (not forgotten during the analysis)
            await _post(index, session_id, docs, terms)
        if session_id not in uidx.seen:           # forgotten meanwhile: what was read may be stale
            self._drop(index, session_id)
            uidx.counts.pop(session_id, None)
            return None
        if consumed:
            index.add_turns(session_id, [], consumed)
            uidx.counts[session_id] = uidx.counts.get(session_id, 0) + sum(1 for m in new if m.id <= consumed)
        if docs and self.embedder is not None:
            self._schedule_embeddings(uidx)
        uidx.stale.discard(session_id)
        return rebuilt or bool(docs)

    async def sync_all(self, user_id: str, uidx: UserIndex) -> None:
        """Before a cross-session search: the first time, index every (recent) session of the user;
        afterwards, the sessions with turns finished since (``mark_stale``) and those whose
        ``updated_at`` moved since their last sync (changed by another node: new turns, an edit, a
        clear). Caller holds the lock."""
        records = await self._recent(user_id)
        if uidx.complete:
            uidx.stale.update(r.session_id for r in records if uidx.seen.get(r.session_id) != r.updated_at)
            for sid in list(uidx.stale):
                try:
                    await self.sync(uidx, sid)
                except Exception:                 # one unreadable session must not hide the others
                    uidx.stale.discard(sid)
                    log.exception("cannot index session %s", sid)
            return
        for rec in records:
            try:
                await self.sync(uidx, rec.session_id)
            except Exception:                     # one unreadable session must not hide the others
                log.exception("cannot index session %s", rec.session_id)
        uidx.complete = True

    async def _recent(self, user_id: str) -> list[SessionRecord]:
        """The user's ``max_sessions_indexed`` most recently updated sessions."""
        limit = self.config.max_sessions_indexed
        cursor: str | None = None
        records: list[SessionRecord] = []
        while len(records) < limit:
            page, cursor = await self.store.list(user_id, before=cursor, limit=min(100, limit - len(records)))
            records.extend(page)
            if cursor is None or not page:
                break
        return records

    def forget_session(self, session_id: str) -> None:
        """Drop a session from every index (the next use rebuilds it)."""
        for uidx in self._users.values():
            self._drop(uidx.index, session_id)
            uidx.counts.pop(session_id, None)
            uidx.titles.pop(session_id, None)
            uidx.seen.pop(session_id, None)
            uidx.stale.discard(session_id)

    def _drop(self, index: RecallIndex, session_id: str) -> None:
        """Forget the session in ``index``: at once for searches (O(its documents)); its postings
        (one entry per distinct term: ~180,000 for 100 turns of 32,000-character pastes) are dropped
        by a background task, about ``INDEX_SLICE_TERMS`` terms between two yields to the loop (at
        once without a running loop, or once closed). Re-indexing the session waits for it (``_post``)."""
        drop = index.drop_session(session_id)
        if drop.done:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            drop.finish()
            return
        if self.closed:
            drop.finish()
        else:
            self.spawn(_drain(drop))

    # -- embeddings (optional) -----------------------------------------------------------------
    def _schedule_embeddings(self, uidx: UserIndex) -> None:
        if self.closed or (uidx.embed_task is not None and not uidx.embed_task.done()):
            return
        uidx.embed_task = self.spawn(self._embed_pending(uidx))

    async def _embed_pending(self, uidx: UserIndex) -> None:
        assert self.embedder is not None
        size = self.config.embeddings.batch_size
        while True:
            todo = [k for k in uidx.index.docs if k not in uidx.index.vectors][:size]
            if not todo:
                return
            try:
                vecs = await self.embedder.embed([uidx.index.docs[k].text() for k in todo])
            except EmbeddingError as exc:
                log.warning("turn embeddings unavailable: %s", exc)
                return
            for key, vec in zip(todo, vecs):
                if key in uidx.index.docs:
                    uidx.index.vectors[key] = vec

    async def vector_ranking(self, uidx: UserIndex, query: str, session_id: str | None,
                             exclude: set[int], k: int) -> list | None:
        """Document keys by embedding similarity to ``query`` (None without embeddings or on failure)."""
        if self.embedder is None or not uidx.index.vectors:
            return None
        try:
            [qv] = await self.embedder.embed([query])
        except EmbeddingError as exc:
            log.warning("query embedding unavailable: %s", exc)
            return None
        accept = uidx.index.acceptor(session_id, exclude)
        items = [(key, vec) for key, vec in uidx.index.vectors.items() if accept(key)]
        return await asyncio.to_thread(rank_vectors, qv, items, max(4 * k, 20))


async def _drain(drop: GroupDrop) -> None:
    """``drop``'s steps of about ``INDEX_SLICE_TERMS`` terms, with a yield to the event loop in between."""
    while not drop.done:
        drop.step(INDEX_SLICE_TERMS)
        if not drop.done:
            await asyncio.sleep(0)


async def _post(index: RecallIndex, session_id: str, docs: list, terms: list[list[str]] | None) -> None:
    """``index.add_steps`` with a yield to the event loop after every ``INDEX_SLICE_TERMS`` terms
    posted (a big session must not stall the loop), once the session's earlier postings are gone
    (a drop still under way is helped along, in slices too). Cancelled meanwhile, the documents not
    posted yet are dropped (``add_steps`` closed): the next sync reads them again."""
    drop = index.bm25.dropping(session_id)
    if drop is not None:
        await _drain(drop)
    steps = index.add_steps(session_id, docs, 0, terms)
    try:
        posted = 0
        for n in steps:
            posted += n
            if posted >= INDEX_SLICE_TERMS:
                posted = 0
                await asyncio.sleep(0)
    finally:
        steps.close()


def _replaces(new: list[Any], upto: int) -> bool:
    """Whether messages stored since the last sync replace turns already indexed (superseded in
    place, which leaves the message count as it was; this node re-indexes at once, another node
    learns it here): an edit's message (``edited_from`` an indexed message), or an answer right
    after an indexed turn (a regenerate's; or more of a turn indexed too early: re-read as well)."""
    if not upto or not new:
        return False
    if new[0].role != "user":
        return True
    return any(isinstance(m.metadata.get("edited_from"), int) and m.metadata["edited_from"] <= upto for m in new)
