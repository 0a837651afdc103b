"""Cancelling turns that run on another server node (issue 17, cluster): CHAT_CANCEL, and the delete
or clear of a session, reach the node that runs (or queues) its turn, through the relay's control items.

- ``cancel_elsewhere``: a CHAT_CANCEL that found no such turn on this node asks the other nodes
  (``["c", request, user, session|None, turn|None, reason, whole]``); the node that cancelled one
  answers (``["r", request, asking node, turn id, queued]``). No answer within
  ``remote_cancel_wait_ms``: NO_ACTIVE_TURN, as for a turn that does not exist.
- ``TurnControlAcrossNodes``: what ``SessionService`` uses to stop a session's turns before a delete
  or clear. Besides this node's runner, it asks every node to cancel the session's running turn and
  withdraw its queued ones (``whole``), then waits (at most the runner's settle timeout) until the
  running turn's TURN_END has arrived here, so its partial answer is stored before the delete or
  clear, as on one node. If it has not arrived by then (that node is frozen, or the notification
  late), ``quiet`` runs the delete or clear holding the session's lock, which that turn holds until
  its answer is stored: waited for at most ``ending_turn_wait_ms``, else the delete or clear is
  refused QUEUE_FULL, so that no answer lands in a session after it was cleared.
- a session deleted on another node: this node's clients attached to it are moved to the user's
  newest session (``SessionService.move_attached``), as the deleting node does with its own.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from protocol import ErrorCode
from server.cluster_requests import ControlRequests
from server.errors import HandlerError

log = logging.getLogger("nplt.cluster")


class RemoteCancel:
    """Cancel requests between nodes: sent by ``cancel_elsewhere``, handled by ``on_control``."""

    def __init__(self, cluster: Any, wait_ms: float) -> None:
        self.cluster = cluster
        self.requests = ControlRequests(cluster.relay, wait_ms)
        self.runner: Any = None                     # server.turns.TurnRunner, set by build_services
        self._tasks: set[asyncio.Task] = set()

    async def cancel_elsewhere(self, user_id: str, session_id: str | None, turn_id: str | None,
                               reason: str = "cancelled") -> tuple[str, bool] | None:
        """Ask the other nodes to cancel the running turn of ``session_id`` (or the turn ``turn_id``,
        running or queued, of the user's): (turn id, was queued) from the node that did, or None."""
        return await self.requests.ask(lambda request: ["c", request, user_id, session_id, turn_id, reason, False])

    def cancel_session_elsewhere(self, session_id: str, reason: str) -> None:
        """Ask every other node to cancel the session's running turn and withdraw its queued ones."""
        self.cluster.relay.control(["c", "", None, session_id, None, reason, True])

    def on_control(self, node: str, item: list[Any]) -> None:
        try:
            if item[0] == "c":
                self._cancel_here(node, *item[1:7])
            elif item[0] == "r" and item[2] == self.cluster.node_id:
                self.requests.answered(item[1], (str(item[3]), bool(item[4])))
        except (TypeError, ValueError, IndexError):
            log.warning("cluster: ignored a malformed control item from node %s", node)

    def _cancel_here(self, node: str, request: str, user_id: str | None, session_id: str | None,
                     turn_id: str | None, reason: str, whole: bool) -> None:
        runner = self.runner
        if runner is None:
            return
        if session_id is None:                      # a turn id of the user's, in any session
            turn = runner.find(turn_id) if turn_id is not None else None
            if turn is None or turn.user_id != user_id:
                return
            session_id = turn.session_id
        if whole:
            if runner.is_running(session_id):
                log.info("cluster: node %s asked to cancel the turns of %s (%s)", node, session_id, reason)
                runner.cancel_session(session_id, reason)
            return
        try:
            turn = runner.cancel(session_id, turn_id, reason)
        except HandlerError:
            return                                  # not here (another node may have it)
        log.info("cluster: node %s cancelled turn %s of %s", node, turn.turn_id, session_id)
        self.cluster.relay.control(["r", request, node, turn.turn_id, turn.started_at is None])

    def on_deleted(self, user_id: str, session_id: str) -> None:
        """A session deleted on another node: move this node's clients attached to it."""
        if not self.cluster.hub.session_subscribers(session_id):
            return
        task = asyncio.get_running_loop().create_task(self._move(user_id, session_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _move(self, user_id: str, session_id: str) -> None:
        try:
            await self.cluster.sessions.move_attached(user_id, session_id)
        except Exception as exc:              # storage unreachable: the clients keep the deleted session
            log.warning("cluster: cannot move the clients of deleted session %s (%s)", session_id, exc)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class TurnControlAcrossNodes:
    """``sessions.TurnControl`` over this node's runner and the other nodes' turns (module doc)."""

    def __init__(self, runner: Any, cluster: Any) -> None:
        self.runner = runner
        self.cluster = cluster

    def is_running(self, session_id: str) -> bool:
        return self.runner.is_running(session_id) or session_id in self.cluster.remote_turns

    def cancel_session(self, session_id: str, reason: str = "cancelled", *, withdraw: bool = True) -> None:
        self.runner.cancel_session(session_id, reason, withdraw=withdraw)
        self.cluster.remote_cancel.cancel_session_elsewhere(session_id, reason)

    async def settle(self, session_id: str, timeout: float = 10.0) -> None:
        await self.runner.settle(session_id, timeout)
        await self.cluster.wait_remote_end(session_id, timeout)

    @contextlib.asynccontextmanager
    async def quiet(self, session_id: str, action: str = "change") -> AsyncIterator[None]:
        """After ``settle``: while the body (a delete or clear) runs, no turn of any node can store
        into the session. Nothing to do when no turn of the session is known to be left, here or on
        another node (the common case: its TURN_END arrived, so its answer is stored). Otherwise the
        session's lock is taken, which that turn holds until its answer is stored (at most
        ``ending_turn_wait_ms``: ``try_hold``; a dead node's turn is closed as interrupted first), and
        held until the body is done; if it cannot be had, HandlerError QUEUE_FULL and nothing is done."""
        if session_id not in self.cluster.remote_turns and not self.runner.is_running(session_id):
            yield
            return
        hold = await self.cluster.turn_lock.try_hold(session_id)
        if hold is None:
            where = self.cluster.remote_turns.get(session_id)
            log.warning("cluster: the turn of %s (%s) did not stop: %s refused", session_id,
                        "this node" if where is None else f"node {where[0]}", action)
            raise HandlerError(ErrorCode.QUEUE_FULL, f"a turn of session {session_id} did not stop; try again")
        try:
            yield
        finally:
            await hold.release()
