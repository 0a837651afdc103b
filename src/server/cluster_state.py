"""The running turn of a session that runs on another server node, for a SESSION_SWITCH or a HELLO
that attaches to that session here (issue 17, cluster): the reply's ``running_turn`` comes from the
node that runs it.

This node asks through the relay's control items (``["g", request, session]``); the node whose
runner has the turn answers with its ``TurnState`` (``["v", request, asking node, state]``; a big one
is spilled to the events table like any item). The answer travels in order with that node's events:
what it streamed before is in the state, what follows comes as events. The connection holds the
events that arrive meanwhile until its reply has gone out (``V3Port.hold_events``); of those, the
client drops by their offsets what the state already holds, as after any reattach (docs/protocol.md
§3). Asked only when this node knows the session's turn runs elsewhere
(``Cluster.remote_turns``); no answer within ``remote_state_wait_ms`` (the turn ended meanwhile, or
the node is gone): no running turn in the reply, as before.
"""
from __future__ import annotations

import logging
from typing import Any

from protocol import ProtocolError
from protocol.objects import TurnState
from server.cluster_requests import ControlRequests

log = logging.getLogger("nplt.cluster")


class RemoteTurnState:
    """State requests between nodes: sent by ``state_elsewhere``, answered by ``on_control``."""

    def __init__(self, cluster: Any, wait_ms: float) -> None:
        self.cluster = cluster
        self.requests = ControlRequests(cluster.relay, wait_ms)
        self.runner: Any = None                     # server.turns.TurnRunner, set by build_services

    async def state_elsewhere(self, session_id: str) -> TurnState | None:
        """The state of ``session_id``'s turn from the node that runs it, or None."""
        if session_id not in self.cluster.remote_turns:
            return None
        body = await self.requests.ask(lambda request: ["g", request, session_id])
        if body is None:
            return None
        try:
            return TurnState.decode(body)
        except ProtocolError as exc:
            log.warning("cluster: ignored a malformed turn state for session %s (%s)", session_id, exc.message)
            return None

    def on_control(self, node: str, item: list[Any]) -> None:
        try:
            if item[0] == "g":
                state = self.runner.running_state(str(item[2])) if self.runner is not None else None
                if state is not None:
                    self.cluster.relay.control(["v", item[1], node, state.encode()])
            elif item[0] == "v" and item[2] == self.cluster.node_id:
                self.requests.answered(item[1], item[3])
        except (TypeError, ValueError, IndexError):
            log.warning("cluster: ignored a malformed control item from node %s", node)
