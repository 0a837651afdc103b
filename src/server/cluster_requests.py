"""ControlRequests: a request to the other server nodes over the relay's control items, and the
wait for its answer (issue 17, cluster). Used by ``server.cluster_cancel`` (cancel a turn) and
``server.cluster_state`` (a running turn's state).

``ask`` sends the item ``build(request id)`` and waits at most ``wait_s`` for ``answered(request id,
value)``, which the component calls when an answer addressed to this node arrives; no answer in time
(nobody has it, the node is gone): None. A node alone on its database asks nobody.
"""
from __future__ import annotations

import asyncio
import secrets
from typing import Any, Callable


class ControlRequests:
    def __init__(self, relay: Any, wait_ms: float) -> None:
        self.relay = relay                          # server.cluster_relay.Relay
        self.wait_s = wait_ms / 1000
        self._answers: dict[str, asyncio.Future] = {}

    async def ask(self, build: Callable[[str], list[Any]]) -> Any | None:
        if not self.relay.peers:
            return None                             # this node is alone: nobody else can answer
        request = secrets.token_hex(8)
        answer = asyncio.get_running_loop().create_future()
        self._answers[request] = answer
        try:
            self.relay.control(build(request))
            await self.relay.flush()
            async with asyncio.timeout(self.wait_s):
                return await answer
        except TimeoutError:
            return None
        finally:
            self._answers.pop(request, None)

    def answered(self, request: str, value: Any) -> None:
        answer = self._answers.get(request)
        if answer is not None and not answer.done():
            answer.set_result(value)
