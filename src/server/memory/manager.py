"""MemoryManager: the memory layer's face to the server (context building, after-turn work, search).

``notify(kind, session_id, payload)`` (plain function or coroutine function) reports background
results to the server:

* ``"summary"``: a new summary was stored; payload ``{"summary": SummaryRecord.to_dict()}``
  (the server pushes a ``SESSION_EVENT`` of kind ``summary``).
* ``"warning"``: payload ``{"level": "warning", "code": "SUMMARY_FAILED", "message": ...}`` once
  the summarizer failed ``max_failures_before_fallback`` times in a row (a ``NOTICE`` for clients).

Indexes live in memory, one per user (LRU), filled from storage on first use and kept current
by ``after_turn``; summarization runs in background tasks, at most one per session.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from server.agent.base import BuiltContext
from storage.models import ChatMessage, SessionRecord

from .config import MemoryConfig
from .context import Excerpt, Parts, assemble, recent_turns
from .embeddings import Embedder, EmbeddingError
from .recall import RecallIndex, format_excerpt, rank_vectors, snippet, turn_docs
from .summarizer import SummaryFailed, plan, summarize
from .tokens import ApproxTokenCounter, TokenCounter

log = logging.getLogger("nplt.memory")
Notify = Callable[[str, str, dict], Any]
MIN_EXCERPT_TOKENS = 24          # an excerpt smaller than this is not worth adding
MIN_RELATIVE_SCORE = 0.3         # recalled turns score at least this share of the best one
INDEX_CHUNK = 200                # turns indexed between two yields to the event loop


@dataclass
class _SessionState:
    """Summarizer bookkeeping for one session."""
    failures: int = 0
    fallback: bool = False
    task: asyncio.Task | None = None
    rerun: bool = False


@dataclass
class _UserIndex:
    index: RecallIndex = field(default_factory=RecallIndex)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    counts: dict[str, int] = field(default_factory=dict)      # visible messages consumed per session
    titles: dict[str, str] = field(default_factory=dict)
    complete: bool = False                                    # every session of the user synced once
    embed_task: asyncio.Task | None = None


class MemoryManager:
    """See the module docstring; ``system_prompt`` comes from the agent config."""

    def __init__(self, config: MemoryConfig | None, store: Any, agent: Any, notify: Notify | None = None,
                 system_prompt: str = "", token_counter: TokenCounter | None = None,
                 embedder: Embedder | None = None) -> None:
        self.config = config or MemoryConfig()
        self.store = store
        self.agent = agent
        self.notify = notify
        self.system_prompt = system_prompt
        self.counter: TokenCounter = token_counter or ApproxTokenCounter()
        emb = self.config.recall.embeddings
        self.embedder = embedder if embedder is not None else (Embedder(emb) if emb.enabled else None)
        self._users: OrderedDict[str, _UserIndex] = OrderedDict()
        self._sessions: dict[str, _SessionState] = {}
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    # -- context -------------------------------------------------------------------------------
    async def build_context(self, session_id: str, user_id: str, new_message: ChatMessage,
                            model: str) -> BuiltContext:
        """System prompt + summary + recalled turns + recent turns + the new message, within budget."""
        cfg = self.config
        record = await self.store.get(session_id)
        summary = record.summary
        msgs = await self.store.messages(session_id, after_id=summary.covers_to_id if summary else 0)
        if summary is not None and record.message_count <= len(msgs):
            summary = None                       # it only covers cleared messages
        if new_message.id > 0:
            msgs = [m for m in msgs if m.id < new_message.id]
        window, older = recent_turns(msgs, cfg.context.recent_turns, self.counter)
        excerpts: list[Excerpt] = []
        if cfg.recall.enabled and cfg.recall.k and cfg.recall.token_budget and new_message.content.strip():
            exclude = {i for t in window for i in t.ids} | {new_message.id}
            try:
                excerpts = await self._recall(record, user_id, new_message.content, exclude)
            except Exception:
                log.exception("recall failed for session %s (prompt built without it)", session_id)
        state = self._sessions.get(session_id)
        flags = {"summary_fallback": bool(state and state.fallback), "turns_older": older}
        parts = Parts(self.system_prompt, new_message.content, summary, excerpts, window, flags)
        return assemble(parts, self.counter, cfg.context.budget)

    async def _recall(self, record: SessionRecord, user_id: str, query: str, exclude: set[int]) -> list[Excerpt]:
        rc = self.config.recall
        session_id = record.session_id
        uidx = self._user(user_id)
        async with uidx.lock:
            await self._sync(uidx, session_id, record)
        vectors = await self._vector_ranking(uidx, query, session_id, exclude, rc.k)
        hits = uidx.index.search(query, rc.k, session_id=session_id, exclude=exclude, vector_ranking=vectors)
        if hits:                                  # weak matches only cost prompt tokens
            hits = [(d, s) for d, s in hits if s >= MIN_RELATIVE_SCORE * hits[0][1]]
        out: list[Excerpt] = []
        remaining = rc.token_budget
        for i, (doc, _) in enumerate(hits):
            share = remaining // (len(hits) - i)
            if share < MIN_EXCERPT_TOKENS:
                break
            text = format_excerpt(doc, self.counter, share)
            remaining -= self.counter.count(text)
            out.append(Excerpt(list(doc.ids), text))
        return out

    # -- indexing ------------------------------------------------------------------------------
    def _user(self, user_id: str) -> _UserIndex:
        uidx = self._users.get(user_id)
        if uidx is None:
            uidx = self._users[user_id] = _UserIndex()
            while len(self._users) > self.config.recall.max_users_cached:
                self._users.popitem(last=False)
        self._users.move_to_end(user_id)
        return uidx

    async def _sync(self, uidx: _UserIndex, session_id: str, record: SessionRecord | None = None) -> bool:
        """Index the session's newly finished turns (rebuilding it after a clear/restore). Caller holds the lock.

        Returns True when the session's documents changed.
        """
        index = uidx.index
        if record is None:
            record = await self.store.get(session_id)
        if record.deleted:
            had = session_id in index.indexed_upto
            self.forget_session(session_id)
            return had
        uidx.titles[session_id] = record.title
        upto = index.indexed_upto.get(session_id, 0)
        new = await self.store.messages(session_id, after_id=upto)
        rebuilt = record.message_count != uidx.counts.get(session_id, 0) + len(new)
        if rebuilt:                               # messages hidden or restored since the last sync
            index.remove_session(session_id)
            uidx.counts[session_id] = 0
            new = await self.store.messages(session_id)
        docs, consumed = turn_docs(session_id, new, final=False)
        for start in range(0, len(docs), INDEX_CHUNK):          # a big session must not stall the loop
            if start:
                await asyncio.sleep(0)
            index.add_turns(session_id, docs[start:start + INDEX_CHUNK], 0)
        if consumed:
            index.add_turns(session_id, [], consumed)
            uidx.counts[session_id] = uidx.counts.get(session_id, 0) + sum(1 for m in new if m.id <= consumed)
        if docs and self.embedder is not None:
            self._schedule_embeddings(uidx)
        return rebuilt or bool(docs)

    async def _sync_all(self, user_id: str, uidx: _UserIndex) -> None:
        """First cross-session search: index every (recent) session of the user. Caller holds the lock."""
        if uidx.complete:
            return
        limit = self.config.recall.max_sessions_indexed
        cursor: str | None = None
        records: list[SessionRecord] = []
        while len(records) < limit:
            page, cursor = await self.store.list(user_id, before=cursor, limit=min(100, limit - len(records)))
            records.extend(page)
            if cursor is None or not page:
                break
        for rec in records:
            try:
                await self._sync(uidx, rec.session_id)
            except Exception:                     # one unreadable session must not hide the others
                log.exception("cannot index session %s", rec.session_id)
        uidx.complete = True

    def forget_session(self, session_id: str) -> None:
        """Drop a session from every index (call on delete, purge or clear; the next use rebuilds)."""
        for uidx in self._users.values():
            uidx.index.remove_session(session_id)
            uidx.counts.pop(session_id, None)
            uidx.titles.pop(session_id, None)

    # -- embeddings (optional) -----------------------------------------------------------------
    def _schedule_embeddings(self, uidx: _UserIndex) -> None:
        if self._closed or (uidx.embed_task is not None and not uidx.embed_task.done()):
            return
        uidx.embed_task = self._spawn(self._embed_pending(uidx))

    async def _embed_pending(self, uidx: _UserIndex) -> None:
        assert self.embedder is not None
        size = self.config.recall.embeddings.batch_size
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

    async def _vector_ranking(self, uidx: _UserIndex, query: str, session_id: str | None,
                              exclude: set[int], k: int) -> list | None:
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

    # -- after a turn ----------------------------------------------------------------------------
    async def after_turn(self, session_id: str, user_id: str) -> None:
        """Index the finished turn, then schedule summarization in the background (never waits for it)."""
        if self._closed:
            return
        if self.config.recall.enabled:
            uidx = self._user(user_id)
            try:
                async with uidx.lock:
                    await self._sync(uidx, session_id)
            except Exception:
                log.exception("indexing session %s failed", session_id)
        if self.config.summarization.enabled:
            state = self._sessions.setdefault(session_id, _SessionState())
            if state.task is not None and not state.task.done():
                state.rerun = True                # re-evaluated when the running one ends
            else:
                state.task = self._spawn(self._summary_loop(session_id, state))

    async def _summary_loop(self, session_id: str, state: _SessionState) -> None:
        while True:
            state.rerun = False
            try:
                await self._summarize_once(session_id, state)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("summarization of session %s failed", session_id)
            if not state.rerun or self._closed:
                break
        if state.failures == 0 and not state.rerun and self._sessions.get(session_id) is state:
            del self._sessions[session_id]        # nothing to remember: keep the table small

    async def _summarize_once(self, session_id: str, state: _SessionState) -> None:
        cfg = self.config.summarization
        record = await self.store.get(session_id)
        if record.deleted:
            return
        previous = record.summary
        uncovered = await self.store.messages(session_id, after_id=previous.covers_to_id if previous else 0)
        if previous is not None and record.message_count <= len(uncovered):
            previous = None                       # it only covers cleared messages
        p = plan(cfg, self.config.context, previous, uncovered, self.counter)
        if p is None:
            return
        try:
            summary = await summarize(p, cfg, self.counter, self.agent, cfg.model or record.model)
        except SummaryFailed as exc:
            state.failures += 1
            log.warning("summary of session %s failed (%d in a row): %s", session_id, state.failures, exc)
            if state.failures >= cfg.max_failures_before_fallback and not state.fallback:
                state.fallback = True
                await self._notify("warning", session_id, {
                    "level": "warning", "code": "SUMMARY_FAILED",
                    "message": f"summarizing this conversation failed {state.failures} times in a row; "
                               "older turns are dropped from the model's context until it succeeds"})
            return
        await self.store.add_summary(session_id, summary)
        state.failures = 0
        state.fallback = False
        await self._notify("summary", session_id, {"summary": summary.to_dict()})

    async def _notify(self, kind: str, session_id: str, payload: dict) -> None:
        if self.notify is None:
            return
        try:
            res = self.notify(kind, session_id, payload)
            if inspect.isawaitable(res):
                await res
        except Exception:
            log.exception("memory notify(%s) failed", kind)

    # -- search (history_search tool) -------------------------------------------------------------
    async def search(self, user_id: str, query: str, *, session_id: str | None = None,
                     k: int = 5) -> list[dict]:
        """Best ``k`` earlier turns of the user's sessions (or one session) for ``query``."""
        if k <= 0 or not query.strip():
            return []
        uidx = self._user(user_id)
        async with uidx.lock:
            if session_id is not None:
                record = await self.store.get(session_id)
                if record.user_id != user_id:
                    return []
                await self._sync(uidx, session_id, record)
            else:
                await self._sync_all(user_id, uidx)
            for _ in range(3):                    # re-check the sessions of the hits (clears, deletes)
                hits = uidx.index.search(query, k, session_id=session_id)
                changed = False
                for sid in dict.fromkeys(doc.session_id for doc, _ in hits):
                    try:
                        changed |= await self._sync(uidx, sid)
                    except Exception:             # gone: NotFound after a purge
                        self.forget_session(sid)
                        changed = True
                if not changed:
                    break
        return [{"session_id": doc.session_id, "title": uidx.titles.get(doc.session_id, ""),
                 "message_id": doc.message_id, "role": "user", "time": doc.time,
                 "snippet": snippet(doc), "score": round(score, 4)} for doc, score in hits]

    # -- lifecycle -------------------------------------------------------------------------------
    def session_state(self, session_id: str) -> dict[str, Any]:
        """Summarizer state of a session (failures in a row, fallback, running)."""
        st = self._sessions.get(session_id) or _SessionState()
        return {"failures": st.failures, "fallback": st.fallback,
                "running": st.task is not None and not st.task.done()}

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)     # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def wait_idle(self) -> None:
        """Wait until no background work (summaries, embeddings) is pending -- for tests and shutdown."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def summary_tasks_idle(self) -> bool:
        """True when no background task is running."""
        return not self._tasks

    async def aclose(self) -> None:
        """Cancel and await background tasks, close the embeddings client."""
        self._closed = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.embedder is not None:
            await self.embedder.aclose()
