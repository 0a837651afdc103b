"""Background rolling summaries of sessions (``MemoryManager`` owns one ``Summaries``).

At most one task per session: a turn whose view fires a trigger starts one (``schedule``), a turn
arriving while it runs makes it run once more. A task reads the uncovered messages, summarizes
(``summarizer``), and stores the summary only if what it covers is unchanged meanwhile (no other
summary, no message cleared or superseded, on this node or another). Failures in a row are counted;
after ``max_failures_before_fallback`` the server is notified once and the context metadata says
``summary_fallback``. ``take_back`` undoes what a summary made of messages a regenerate or an edit
supersedes (docs/memory.md, "Rolling summaries"); ``forget`` cancels the summary of a session
that was cleared, deleted or purged, and a session purged while its summary is written (storage's
``NotFound``) drops the summary quietly (logged at INFO).
"""
from __future__ import annotations

import asyncio
import inspect
import logging
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable

from storage import NotFound
from storage.models import ChatMessage, SessionRecord, SummaryRecord, now_iso

from server.memory.config import MemoryConfig
from server.memory.context import in_prompt
from server.memory.summarizer import NothingToSummarize, SummaryFailed, plan, plan_cut, summarize
from server.memory.tokens import TokenCounter
from server.memory.view import SessionView

log = logging.getLogger("nplt.memory")

Notify = Callable[[str, str, dict], Any]
SyncView = Callable[[str], Awaitable[tuple[SessionRecord, SessionView | None]]]


@dataclass
class SummaryState:
    """Summarizer bookkeeping for one session."""
    failures: int = 0
    fallback: bool = False
    task: asyncio.Task | None = None
    rerun: bool = False


class Summaries:
    """See the module docstring. ``sync_view``: the manager's up-to-date view of a session;
    ``spawn``: starts a background task the manager tracks (and cancels on close)."""

    def __init__(self, config: MemoryConfig, store: Any, agent: Any, counter: TokenCounter,
                 sync_view: SyncView, spawn: Callable[[Awaitable[Any]], asyncio.Task],
                 notify: Notify | None = None) -> None:
        self.config = config
        self.store = store
        self.agent = agent
        self.counter = counter
        self.notify = notify
        self._sync_view = sync_view
        self._spawn = spawn
        self._states: dict[str, SummaryState] = {}
        self.closed = False

    def fallback(self, session_id: str) -> bool:
        """True while the session's summaries keep failing (older turns are dropped instead)."""
        state = self._states.get(session_id)
        return bool(state and state.fallback)

    def state(self, session_id: str) -> dict[str, Any]:
        """Summarizer state of a session (failures in a row, fallback, running)."""
        st = self._states.get(session_id) or SummaryState()
        return {"failures": st.failures, "fallback": st.fallback,
                "running": st.task is not None and not st.task.done()}

    def schedule(self, session_id: str, view: SessionView) -> None:
        """After a turn: start a summary when a trigger fires on ``view`` (or run the running one
        again when it ends)."""
        state = self._states.get(session_id)
        if state is not None and state.task is not None and not state.task.done():
            state.rerun = True                    # re-evaluated when the running one ends
        elif plan_cut(self.config.summarization, self.config.context, view.roles, view.costs) > 0 \
                and not self.closed:
            state = self._states.setdefault(session_id, SummaryState())
            state.task = self._spawn(self._loop(session_id, state))

    def forget(self, session_id: str) -> None:
        """The session was cleared, deleted or purged: a summary being written for it is cancelled
        (its model call with it: nothing it would store applies any more) and its bookkeeping
        (failures in a row, fallback) dropped."""
        state = self._states.pop(session_id, None)
        if state is not None and state.task is not None and not state.task.done():
            state.task.cancel()

    async def take_back(self, session_id: str, first_id: int) -> None:
        """Before messages from ``first_id`` on are superseded: a summary being written is
        cancelled; when the current summary covers ``first_id``, the newest earlier summary that
        does not becomes the current one again, or, without one, the summaries are withdrawn
        (``SummaryRecord.withdrawal``) and the next trigger summarizes the live messages afresh."""
        state = self._states.get(session_id)
        if state is not None and state.task is not None and not state.task.done():
            state.task.cancel()
            await asyncio.gather(state.task, return_exceptions=True)
        record = await self.store.get(session_id)
        if record.summary is None or record.summary.covers_to_id < first_id:
            return
        earlier = next((s for s in reversed(record.summaries) if s.covers_to_id < first_id), None)
        restored = SummaryRecord.withdrawal() if earlier is None or earlier.covers_to_id == 0 else \
            replace(earlier, created_at=now_iso())
        await self.store.add_summary(session_id, restored)

    async def _loop(self, session_id: str, state: SummaryState) -> None:
        while True:
            state.rerun = False
            try:
                await self._once(session_id, state)
            except asyncio.CancelledError:
                raise
            except NotFound:                      # purged meanwhile (on this node or another): nothing to do
                log.info("summary of session %s dropped: the session was purged while it was written", session_id)
                if self._states.get(session_id) is state:
                    del self._states[session_id]
                return
            except Exception:
                log.exception("summarization of session %s failed", session_id)
            if not state.rerun or self.closed:
                break
        if state.failures == 0 and not state.rerun and self._states.get(session_id) is state:
            del self._states[session_id]          # nothing to remember: keep the table small

    async def _once(self, session_id: str, state: SummaryState) -> None:
        cfg = self.config.summarization
        record, view = await self._sync_view(session_id)
        if view is None or plan_cut(cfg, self.config.context, view.roles, view.costs) <= 0:
            return                                # deleted, or nothing to do (cheap check on the view)
        stored, covers = record.summary, view.covers
        previous = stored if view.summary_applies else None
        ids, costs = list(view.ids), list(view.costs)
        uncovered = await self.store.messages(session_id, after_id=covers)
        same = [m.id for m in uncovered] == ids   # else it changed meanwhile: count again
        p = plan(cfg, self.config.context, previous, uncovered, self.counter, costs if same else None)
        if p is None:
            return
        try:
            summary = await summarize(p, cfg, self.counter, self.agent, cfg.model or record.model)
        except NothingToSummarize as exc:
            log.debug("summary of session %s skipped: %s", session_id, exc)
            return
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
        if not await self._still_applies(session_id, stored, covers, p.covered):
            log.info("summary of session %s dropped: what it covers changed while it was written "
                     "(a regenerate, an edit or a clear)", session_id)
            return
        await self.store.add_summary(session_id, summary)
        state.failures = 0
        state.fallback = False
        await self._notify("summary", session_id, {"summary": summary.to_dict()})

    async def _still_applies(self, session_id: str, stored: SummaryRecord | None, covers: int,
                             covered: list[ChatMessage]) -> bool:
        """Whether a summary of ``covered`` still fits the stored session (changed meanwhile by this
        node or another): the same current summary, and the messages it covers neither cleared nor
        superseded since."""
        record = await self.store.get(session_id)
        if record.summary != stored or record.deleted:
            return False
        last = covered[-1].id
        now = [m for m in await self.store.messages(session_id, after_id=covers) if m.id <= last]
        return [(m.id, in_prompt(m)) for m in now] == [(m.id, in_prompt(m)) for m in covered]

    async def _notify(self, kind: str, session_id: str, payload: dict) -> None:
        if self.notify is None:
            return
        try:
            res = self.notify(kind, session_id, payload)
            if inspect.isawaitable(res):
                await res
        except Exception:
            log.exception("memory notify(%s) failed", kind)
