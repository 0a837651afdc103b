"""The turn pipeline: one queue per session (turns serialized), sessions concurrent.

A chat send stores the user message durably and enqueues a Turn; the session's worker runs it:
TURN_START, then whatever the agent reports through the TurnSink (status, tool calls, deltas), then the
assistant message is stored and TURN_END sent. AgentError -> TURN_ERROR (what was streamed is saved with
``partial: true``); cancel -> partial saved, TURN_END ``finish_reason: "cancelled"``. A turn does not
belong to a connection: a client that goes away does not stop it, and a client that comes back can
reattach (``Turn.state()`` is the TurnState of docs/protocol.md).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections import deque
from typing import TYPE_CHECKING, Any

from protocol import MsgType
from server.agent.base import AgentError, BuiltContext, TurnRequest, TurnResult
from server.errors import HandlerError
from server.sessions import auto_title, needs_title
from storage.models import ChatMessage, ToolCall, now_iso

if TYPE_CHECKING:  # pragma: no cover
    from server.app import Server
    from server.connection import ServerConnection

log = logging.getLogger("nplt.turns")

_TURN_PREFIX = secrets.token_hex(4)   # unique per server run; the counter makes ids unique within it
_turn_counter = itertools.count(1)
YIELD_EVERY = 32  # deltas between forced yields to the event loop


class Turn:
    """One user message being answered; holds what has been streamed so far."""

    __slots__ = ("turn_id", "session_id", "user_id", "user_message", "origin", "re", "model", "status",
                 "parts", "length", "calls", "started_at", "task", "cancel_reason")

    def __init__(self, session_id: str, user_id: str, user_message: ChatMessage,
                 origin: ServerConnection | None, re: Any) -> None:
        self.turn_id = f"t_{_TURN_PREFIX}{next(_turn_counter):x}"
        self.session_id = session_id
        self.user_id = user_id
        self.user_message = user_message
        self.origin = origin
        self.re = re
        self.model = ""
        self.status = "thinking"
        self.parts: list[str] = []
        self.length = 0
        self.calls: dict[str, ToolCall] = {}
        self.started_at: str | None = None
        self.task: asyncio.Task | None = None
        self.cancel_reason: str | None = None

    @property
    def content(self) -> str:
        if len(self.parts) > 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    def finished_calls(self) -> list[ToolCall]:
        """Tool calls for a partial message; calls still running are marked interrupted."""
        out = []
        for call in self.calls.values():
            if call.status == "running":
                call.status, call.result = "error", "interrupted"
            out.append(call)
        return out

    def state(self) -> dict[str, Any]:
        return {"turn_id": self.turn_id, "session_id": self.session_id,
                "user_message": self.user_message.to_dict(), "status": self.status,
                "content": self.content, "tool_calls": [c.to_dict() for c in self.calls.values()],
                "started_at": self.started_at or self.user_message.timestamp}


class RunnerSink:
    """TurnSink implementation: every call updates the Turn and fans out one event, without awaiting."""

    __slots__ = ("turn", "hub", "base")

    def __init__(self, turn: Turn, server: Server) -> None:
        self.turn = turn
        self.hub = server.hub
        self.base = {"session_id": turn.session_id, "turn_id": turn.turn_id}

    def _publish(self, msg_type: int, extra: dict[str, Any]) -> None:
        t = self.turn
        self.hub.publish_turn(t.session_id, msg_type, {**self.base, **extra}, t.origin, t.re)

    async def status(self, status: str, detail: str | None = None) -> None:
        self.turn.status = status
        self._publish(MsgType.TURN_STATUS, {"status": status} if detail is None else
                      {"status": status, "detail": detail})

    async def tool_call(self, call: ToolCall) -> None:
        self.turn.calls[call.id] = call
        d = call.to_dict()
        d.update(result="", status="running", duration=0)
        self._publish(MsgType.TOOL_CALL, {"call": d})

    async def tool_result(self, call: ToolCall) -> None:
        self.turn.calls[call.id] = call
        self._publish(MsgType.TOOL_RESULT, {"call": call.to_dict()})

    async def delta(self, text: str) -> None:
        if not text:
            return
        t = self.turn
        offset = t.length
        t.parts.append(text)
        t.length = offset + len(text)
        self._publish(MsgType.ANSWER_DELTA, {"text": text, "offset": offset})
        if len(t.parts) % YIELD_EVERY == 0:  # an agent that never awaits must not starve the loop
            await asyncio.sleep(0)

    async def notice(self, level: str, code: str, message: str) -> None:
        self.hub.publish_session_v3(self.turn.session_id, MsgType.NOTICE,
                                    {"level": level, "code": code, "message": message,
                                     "session_id": self.turn.session_id})


class _Lane:
    """The queue of one session."""

    __slots__ = ("waiting", "current", "worker", "lock")

    def __init__(self) -> None:
        self.waiting: deque[Turn] = deque()
        self.current: Turn | None = None
        self.worker: asyncio.Task | None = None
        self.lock = asyncio.Lock()


class TurnRunner:
    """Owns every running and queued turn."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.lanes: dict[str, _Lane] = {}
        self.turns_total = 0
        self.turns_running = 0
        self.background: set[asyncio.Task] = set()
        self.closing = False

    # -- queries ---------------------------------------------------------------------------------
    def running(self, session_id: str) -> Turn | None:
        lane = self.lanes.get(session_id)
        return lane.current if lane is not None else None

    def is_running(self, session_id: str) -> bool:
        lane = self.lanes.get(session_id)
        return lane is not None and (lane.current is not None or bool(lane.waiting))

    def running_state(self, session_id: str) -> dict[str, Any] | None:
        turn = self.running(session_id)
        return turn.state() if turn is not None and turn.started_at is not None else None

    # -- submit / cancel -------------------------------------------------------------------------
    async def submit(self, origin: ServerConnection | None, user_id: str, session_id: str, text: str,
                     re: Any = None) -> tuple[Turn, int]:
        """Store the user message durably and enqueue its turn; returns (turn, turns ahead of it)."""
        if self.closing:
            raise HandlerError("SHUTTING_DOWN", "the server is stopping")
        srv = self.server
        lane = self.lanes.get(session_id)
        if lane is None:
            lane = self.lanes[session_id] = _Lane()
        try:
            async with lane.lock:
                if len(lane.waiting) >= srv.config.limits.max_queued_turns + (0 if lane.current else 1):
                    raise HandlerError("QUEUE_FULL", f"session {session_id} already has "
                                       f"{len(lane.waiting)} turns waiting (max_queued_turns)")
                rec = await srv.sessions.owned(user_id, session_id)
                msg = await srv.store.append(session_id, "user", text)
                titled = needs_title(rec)
                if titled:
                    await srv.store.rename(session_id, auto_title(text))
                turn = Turn(session_id, user_id, msg, origin, re)
                turn.model = srv.sessions.model_of(rec)
                ahead = len(lane.waiting) + (1 if lane.current is not None else 0)
                lane.waiting.append(turn)
                if lane.worker is None:
                    lane.worker = asyncio.get_running_loop().create_task(self._drain(session_id, lane))
        finally:
            if lane.worker is None and not lane.waiting and not lane.lock.locked() \
                    and self.lanes.get(session_id) is lane:
                del self.lanes[session_id]  # a refused request leaves no empty lane behind
        if titled:  # the list shows the new title now; other changes are published when the turn ends
            self._spawn(srv.sessions.publish_updated(session_id))
        return turn, ahead

    def cancel(self, session_id: str, turn_id: str | None = None, reason: str = "cancelled") -> Turn:
        """Cancel the running turn (or the queued turn ``turn_id``); NO_ACTIVE_TURN otherwise."""
        lane = self.lanes.get(session_id)
        turns = [] if lane is None else ([lane.current] if lane.current else []) + list(lane.waiting)
        for turn in turns:
            if (turn_id is None or turn.turn_id == turn_id) and turn.cancel_reason is None:
                turn.cancel_reason = reason
                if turn.task is not None:
                    turn.task.cancel()
                return turn
            if turn_id is None:
                break
        raise HandlerError("NO_ACTIVE_TURN", "no running turn to cancel" if turn_id is None
                           else f"no active turn {turn_id!r} in this session")

    def cancel_session(self, session_id: str, reason: str = "cancelled") -> None:
        """Cancel every running and queued turn of a session (it is being deleted)."""
        lane = self.lanes.get(session_id)
        if lane is None:
            return
        for turn in ([lane.current] if lane.current else []) + list(lane.waiting):
            if turn.cancel_reason is None:
                turn.cancel_reason = reason
                if turn.task is not None:
                    turn.task.cancel()

    # -- the worker ------------------------------------------------------------------------------
    async def _drain(self, session_id: str, lane: _Lane) -> None:
        try:
            while lane.waiting:
                turn = lane.waiting.popleft()
                lane.current = turn
                self.turns_running += 1
                try:
                    await self._run(turn)
                except Exception:  # pragma: no cover - _run handles its own failures
                    log.exception("turn %s crashed", turn.turn_id)
                finally:
                    self.turns_running -= 1
                    self.turns_total += 1
                    lane.current = None
        finally:
            lane.worker = None
            if not lane.waiting and not lane.lock.locked() and self.lanes.get(session_id) is lane:
                del self.lanes[session_id]

    async def _run(self, turn: Turn) -> None:
        srv = self.server
        turn.started_at = now_iso()
        sink = RunnerSink(turn, srv)
        sink._publish(MsgType.TURN_START, {"user_message": turn.user_message.to_dict(), "model": turn.model})
        log.debug("turn %s started in %s", turn.turn_id, turn.session_id)
        ctx = BuiltContext(messages=[], metadata={})
        try:
            if turn.cancel_reason is None:
                ctx = await srv.memory.build_context(turn.session_id, turn.user_id, turn.user_message,
                                                     turn.model)
            if turn.cancel_reason is not None:
                raise asyncio.CancelledError
            req = TurnRequest(session_id=turn.session_id, user_id=turn.user_id, model=turn.model,
                              turn_id=turn.turn_id, user_message=turn.user_message, context=ctx)
            turn.task = asyncio.get_running_loop().create_task(srv.agent.run_turn(req, sink))
            result = await turn.task
        except asyncio.CancelledError:
            if turn.cancel_reason is None:  # the worker itself was cancelled: not ours to absorb
                if turn.task is not None:
                    turn.task.cancel()
                raise
            await self._end_cancelled(turn, sink, ctx)
        except AgentError as exc:
            await self._end_error(turn, sink, exc.code, exc.message)
        except Exception:
            log.exception("turn %s failed", turn.turn_id)
            await self._end_error(turn, sink, "INTERNAL", "internal error while running the turn")
        else:
            if turn.cancel_reason is not None:
                await self._end_cancelled(turn, sink, ctx)
            else:
                await self._end_ok(turn, sink, ctx, result)

    async def _store_assistant(self, turn: Turn, content: str, calls: list[ToolCall],
                               metadata: dict[str, Any]) -> ChatMessage | None:
        try:
            return await self.server.store.append(turn.session_id, "assistant", content,
                                                  tool_calls=calls, metadata=metadata)
        except Exception as exc:  # e.g. the session was deleted during the turn
            log.warning("turn %s: answer not stored: %s", turn.turn_id, exc)
            return None

    async def _end_ok(self, turn: Turn, sink: RunnerSink, ctx: BuiltContext, result: TurnResult) -> None:
        meta = {**result.metadata, "model": turn.model, "usage": result.usage,
                "finish_reason": result.finish_reason, "context": ctx.metadata, "turn_id": turn.turn_id}
        msg = await self._store_assistant(turn, result.content, list(result.tool_calls), meta)
        if msg is None:
            sink._publish(MsgType.TURN_ERROR, {"code": "NOT_FOUND", "message": "the session is gone",
                                               "partial_message": None})
            return
        sink._publish(MsgType.TURN_END, {"message": msg.to_dict(), "usage": result.usage,
                                         "finish_reason": result.finish_reason, "context": ctx.metadata})
        self._after_turn(turn)

    async def _end_cancelled(self, turn: Turn, sink: RunnerSink, ctx: BuiltContext) -> None:
        meta = {"partial": True, "model": turn.model, "finish_reason": "cancelled",
                "cancel_reason": turn.cancel_reason, "context": ctx.metadata, "turn_id": turn.turn_id}
        msg = await self._store_assistant(turn, turn.content, turn.finished_calls(), meta)
        if msg is None:
            sink._publish(MsgType.TURN_ERROR, {"code": "NOT_FOUND", "message": "the session is gone",
                                               "partial_message": None})
            return
        sink._publish(MsgType.TURN_END, {"message": msg.to_dict(), "usage": {}, "finish_reason": "cancelled",
                                         "context": ctx.metadata})
        self._after_turn(turn)

    async def _end_error(self, turn: Turn, sink: RunnerSink, code: str, message: str) -> None:
        partial = None
        if turn.length or turn.calls:
            meta = {"partial": True, "model": turn.model, "error": code, "turn_id": turn.turn_id}
            msg = await self._store_assistant(turn, turn.content, turn.finished_calls(), meta)
            partial = msg.to_dict() if msg is not None else None
        log.info("turn %s ended with %s", turn.turn_id, code)
        sink._publish(MsgType.TURN_ERROR, {"code": code, "message": message, "partial_message": partial})
        self._spawn(self.server.sessions.publish_updated(turn.session_id))

    def _after_turn(self, turn: Turn) -> None:
        """Session-list update and memory work, in the background (never delays TURN_END)."""
        self._spawn(self.server.sessions.publish_updated(turn.session_id))
        self._spawn(self.server.memory.after_turn(turn.session_id, turn.user_id))

    def _spawn(self, coro: Any) -> None:
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
            self.cancel_session(session_id, reason="shutdown")
        workers = [lane.worker for lane in self.lanes.values() if lane.worker is not None]
        if workers:
            _, pending = await asyncio.wait(workers, timeout=timeout)
            for task in pending:
                task.cancel()
        if self.background:
            _, pending = await asyncio.wait(list(self.background), timeout=timeout)
            for task in pending:
                task.cancel()
