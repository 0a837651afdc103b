"""The turn pipeline: one queue per session (turns serialized), sessions concurrent.

A chat send enqueues a Turn; the session's worker runs it: TURN_START, then whatever the agent
reports through the TurnSink (status, tool calls, deltas), then the assistant message is stored and
TURN_END sent. The user message is stored durably before the chat reply when the session is idle; a
turn queued behind another stores it when it starts, so history always reads question, answer,
question, answer (and each turn's context holds the answers before it). A turn's model, like its
system prompt, is the session's when it starts: a MODEL_SWITCH while it waits in the queue applies
to it. A queued turn that is cancelled is withdrawn: nothing is stored and it ends with TURN_END
``message: null``.
AgentError -> TURN_ERROR (what was streamed is saved with ``partial: true``); cancel of the running
turn -> partial saved, TURN_END ``finish_reason: "cancelled"``. A turn does not belong to a connection: a client that goes away does not stop it, and a client that comes back can
reattach (``Turn.state()`` is the TurnState of docs/protocol.md).
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Protocol

from protocol import ErrorCode
from protocol.objects import QueuedTurn, TurnState
from protocol.server_events import TurnEnd, TurnError, TurnStart
from server.agent.answers import NOTED_HEADS
from server.agent.base import AgentError, BuiltContext, TurnResult, tool_schema_tokens
from server.config import LimitsConfig
from server.errors import HandlerError, failure_of, not_found
from server.hub import Hub, Subscriber
from server.inflight import NoMarker
from server.metrics import Metrics
from server.pipeline import Answer, TurnPipeline, TurnState as PipelineState, generate, persist_step
from server.sessions import SessionService, auto_title, untitled
from server.agent.fit_message import fit_assistant_message
from server.agent.intents import is_chinese
from server.turn import RunnerSink, Turn
from server.wire import message_obj
from storage.errors import InvalidSessionId, NotFound
from storage.ids import validate_session_id
from storage.models import ChatMessage, SessionRecord, ToolCall, now_iso

log = logging.getLogger("nplt.turns")



def not_remembered(reason: str, zh: bool, listing: bool = False) -> str:
    """What a turn's answer says when long-term memory could not store what the user stated
    (``reason``: ``manager.not_stored_reason``); ``listing``: it heads the list of those statements."""
    if zh:
        return f"未能保存到长期记忆（{reason}），稍后会重试" + ("：" if listing else "。")
    return f"I could not save {'this' if listing else 'that'} to memory: {reason}. It will be retried" + \
        (":" if listing else ".")


class TurnLock(Protocol):
    """One turn per session across server nodes (``server.cluster_lock.ClusterTurnLock``; None on JSON)."""

    # a Hold if the session is free now (or within a moment: another node's turn ending), else None
    async def try_hold(self, session_id: str) -> Any: ...
    # try_hold of a live session of user_id, checked in the same round trip (NotFound otherwise):
    # (Hold or None, storage.pg.lock_holder.Claim or None when nothing was read)
    async def claim_owned(self, session_id: str, user_id: str) -> tuple[Any, Any]: ...
    def request(self, session_id: str) -> Any: ...          # a Hold queued now (arrival order)
    def running_elsewhere(self, session_id: str) -> bool: ...   # a turn of the session known running on another node
    # whether this node's turn answering user message id still has the session (its answer may be stored)
    async def still_held(self, session_id: str, user_message_id: int) -> bool: ...


class _Lane:
    """The queue of one session."""

    __slots__ = ("waiting", "current", "worker", "lock", "holds")

    def __init__(self) -> None:
        self.waiting: deque[Turn] = deque()
        self.current: Turn | None = None
        self.worker: asyncio.Task | None = None
        self.lock = asyncio.Lock()
        self.holds: dict[Turn, Any] = {}   # turn -> its claim on the cluster lock (cluster only)


class TurnRunner:
    """Owns every running and queued turn."""

    def __init__(self, *, store: Any, sessions: SessionService, hub: Hub, agent: Any, memory: Any,
                 limits: LimitsConfig, max_message_bytes: int = 1 << 20, metrics: Metrics | None = None,
                 lock: TurnLock | None = None, pipeline: TurnPipeline | None = None,
                 inflight: NoMarker | None = None) -> None:
        self.store = store
        self.lock = lock   # the cluster's session lock (PostgreSQL storage), else None
        self.inflight = inflight or NoMarker()   # turns in flight, for closing them after a crash (server.recovery)
        self.metrics = metrics or Metrics()   # turn latency, append latency, provider errors (GET /metrics)
        self.max_message_bytes = max_message_bytes   # storage's cap: the stored answer is cut to fit it
        self.sessions = sessions
        self.hub = hub
        self.agent = agent
        self.memory = memory
        self.pipeline = pipeline or TurnPipeline.default(memory)   # route -> recall -> retrieve (server.pipeline)
        self.limits = limits
        # the memory layer's next read, done with the user message's append (PostgreSQL; see _store_user)
        self._read_hint = getattr(memory, "read_hint", None) if getattr(store, "reads_with_append", False) else None
        self.lanes: dict[str, _Lane] = {}
        self.turns_total = 0
        self.turns_running = 0
        self.active: dict[str, int] = {}   # user id -> running + queued turns (max_active_turns_per_user)
        self.background: set[asyncio.Task] = set()
        self.closing = False

    # -- queries ---------------------------------------------------------------------------------
    def running(self, session_id: str) -> Turn | None:
        lane = self.lanes.get(session_id)
        return lane.current if lane is not None else None

    def is_running(self, session_id: str) -> bool:
        lane = self.lanes.get(session_id)
        return lane is not None and (lane.current is not None or bool(lane.waiting))

    def running_state(self, session_id: str) -> TurnState | None:
        """TurnState of the running turn, with ``queued``: the turns waiting behind it, in order."""
        lane = self.lanes.get(session_id)
        turn = lane.current if lane is not None else None
        if turn is None or turn.started_at is None:
            return None
        return turn.state(tuple(QueuedTurn(t.turn_id, t.user_message_obj())
                                for t in lane.waiting if t.cancel_reason is None))

    def find(self, turn_id: str) -> Turn | None:
        """The running or queued turn ``turn_id`` in any session."""
        for lane in self.lanes.values():
            if lane.current is not None and lane.current.turn_id == turn_id:
                return lane.current
            for turn in lane.waiting:
                if turn.turn_id == turn_id:
                    return turn
        return None

    # -- submit / cancel -------------------------------------------------------------------------
    async def submit(self, origin: Subscriber | None, user_id: str, session_id: str, text: str,
                     re: Any = None, *, prepare: Any = None) -> tuple[Turn, int]:
        """Enqueue a turn; returns (turn, turns ahead of it).

        In an idle session the user message is stored durably before this returns (a storage
        failure is raised, so nothing unstored is acknowledged); behind other turns it is stored
        when the turn starts (``turn.user_message`` is None until then).

        ``prepare`` (regenerate, edit): ``async (rec) -> ChatMessage``, run under the session's
        lane lock, which changes the history and returns the stored user message to answer; the
        session must be idle (else QUEUE_FULL) and ``text`` is ignored.
        """
        if self.closing:
            raise HandlerError(ErrorCode.SHUTTING_DOWN, "the server is stopping")
        rec: SessionRecord | None = None
        if self.lock is None or prepare is not None:
            rec = await self.sessions.owned(user_id, session_id)  # first: another user's session is NOT_FOUND
        else:   # cluster: checked by the claim itself (one round trip; _claim)
            try:
                validate_session_id(session_id)
            except InvalidSessionId:
                raise not_found() from None
        lane = self.lanes.get(session_id)
        if lane is None:
            lane = self.lanes[session_id] = _Lane()
        try:
            async with lane.lock:
                if self.closing:
                    raise HandlerError(ErrorCode.SHUTTING_DOWN, "the server is stopping")
                limits = self.limits
                waiting, running = self._queue_of(session_id, lane)
                if waiting >= limits.max_queued_turns + (0 if running else 1):
                    raise HandlerError(ErrorCode.QUEUE_FULL, f"session {session_id} already has "
                                       f"{waiting} turns waiting (max_queued_turns)")
                if self.active.get(user_id, 0) >= limits.max_active_turns_per_user:
                    raise HandlerError(ErrorCode.QUEUE_FULL, f"you already have {self.active[user_id]} turns "
                                       "running or queued (max_active_turns_per_user)")
                ahead = waiting + running
                if prepare is not None and ahead:
                    raise HandlerError(ErrorCode.QUEUE_FULL, f"session {session_id} has a turn running: "
                                       "wait for it to end (or cancel it) first")
                turn = Turn(session_id, user_id, text, origin, re)
                if rec is None:             # cluster, a chat message
                    ahead, (model, title) = await self._claim(lane, turn, ahead)
                else:
                    model, title = rec.model, rec.title
                    if self.lock is not None:   # regenerate / edit need the session idle on every node
                        hold = await self.lock.try_hold(turn.session_id)
                        if hold is None:
                            raise HandlerError(ErrorCode.QUEUE_FULL, f"session {session_id} has a turn running "
                                               "on another node: wait for it to end first")
                        lane.holds[turn] = hold
                turn.model = self.sessions.model_named(model)   # a queued turn's is read again as it starts
                if prepare is not None or not ahead:
                    try:
                        if prepare is not None:
                            assert rec is not None
                            turn.user_message = await prepare(rec)
                            turn.text = turn.user_message.content
                        else:
                            await self._store_user(turn, untitled(title))
                    except BaseException:
                        hold = lane.holds.pop(turn, None)
                        if hold is not None:
                            await hold.release()
                        raise
                lane.waiting.append(turn)
                self.active[user_id] = self.active.get(user_id, 0) + 1
                if lane.worker is None:
                    lane.worker = asyncio.get_running_loop().create_task(self._drain(session_id, lane))
        finally:
            if lane.worker is None and not lane.waiting and not lane.lock.locked() \
                    and self.lanes.get(session_id) is lane:
                del self.lanes[session_id]  # a refused request leaves no empty lane behind
        return turn, ahead

    def _queue_of(self, session_id: str, lane: _Lane) -> tuple[int, bool]:
        """(the lane's turns waiting, whether a turn runs ahead of them), for ``max_queued_turns``
        and ``queued``. In a cluster, while a turn of the session runs on another node, the lane's
        first turn waits for it too (it does not hold the session's lock yet): that other turn is the
        running one, and every turn of the lane a waiting one."""
        current, waiting = lane.current, len(lane.waiting)
        if self.lock is not None and (current is not None or waiting) and self.lock.running_elsewhere(session_id):
            if current is not None and current.started_at is None:
                return waiting + 1, True
            first = lane.holds.get(lane.waiting[0]) if current is None else None
            if current is None and (first is None or not first.ready):
                return waiting, True
        return waiting, current is not None

    async def _claim(self, lane: _Lane, turn: Turn, ahead: int) -> tuple[int, tuple[str | None, str]]:
        """Cluster: claim the session for ``turn`` now, in arrival order, checking it is the user's
        live session in the same round trip (NOT_FOUND otherwise, nothing claimed); returns the
        turns ahead (at least 1 when another node runs one: the user message is then stored when it
        starts; that turn is the lane's running one for ``max_queued_turns``) and the session's
        (model, title). Behind a turn of this node, or when this node still holds the lock, the
        session is read instead (``SessionService.owned``)."""
        hold = facts = None
        if not ahead:
            try:
                hold, claim = await self.lock.claim_owned(turn.session_id, turn.user_id)
            except (NotFound, InvalidSessionId):
                raise not_found() from None
            if claim is not None:
                facts = (claim.model, claim.title)
                if not claim.got and self.limits.max_queued_turns < 1 and self.lock.running_elsewhere(turn.session_id):
                    raise HandlerError(ErrorCode.QUEUE_FULL, f"session {turn.session_id} has a turn running "
                                       "on another node, and no turn may wait behind it (max_queued_turns)")
        if hold is None:
            if facts is None:           # the session is checked before anything is queued
                rec = await self.sessions.owned(turn.user_id, turn.session_id)
                facts = (rec.model, rec.title)
            hold = self.lock.request(turn.session_id)
            ahead = max(ahead, 1)
        lane.holds[turn] = hold
        return ahead, facts

    async def _store_user(self, turn: Turn, title: bool = False) -> None:
        """Append the turn's user message (fsynced); the first message of a session names it. On a
        store that can, the same statement reads what the memory layer reads next (``read_hint``)."""
        store = self.store
        await self.inflight.started(turn.session_id)
        hint = self._read_hint(turn.session_id) if self._read_hint is not None and not title else None
        try:
            turn.user_message = await self.metrics.timed_append(
                store.append(turn.session_id, "user", turn.text) if hint is None else
                store.append(turn.session_id, "user", turn.text, read_after=hint))
        except BaseException:
            self.inflight.ended(turn.session_id)
            raise
        if title:
            await store.rename(turn.session_id, auto_title(turn.text), auto=True)

    def cancel(self, session_id: str, turn_id: str | None = None, reason: str = "cancelled") -> Turn:
        """Cancel the running turn, or the turn ``turn_id`` (a queued one is withdrawn)."""
        lane = self.lanes.get(session_id)
        turns = [] if lane is None else ([lane.current] if lane.current else []) + list(lane.waiting)
        for turn in turns:
            if (turn_id is None or turn.turn_id == turn_id) and turn.cancel_reason is None:
                self._cancel_turn(lane, turn, reason)
                return turn
            if turn_id is None:
                break
        raise HandlerError(ErrorCode.NO_ACTIVE_TURN, "no running turn to cancel" if turn_id is None
                           else f"no active turn {turn_id!r} in this session")

    def cancel_session(self, session_id: str, reason: str = "cancelled", *, withdraw: bool = True) -> None:
        """Cancel the running turn of a session and its queued ones (withdrawn, unless not ``withdraw``:
        then they still run, store their user message and end cancelled at once, as at shutdown)."""
        lane = self.lanes.get(session_id)
        if lane is None:
            return
        for turn in ([lane.current] if lane.current else []) + list(lane.waiting):
            if turn.cancel_reason is None:
                if withdraw or turn is lane.current:
                    self._cancel_turn(lane, turn, reason)
                else:
                    turn.cancel_reason = reason

    def _cancel_turn(self, lane: _Lane, turn: Turn, reason: str) -> None:
        turn.cancel_reason = reason
        if turn is lane.current:
            if turn.task is not None:
                turn.task.cancel()
            return
        lane.waiting.remove(turn)  # queued: withdrawn, nothing was stored
        hold = lane.holds.pop(turn, None)
        if hold is not None:
            hold.cancel()
        self._left(turn)
        RunnerSink(turn, self.hub).publish(TurnEnd(
            turn.session_id, turn.turn_id, None, {}, "cancelled", {}, turn.user_message_obj(), True))

    async def settle(self, session_id: str, timeout: float = 10.0) -> None:
        """Wait (at most ``timeout``) until the session has no running or queued turn."""
        lane = self.lanes.get(session_id)
        if lane is not None and lane.worker is not None:
            await asyncio.wait([lane.worker], timeout=timeout)

    # -- the worker ------------------------------------------------------------------------------
    async def _drain(self, session_id: str, lane: _Lane) -> None:
        try:
            while lane.waiting:
                turn = lane.waiting.popleft()
                lane.current = turn
                self.turns_running += 1
                hold = lane.holds.pop(turn, None)
                try:
                    if hold is None or await self._wait_hold(turn, hold):
                        await self.metrics.timed_turn(self._run(turn))
                except Exception:  # pragma: no cover - _run handles its own failures
                    log.exception("turn %s crashed", turn.turn_id)
                finally:
                    self.turns_running -= 1
                    self.turns_total += 1
                    lane.current = None
                    self._left(turn)
                    if turn.user_message is not None:
                        self.inflight.ended(session_id)
                    if hold is not None:   # (the lane is idle meanwhile: a chat now claims the session)
                        await hold.release()
        finally:
            lane.worker = None
            if not lane.waiting and not lane.lock.locked() and self.lanes.get(session_id) is lane:
                del self.lanes[session_id]

    async def _wait_hold(self, turn: Turn, hold: Any) -> bool:
        """Cluster: wait until the session is this turn's (False: it was cancelled meanwhile and is
        withdrawn, or the lock could not be had, PostgreSQL staying unreachable beyond the retry
        policy: TURN_ERROR saying that its user message, waiting in memory, was not stored)."""
        if turn.cancel_reason is not None and not hold.ready:
            hold.cancel()               # shutdown or cancel before its turn came: nothing was stored
        else:
            turn.task = asyncio.get_running_loop().create_task(hold.wait())
            try:
                await turn.task
                return True
            except asyncio.CancelledError:
                if turn.cancel_reason is None:
                    raise               # the worker itself was cancelled
            except Exception as exc:
                err = failure_of(exc)
                if err is None:
                    log.exception("turn %s: session lock not had, user message not stored", turn.turn_id)
                    err = HandlerError(ErrorCode.INTERNAL, "internal error")
                else:
                    log.warning("turn %s: session lock not had, user message not stored: %s", turn.turn_id, err)
                RunnerSink(turn, self.hub).publish(TurnError(
                    turn.session_id, turn.turn_id, err.code,
                    f"the turn could not start and its message was not stored: {err.message}"))
                return False
            finally:
                turn.task = None
        RunnerSink(turn, self.hub).publish(TurnEnd(
            turn.session_id, turn.turn_id, None, {}, "cancelled", {}, turn.user_message_obj(), True))
        return False

    def _left(self, turn: Turn) -> None:
        """A turn ended or was withdrawn: it no longer counts for its user."""
        left = self.active.get(turn.user_id, 0) - 1
        if left > 0:
            self.active[turn.user_id] = left
        else:
            self.active.pop(turn.user_id, None)

    async def _run(self, turn: Turn) -> None:
        turn.started_at = now_iso()
        sink = RunnerSink(turn, self.hub)
        if turn.user_message is None:  # it was queued: stored now, after the answers before it
            try:
                await self._store_user(turn)
            except Exception as exc:
                err = failure_of(exc)
                if err is None:
                    log.exception("turn %s: user message not stored", turn.turn_id)
                    err = HandlerError(ErrorCode.INTERNAL, "internal error")
                else:
                    log.warning("turn %s: user message not stored: %s", turn.turn_id, err)
                sink.publish(TurnError(turn.session_id, turn.turn_id, err.code,
                                       f"the message could not be stored: {err.message}"))
                return
            await self._resolve_model(turn)   # a MODEL_SWITCH while it waited applies to it
        sink.publish(TurnStart(turn.session_id, turn.turn_id, message_obj(turn.user_message), turn.model))
        self.sessions.publish_updated_soon(turn.session_id, self.spawn)  # session lists show it running
        log.debug("turn %s started in %s", turn.turn_id, turn.session_id)
        ctx = BuiltContext(messages=[], metadata={})
        state = PipelineState(turn.session_id, turn.user_id, turn.model, turn.turn_id, turn.user_message)
        try:
            if turn.cancel_reason is None:
                # every request also carries the agent's tool schemas: reserved before the context is fitted
                state.tool_schema_tokens = await tool_schema_tokens(self.agent, turn.user_id)
                ctx = await self.pipeline.prepare(state)
            if turn.cancel_reason is not None:
                raise asyncio.CancelledError
            turn.task = asyncio.get_running_loop().create_task(generate(state, self.agent, sink))
            result = await turn.task
        except asyncio.CancelledError:
            if turn.cancel_reason is None:  # the worker itself was cancelled: not ours to absorb
                if turn.task is not None:
                    turn.task.cancel()
                raise
            await self._end_cancelled(turn, sink, ctx, state)
        except AgentError as exc:
            self.metrics.provider_error(exc.code)
            await self._end_error(turn, sink, exc.code, exc.message, exc.attempts, ctx, state)
        except Exception:
            log.exception("turn %s failed", turn.turn_id)
            await self._end_error(turn, sink, ErrorCode.INTERNAL, "internal error while running the turn", 1, ctx,
                                  state)
        else:
            if turn.cancel_reason is not None:
                await self._end_cancelled(turn, sink, ctx, state)
            else:
                await self._end_ok(turn, sink, ctx, result, state)

    async def _resolve_model(self, turn: Turn) -> None:
        """The session's model as the turn starts (a queued turn's was read when it was enqueued; a
        ``MODEL_SWITCH`` meanwhile applies to it, as a ``SESSION_PROMPT`` does). When the session
        cannot be read, the model read at enqueue stays."""
        try:
            rec = await self.store.get(turn.session_id)
        except Exception as exc:
            log.warning("turn %s: session not read at start (%s); model %s kept", turn.turn_id,
                        type(exc).__name__, turn.model)
            return
        turn.model = self.sessions.model_of(rec)

    async def _store_assistant(self, turn: Turn, content: str, calls: list[ToolCall],
                               metadata: dict[str, Any]) -> ChatMessage | HandlerError:
        """The stored answer (cut to fit max_message_bytes), or why it could not be stored: NOT_FOUND only when the session is
        really gone (deleted during the turn), STORAGE_ERROR for an I/O failure (a full disk).

        In a cluster the answer is stored only while the turn still has the session: its lock is
        held (``still_held``, no round trip while the lock's connection looks up), and, checked by
        the append itself (``fence``: the turn's user message id), the session was not deleted or
        cleared, and nothing but superseded messages stored after that message, since. A node that
        stalled while PostgreSQL dropped its connections has not noticed yet that its lock went
        and another node took the session over; the fence still refuses its answer
        (STORAGE_UNAVAILABLE, ``storage.pg.appends.SessionMoved``: nothing stored)."""
        fitted = fit_assistant_message(content, calls, metadata, self.max_message_bytes)
        fenced: dict[str, int] = {}         # (cluster only: the JSON store's turns need no fence)
        try:
            if self.lock is not None and turn.user_message is not None:
                if not await self.lock.still_held(turn.session_id, turn.user_message.id):
                    log.warning("turn %s: answer not stored: another node took the session over", turn.turn_id)
                    return HandlerError(ErrorCode.STORAGE_UNAVAILABLE, "the answer was not stored: the connection "
                                        "to the database broke and another node took the session over meanwhile")
                fenced["fence"] = turn.user_message.id
            return await self.metrics.timed_append(self.store.append(
                turn.session_id, "assistant", fitted.content, tool_calls=fitted.tool_calls, metadata=fitted.metadata,
                **fenced))
        except (NotFound, InvalidSessionId):
            log.info("turn %s: answer not stored: the session is gone", turn.turn_id)
            return HandlerError(ErrorCode.NOT_FOUND, "the session is gone")
        except Exception as exc:
            err = failure_of(exc)
            if err is None:
                log.exception("turn %s: answer not stored", turn.turn_id)
                return HandlerError(ErrorCode.INTERNAL, "internal error: the answer was not stored")
            log.warning("turn %s: answer not stored: %s", turn.turn_id, err)
            return HandlerError(err.code, f"the answer could not be stored: {err.message}")

    def _not_stored(self, sink: RunnerSink, err: HandlerError) -> None:
        sink.publish(TurnError(sink.sid, sink.tid, err.code, err.message))
        self._updated_after(sink.turn.session_id)

    async def _persist(self, turn: Turn, state: PipelineState, answer: Answer) -> ChatMessage | HandlerError:
        """The pipeline's persist step over this runner's storage (``_store_assistant``)."""
        async def save(s: PipelineState) -> ChatMessage | HandlerError:
            a = s.answer
            assert a is not None
            return await self._store_assistant(turn, a.content, a.tool_calls, a.metadata)
        state.answer = answer
        await persist_step(save)(state)
        return state.stored

    async def _end_ok(self, turn: Turn, sink: RunnerSink, ctx: BuiltContext, result: TurnResult,
                      state: PipelineState) -> None:
        meta = {**result.metadata, "model": turn.model, "usage": result.usage,
                "finish_reason": result.finish_reason, "context": ctx.metadata, "turn_id": turn.turn_id}
        answer = Answer(result.content, list(result.tool_calls), result.finish_reason, meta)
        learn_now = getattr(self.memory, "learn_now", None)   # an acknowledged fact is stored before its answer
        if learn_now is not None and turn.user_message is not None:
            not_stored = await learn_now(turn.session_id, turn.user_id, turn.user_message)
            if isinstance(not_stored, str) and not_stored:
                answer = await self._not_remembered(turn, sink, answer, not_stored)
        msg = await self._persist(turn, state, answer)
        if isinstance(msg, HandlerError):
            self._not_stored(sink, msg)
            return
        sink.publish(TurnEnd(turn.session_id, turn.turn_id, message_obj(msg), result.usage,
                             result.finish_reason, ctx.metadata))
        self._after_turn(turn, msg)

    async def _not_remembered(self, turn: Turn, sink: RunnerSink, answer: Answer, reason: str) -> Answer:
        """The answer of a turn whose user message states something long-term memory could not store
        (``learn_now``: ``reason``, e.g. "the server's storage failed (File too large)"): it does not
        claim it was noted. The offline agent's acknowledgement ("Noted:" / "好的，记下了：",
        ``answers.noted``) opens with ``not_remembered`` instead; any other answer ends with it. The
        streamed text gets it too (a client that shows only the deltas), a NOTICE STORAGE_ERROR goes
        to the session, and the stored answer's metadata says ``memory_error``. The memory layer
        learns the message again after the turn and with the session's next turns."""
        zh = is_chinese(turn.text)
        note = not_remembered(reason, zh)
        await sink.delta(("\n\n" if answer.content else "") + note)
        await sink.notice("warning", str(ErrorCode.STORAGE_ERROR), note)
        content = answer.content
        head = next((h for h in NOTED_HEADS if content.startswith(h)), None)
        if head is not None and set(answer.metadata.get("intents") or ()) & {"note", "forget"}:
            content = not_remembered(reason, head != NOTED_HEADS[0], listing=True) + content[len(head):]
        else:
            content = f"{content}\n\n{note}" if content else note
        return Answer(content, answer.tool_calls, answer.finish_reason, {**answer.metadata, "memory_error": reason})

    async def _end_cancelled(self, turn: Turn, sink: RunnerSink, ctx: BuiltContext, state: PipelineState) -> None:
        meta = {"partial": True, "model": turn.model, "finish_reason": "cancelled",
                "cancel_reason": turn.cancel_reason, "context": ctx.metadata, "turn_id": turn.turn_id}
        msg = await self._persist(turn, state, Answer(turn.content, turn.finished_calls(), "cancelled", meta))
        if isinstance(msg, HandlerError):
            self._not_stored(sink, msg)
            return
        sink.publish(TurnEnd(turn.session_id, turn.turn_id, message_obj(msg), {}, "cancelled", ctx.metadata))
        self._after_turn(turn, msg)

    async def _end_error(self, turn: Turn, sink: RunnerSink, code: ErrorCode, message: str, attempts: int,
                         ctx: BuiltContext | None, state: PipelineState) -> None:
        """The failed answer is stored (whatever was streamed, possibly nothing) marked with the
        error, so history never holds two user messages in a row and the failure shows after reload."""
        meta = {"partial": bool(turn.length or turn.calls), "model": turn.model, "finish_reason": "error",
                "error": str(code), "error_message": message, "attempts": attempts, "turn_id": turn.turn_id}
        if ctx is not None and ctx.metadata:                  # what reached the model ("why this answer")
            meta["context"] = ctx.metadata
        msg = await self._persist(turn, state, Answer(turn.content, turn.finished_calls(), "error", meta))
        partial = None if isinstance(msg, HandlerError) else message_obj(msg)
        log.info("turn %s ended with %s", turn.turn_id, code)
        sink.publish(TurnError(turn.session_id, turn.turn_id, code, message, partial))
        self._updated_after(turn.session_id)

    def _after_turn(self, turn: Turn, answer: ChatMessage) -> None:
        """Session-list update and memory work (given the stored answer), in the background (never
        delays TURN_END)."""
        self._updated_after(turn.session_id)
        self.spawn(self.memory.after_turn(turn.session_id, turn.user_id, answer))

    def _updated_after(self, session_id: str) -> None:
        """SESSION_EVENT ``updated`` once the ending turn has left its lane (``running`` is then
        false unless others wait): on the next loop iteration, without a task when it can."""
        asyncio.get_running_loop().call_soon(self.sessions.publish_updated_soon, session_id, self.spawn)

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task) -> None:
        self.background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception())

    # -- shutdown --------------------------------------------------------------------------------
    async def shutdown(self, timeout: float = 10.0) -> None:
        """Cancel every turn (partial answers are saved), wait for the workers, then background work."""
        self.closing = True
        for session_id in list(self.lanes):
            self.cancel_session(session_id, reason="shutdown", withdraw=False)  # queued ones are stored
        workers = [lane.worker for lane in self.lanes.values() if lane.worker is not None]
        if workers:
            _, pending = await asyncio.wait(workers, timeout=timeout)
            for task in pending:
                task.cancel()
        if self.background:
            _, pending = await asyncio.wait(list(self.background), timeout=timeout)
            for task in pending:
                task.cancel()
