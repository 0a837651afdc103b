"""MemoryManager: the memory layer's face to the server (context building, after-turn work, search).

``notify(kind, session_id, payload)`` (plain function or coroutine function) reports background
results to the server:

* ``"summary"``: a new summary was stored; payload ``{"summary": SummaryRecord.to_dict()}``
  (the server pushes a ``SESSION_EVENT`` of kind ``summary``).
* ``"warning"``: payload ``{"level": "warning", "code": "SUMMARY_FAILED", "message": ...}`` once
  the summarizer failed ``max_failures_before_fallback`` times in a row (a ``NOTICE`` for clients).

Indexes live in memory, one per user (LRU), filled from storage on first use and kept current
by ``after_turn``; summarization runs in background tasks, at most one per session
(``server.memory.summaries``). Each active
session has a ``SessionView`` (LRU of ``context.max_sessions_cached``): a turn reads only the
messages stored since the previous one, and expands and counts each message once.
"""
from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Any, Awaitable

from server.agent.base import BuiltContext
from storage.models import ChatMessage, SessionRecord, SummaryRecord
from storage import HistoryStore, NotFound
from storage.errors import StorageError

from server.memory.config import MemoryConfig
from server.memory.context import Excerpt, Parts, Turn, assemble, in_prompt, recent_turns
from server.memory.embeddings import Embedder
from server.memory.indexes import UserIndexes
from server.memory.recall import bounded_query, excerpt_and_tokens, parse_time, snippet
from server.memory.summaries import Notify, Summaries
from server.memory.titles import SessionTitles
from server.memory.tokens import TokenCounter, make_counter
from server.memory.user_memory import UserMemory
from server.memory.user_store import UserMemoryStore
from server.memory.view import SessionView, built_view

log = logging.getLogger("nplt.memory")
MIN_EXCERPT_TOKENS = 24          # an excerpt smaller than this is not worth adding
MIN_RELATIVE_SCORE = 0.3         # recalled turns score at least this share of the best one
RESET_INLINE_MAX = 200           # a view rebuilt from more messages than this is built in a worker thread
READ_INLINE_MAX = 32             # a loaded session's new messages read on the loop when at most this many
STABLE_MEMO_SIZE = 64            # token counts of system prompts / summaries kept across prompts
LEARN_WAIT_S = 5.0               # learn_now: how long a TURN_END waits for its facts to be stored
#: user messages of one session whose learning failed (a full disk) kept to be learned again with the
#: session's next learning (the newest; ``context.max_sessions_cached`` sessions)
MAX_FAILED_MESSAGES = 32


def not_stored_reason(exc: BaseException) -> str:
    """Why long-term memory could not store something, for the user: the class of failure, never a
    traceback ("the server's storage failed (No space left on device)")."""
    if isinstance(exc, OSError):
        return f"the server's storage failed ({exc.strerror or type(exc).__name__})"
    if isinstance(exc, StorageError):
        return f"the memory store is unavailable ({exc.message})"
    return "an internal error of the server"


class MemoryManager:
    """See the module docstring; ``system_prompt`` comes from the agent config."""

    def __init__(self, config: MemoryConfig | None, store: Any, agent: Any, notify: Notify | None = None,
                 system_prompt: str = "", token_counter: TokenCounter | None = None,
                 embedder: Embedder | None = None, user_store: UserMemoryStore | None = None) -> None:
        self.config = config or MemoryConfig()
        self.store = store
        self.agent = agent
        self.notify = notify
        self.system_prompt = system_prompt
        self.counter: TokenCounter = token_counter or make_counter(self.config.context.token_counter,
                                                                   self.config.context.token_encoding)
        emb = self.config.recall.embeddings
        self.embedder = embedder if embedder is not None else (Embedder(emb) if emb.enabled else None)
        self.indexes = UserIndexes(self.config.recall, store, self.embedder, self._spawn)
        sync = getattr(store, "sync", None)
        self._sync_store: HistoryStore | None = sync if isinstance(sync, HistoryStore) else None
        self._record_and_messages = getattr(store, "record_and_messages", None)   # PostgreSQL: one round trip
        self._views: OrderedDict[str, SessionView] = OrderedDict()
        self._stable_tokens: dict[tuple[str, str], int] = {}
        self._tasks: set[asyncio.Task] = set()
        self.summaries = Summaries(self.config, store, agent, self.counter, self.sync_view, self._spawn, notify)
        self._closed = False
        um = self.config.user_memory
        self.user_memory: UserMemory | None = None     # long-term user memory (needs a store and enabled)
        self.titles = SessionTitles(store)              # its items name their sessions by title
        if um.enabled and user_store is not None:
            self.user_memory = UserMemory(um, user_store, self.counter, agent, self.config.summarization.model)
        self._learned: OrderedDict[str, int] = OrderedDict()   # session -> last message id distilled
        self._learning: dict[str, asyncio.Task] = {}           # session -> its latest learning task
        self._marked: dict[str, int] = {}                      # session -> begin_forget calls not ended
        self._distilled: dict[str, int] = {}                   # session -> user message learn_now handled
        self._failed: OrderedDict[str, list[ChatMessage]] = OrderedDict()   # session -> messages not stored

    # -- context -------------------------------------------------------------------------------
    async def build_context(self, session_id: str, user_id: str, new_message: ChatMessage,
                            model: str, reserve_tokens: int = 0) -> BuiltContext:
        """System prompt + summary + recalled turns + recent turns + the new message, within budget.

        ``reserve_tokens``: what every model request of the turn carries besides the messages (the
        agent's tool schemas), taken off the budget first; the metadata's ``budget_tokens`` is what
        is left for the messages, ``tool_schema_tokens`` the reserve."""
        cfg = self.config
        record, view = await self.sync_view(session_id)
        got = view.window(cfg.context.recent_turns, new_message.id, self.counter) if view is not None else None
        if got is not None and view is not None:
            summary = record.summary if view.summary_applies else None
            window, older = got
        else:                                     # deleted session, or the cached tail is too short
            view = None
            summary, window, older = await self._read_window(record, new_message)
        excerpts: list[Excerpt] = []
        recall_cut: list[dict[str, Any]] = []
        # (with every turn of the session in the window and none summarized, recall has nothing to
        # find there: the index is not even brought up to date)
        if cfg.recall.enabled and cfg.recall.k and cfg.recall.token_budget and new_message.content.strip() \
                and (view is None or older > 0 or view.covers > 0):
            exclude = {i for t in window for i in t.ids} | {new_message.id}
            try:
                now = parse_time(new_message.timestamp) or datetime.now(timezone.utc)
                excerpts = await self._recall(record, user_id, new_message.content, exclude, view, now, recall_cut)
            except Exception:
                log.exception("recall failed for session %s (prompt built without it)", session_id)
        items: list[Excerpt] = []
        memory_cut: list[dict[str, Any]] = []
        if self.user_memory is not None and new_message.content.strip():
            try:
                items, memory_cut = await self.user_memory.choose(   # (a pasted log: its ends only, as recall)
                    user_id, session_id, bounded_query(new_message.content), self.titles.of)
            except Exception:
                log.exception("user memory failed for session %s (prompt built without it)", session_id)
        flags: dict[str, Any] = {"summary_fallback": self.summaries.fallback(session_id), "turns_older": older}
        if recall_cut:                            # left out by recall's own limits (ids; the pipeline's trace)
            flags["recall_cut"] = recall_cut
        if memory_cut:
            flags["memory_cut"] = memory_cut
        system = self.system_prompt if record.system_prompt is None else record.system_prompt
        parts = Parts(system, new_message.content, summary, excerpts, window, flags, items)
        if len(self._stable_tokens) > STABLE_MEMO_SIZE:
            self._stable_tokens.clear()
        return assemble(parts, self.counter, cfg.context.budget, self._stable_tokens, reserve_tokens)

    async def _read_window(self, record: SessionRecord, new_message: ChatMessage
                           ) -> tuple[SummaryRecord | None, list[Turn], int]:
        """The summary, recent window and older-turn count straight from storage (no view)."""
        summary = record.summary
        msgs = await self.store.messages(record.session_id, after_id=summary.covers_to_id if summary else 0)
        if summary is not None and record.message_count <= len(msgs):
            summary = None                       # it only covers cleared messages
        if new_message.id > 0:
            msgs = [m for m in msgs if m.id < new_message.id]
        window, older = recent_turns(msgs, self.config.context.recent_turns, self.counter)
        return summary, window, older

    def read_hint(self, session_id: str) -> int | None:
        """The ``after_id`` of the session's next read (``sync_view``), when the view is cached and
        valid, else None: a store that reads it in the same statement as the turn's user message
        (``PgHistoryStore.append(read_after=...)``) spares that read its round trip."""
        if self._sync_store is not None or self._record_and_messages is None:
            return None
        view = self._views.get(session_id)
        return view.read_from() if view is not None and view.valid and not view.lock.locked() else None

    async def sync_view(self, session_id: str) -> tuple[SessionRecord, SessionView | None]:
        """The session record and its ``SessionView``, brought up to date (None for a deleted session).

        One read: the view's cached tail again plus the messages stored since the last sync; the
        whole uncovered part is read again only when that does not add up (clear, restore) or the
        summary moved backwards. Used by every turn; public for diagnostics and tests.
        """
        view = self._views.get(session_id)
        if view is None:
            view = self._views[session_id] = SessionView(self.config.context.recent_turns + 2)
            while len(self._views) > self.config.context.max_sessions_cached:
                self._views.popitem(last=False)
        self._views.move_to_end(session_id)
        async with view.lock:                     # the view changes only between awaits: always consistent
            incremental = view.valid
            record, msgs = await self._read(session_id, view.read_from() if incremental else None, view.memo)
            covers = record.summary.covers_to_id if record.summary else 0
            if incremental and not record.deleted:
                # view.valid is False if forget_session() ran meanwhile: start over as well
                if view.valid and covers >= view.covers and view.merge(record, msgs, self.counter):
                    if covers > view.covers:
                        view.advance(covers)
                    return record, view
                record, msgs = await self._read(session_id, None, view.memo)   # cleared or restored: start over
                covers = record.summary.covers_to_id if record.summary else 0
            if record.deleted:
                view.valid = False
                if self._views.get(session_id) is view:
                    del self._views[session_id]
                return record, None
            if len(msgs) > RESET_INLINE_MAX:      # a long session: token counting off the loop
                view.adopt(await asyncio.get_running_loop().run_in_executor(
                    None, built_view, view.keep_turns, record, covers, msgs, self.counter))
            else:
                view.reset(record, covers, msgs, self.counter)
            return record, view

    async def _read(self, session_id: str, after_id: int | None, memo: dict | None = None
                    ) -> tuple[SessionRecord, list[ChatMessage]]:
        """The record and its visible messages with id > ``after_id`` (None: after the summary's
        ``covers_to_id``). When the store exposes its synchronous ``HistoryStore`` as ``.sync``
        (``AsyncHistoryStore`` does): read in place when the session is loaded, idle and has at
        most ``READ_INLINE_MAX`` such messages (a turn's usual case: no thread hop), else one
        worker-thread hop (in place, a message unchanged since the last read with the same ``memo``
        is the same object, not converted again: ``HistoryStore.read_loaded``); a store with ``record_and_messages`` (PostgreSQL): one call when ``after_id``
        is known; other stores: two awaited calls."""
        def after(record: SessionRecord) -> int:
            if after_id is not None:
                return after_id
            return record.summary.covers_to_id if record.summary else 0

        sync = self._sync_store
        if sync is None:
            both = self._record_and_messages
            if both is not None and after_id is not None:
                return await both(session_id, after_id, memo)
            record = await self.store.get(session_id)
            return record, await self.store.messages(session_id, after_id=after(record))
        got = sync.read_loaded(session_id, after_id, READ_INLINE_MAX, memo)
        if got is not None:
            return got

        def read() -> tuple[SessionRecord, list[ChatMessage]]:
            record = sync.get(session_id)
            return record, sync.messages(session_id, after_id=after(record))
        return await asyncio.get_running_loop().run_in_executor(None, read)

    async def _recall(self, record: SessionRecord, user_id: str, query: str, exclude: set[int],
                      view: SessionView | None, now: datetime | None = None,
                      cut: list[dict[str, Any]] | None = None) -> list[Excerpt]:
        """The recalled excerpts; what the recall limits left out is appended to ``cut``
        (``{"ids": [first message id of each turn], "why": ...}``; no ids for ``recall.k``)."""
        rc = self.config.recall
        cut = [] if cut is None else cut
        session_id = record.session_id
        uidx = self.indexes.user(user_id)
        async with uidx.lock:
            await self.indexes.sync(uidx, session_id, record, view)
        if not uidx.index.has_candidates(session_id, exclude):
            return []                             # every turn of the session is in the window
        vectors = await self.indexes.vector_ranking(uidx, query, session_id, exclude, rc.k)
        hits = uidx.index.search(query, rc.k, session_id=session_id, exclude=exclude, vector_ranking=vectors,
                                 now=now)
        if len(hits) >= rc.k:                     # lower-ranked turns were not looked at
            cut.append({"why": f"recall.k ({rc.k}) reached: lower-ranked turns were not considered"})
        if hits:                                  # weak matches only cost prompt tokens
            weak = [d for d, s in hits if s < MIN_RELATIVE_SCORE * hits[0][1]]
            if weak:
                cut.append({"ids": [d.ids[0] for d in weak],
                            "why": f"score under {MIN_RELATIVE_SCORE:.0%} of the best match"})
            hits = [(d, s) for d, s in hits if s >= MIN_RELATIVE_SCORE * hits[0][1]]
        out: list[Excerpt] = []
        remaining = rc.token_budget
        for i, (doc, _) in enumerate(hits):
            share = remaining // (len(hits) - i)
            if share < MIN_EXCERPT_TOKENS:
                cut.append({"ids": [d.ids[0] for d, _ in hits[i:]],
                            "why": f"over recall.token_budget ({rc.token_budget} tokens)"})
                break
            text, tokens = excerpt_and_tokens(doc, self.counter, share)
            remaining -= tokens
            out.append(Excerpt(list(doc.ids), text, tokens))
        return out

    async def begin_forget(self, session_id: str, user_id: str) -> None:
        """Before a clear, delete or purge of ``user_id``'s session changes its history: its long-term
        memory items leave the prompts at once, and the user's memory file notes durably that they
        are being forgotten, so a crash before ``forget_session(..., cleared=True)`` has removed them
        cannot bring them back (the next start drops them)."""
        if self.user_memory is None or self._closed:
            return
        await self.user_memory.mark_forgetting(user_id, session_id)
        self._marked[session_id] = self._marked.get(session_id, 0) + 1

    async def before_supersede(self, session_id: str, user_id: str, messages: list[ChatMessage]) -> None:
        """Before a regenerate or an edit supersedes ``messages`` of ``user_id``'s session, take back
        what was made from them: what long-term memory learned from the user messages (a learning of
        them still under way adds nothing), and a summary that covers any of them
        (``Summaries.take_back``)."""
        if self._closed or not messages:
            return
        users = [m.id for m in messages if m.role == "user"]
        failed = self._failed.get(session_id)
        if failed:                                    # (not learned again: superseded)
            self._failed[session_id] = [m for m in failed if m.id not in users]
        if self.user_memory is not None and users:
            await self.user_memory.forget_messages(user_id, session_id, users)
        await self.summaries.take_back(session_id, min(m.id for m in messages))

    def forget_session(self, session_id: str, user_id: str | None = None, *, cleared: bool = False) -> None:
        """Drop a session from every index and its cached view (call on delete, purge or clear; the
        next use rebuilds them). ``cleared`` (a clear or a purge of ``user_id``'s session): what the
        user's long-term memory learned from it is removed too, in the background."""
        self.indexes.forget_session(session_id)
        self.titles.forget(session_id)
        if cleared:                                         # a clear, delete or purge: its summary under way goes
            self.summaries.forget(session_id)
        self._learned.pop(session_id, None)
        self._distilled.pop(session_id, None)
        self._failed.pop(session_id, None)
        if cleared and user_id is not None and self.user_memory is not None and not self._closed:
            marked = self._marked.pop(session_id, 0)        # one begin_forget ends with each call
            if marked > 1:
                self._marked[session_id] = marked - 1
            if not marked:                                  # begin_forget did not hide it already
                self.user_memory.hide_session(session_id)  # left out of prompts from now on
            self._spawn(self._forget_learned(self.user_memory, user_id, session_id,
                                             self._learning.pop(session_id, None)))
        view = self._views.pop(session_id, None)
        if view is not None:
            view.valid = False

    def forget_remote(self, session_id: str) -> None:
        """Another node cleared, deleted or purged the session (its SESSION_EVENT, reported by
        ``server.cluster_relay``): what this node holds of it goes, as after a local one -- a summary
        being written for it here is cancelled with its model call (``Summaries.forget``), its recall
        index, title bookkeeping and cached view are dropped. What long-term memory learned from it
        is removed by the node that cleared it (durably: ``begin_forget``), not again here."""
        self.forget_session(session_id, cleared=True)     # (no user: no long-term memory to forget here)

    # -- after a turn ----------------------------------------------------------------------------
    async def after_turn(self, session_id: str, user_id: str, answer: ChatMessage | None = None) -> None:
        """Mark the session's recall index stale (it is brought up to date when a search needs it),
        distill long-term memory and schedule summarization, in the background (never waits for them).

        ``answer``: the message the turn just stored. When it is the next message of the session's
        cached view, the view takes it as it is (no read: ``SessionView.append_stored``); otherwise,
        or without it, the view is synced from storage. (A message stored meanwhile by someone
        else makes the next sync's check fail, and the view is rebuilt then.)
        A summary task is started only when a trigger fires on the cached view (or re-run when one
        is running), so a quiet turn costs no read and no task.
        """
        rc, sc = self.config.recall, self.config.summarization
        if self._closed:
            return
        if rc.enabled:                            # indexed when a search needs it
            self.indexes.mark_stale(user_id, session_id)
        if not (sc.enabled or self.user_memory is not None):
            return
        view = self._views.get(session_id)
        if answer is None or view is None or view.lock.locked() or not view.append_stored(answer, self.counter):
            try:
                _, view = await self.sync_view(session_id)
            except Exception:
                log.exception("reading session %s after the turn failed", session_id)
                return
        if self.user_memory is not None and view is not None:
            self._learn(session_id, user_id, view)
        if sc.enabled and view is not None and not self._closed:
            self.summaries.schedule(session_id, view)

    async def learn_now(self, session_id: str, user_id: str, message: ChatMessage) -> str | None:
        """Before the turn's TURN_END: what the rules distill from its user ``message`` is stored
        first, so a fact the assistant acknowledged ("Noted: ...") survives a crash right after
        (the user's next question may be in another session). Waits at most ``LEARN_WAIT_S``; a
        message that states nothing costs one inline distillation and no store access, and the
        background learning of ``after_turn`` skips it. With a summary model (or a text too long to
        distill inline) learning stays in the background.

        Returns why what the message states could not be stored (``not_stored_reason``: "the
        server's storage failed (File too large)"), None when it was stored, states nothing, is
        learned in the background or is still being stored after ``LEARN_WAIT_S``. A message that
        could not be stored is not marked distilled: the learning after this turn, and the next
        turns of the session, try it again (``_failed``)."""
        um = self.user_memory
        if um is None or self._closed or message.role != "user" or not in_prompt(message):
            return None
        try:
            states = um.states_something(message)
        except Exception:                             # (never in the way of TURN_END: learned later, as before)
            log.exception("distilling the user message of session %s failed", session_id)
            return None
        if states is None:
            return None
        self._distilled.pop(session_id, None)
        self._distilled[session_id] = message.id
        while len(self._distilled) > self.config.context.max_sessions_cached:
            self._distilled.pop(next(iter(self._distilled)))
        if not states:
            return None
        task = self._spawn(self._learn_task(um, user_id, session_id, self._with_failed(session_id, [message]),
                                            self._learning.get(session_id)))
        self._learning[session_id] = task
        done, _ = await asyncio.wait({task}, timeout=LEARN_WAIT_S)
        if not done or task.cancelled():
            return None
        return task.result()

    def _learn(self, session_id: str, user_id: str, view: SessionView) -> None:
        """Distill the user messages stored since the last call into long-term memory (background).
        ``_learned`` only saves work: ``UserMemory.learn`` skips what the user's file records as
        learned already, so a restart or an evicted entry never distills a message twice. Messages
        whose learning failed before (``_failed``) are learned again with them."""
        upto = self._learned.pop(session_id, 0)
        msgs = view.after(upto) if upto else [e.message for e in view.tail]
        self._learned[session_id] = view.last_id
        while len(self._learned) > self.config.context.max_sessions_cached:
            self._learned.popitem(last=False)
        if msgs is None:
            msgs = []                                 # older than the cached tail: not read again
        done = self._distilled.pop(session_id, 0)        # (learn_now distilled it already)
        news = [m for m in msgs if m.role == "user" and m.id > upto and m.id != done and in_prompt(m)]   # not superseded
        if session_id in self._failed:
            news = self._with_failed(session_id, news)
        if news and self.user_memory is not None and not self._closed:
            self._learning[session_id] = self._spawn(
                self._learn_task(self.user_memory, user_id, session_id, news, self._learning.get(session_id)))

    def _with_failed(self, session_id: str, messages: list[ChatMessage]) -> list[ChatMessage]:
        """``messages`` with the session's messages whose learning failed (taken: the learning that
        gets them owns them now), in message order, each once."""
        failed = self._failed.pop(session_id, [])
        if not failed:
            return messages
        return sorted({m.id: m for m in (*failed, *messages)}.values(), key=lambda m: m.id)

    async def _learn_task(self, um: UserMemory, user_id: str, session_id: str, messages: list,
                          before: asyncio.Task | None) -> str | None:
        """Learn ``messages`` after the session's previous learning; None when stored, else why not
        (``not_stored_reason``): the messages are kept in ``_failed`` and learned again with the
        session's next learning (the learning after the turn, or the next turn's)."""
        if before is not None:                        # one at a time per session, in order
            await asyncio.gather(before, return_exceptions=True)
        try:
            await um.learn(user_id, session_id, messages)
            return None
        except Exception as exc:
            reason = not_stored_reason(exc)
            if isinstance(exc, (OSError, StorageError)):
                log.error("learning long-term memory from session %s failed: %s (retried with the next "
                          "learning of the session)", session_id, exc)
            else:
                log.exception("learning long-term memory from session %s failed", session_id)
            if not self._closed:
                self._keep_failed(session_id, messages)
            return reason
        finally:
            if self._learning.get(session_id) is asyncio.current_task():
                del self._learning[session_id]

    def _keep_failed(self, session_id: str, messages: list[ChatMessage]) -> None:
        """Keep messages whose learning failed for the session's next learning (at most
        ``MAX_FAILED_MESSAGES`` per session, the newest; ``max_sessions_cached`` sessions)."""
        kept = self._with_failed(session_id, [m for m in messages if getattr(m, "role", None) == "user"])
        self._failed[session_id] = kept[-MAX_FAILED_MESSAGES:]
        while len(self._failed) > self.config.context.max_sessions_cached:
            self._failed.popitem(last=False)

    async def _forget_learned(self, um: UserMemory, user_id: str, session_id: str,
                              learning: asyncio.Task | None) -> None:
        """After any learning still running for the session (so nothing comes back), drop its items."""
        if learning is not None:
            await asyncio.gather(learning, return_exceptions=True)
        try:
            await um.forget_session(user_id, session_id)
        except Exception:
            log.exception("removing session %s from long-term memory failed", session_id)

    # -- search (history_search tool) -------------------------------------------------------------
    async def search(self, user_id: str, query: str, *, session_id: str | None = None,
                     k: int = 5) -> list[dict]:
        """Best ``k`` earlier turns of the user's sessions (or one session) for ``query``."""
        if k <= 0 or not query.strip():
            return []
        uidx = self.indexes.user(user_id)
        async with uidx.lock:
            if session_id is not None:
                record = await self.store.get(session_id)
                if record.user_id != user_id:
                    return []
                await self.indexes.sync(uidx, session_id, record)
            else:
                await self.indexes.sync_all(user_id, uidx)
            for _ in range(3):                    # re-check the sessions of the hits (clears, deletes)
                hits = uidx.index.search(query, k, session_id=session_id, now=datetime.now(timezone.utc),
                                         own_match=True)   # the tool lists turns that say the words themselves
                changed = False
                for sid in dict.fromkeys(doc.session_id for doc, _ in hits):
                    try:
                        changed |= await self.indexes.sync(uidx, sid)
                    except NotFound:              # purged since it was indexed (a storage failure raises)
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
        return self.summaries.state(session_id)

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
        self.summaries.closed = True
        self.indexes.closed = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.embedder is not None:
            await self.embedder.aclose()
        if self.user_memory is not None:
            await self.user_memory.close()
