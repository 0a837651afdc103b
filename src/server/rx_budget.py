"""RxScheduler: a fair, bounded share of each event-loop iteration for received bytes (issue 15, item 9).

One read can bring 256 KiB of pipelined requests, and many connections can be readable in the same
iteration: fed to the codec whole, fifty floods held the loop for seconds. So received bytes are
fed to the codec under a server-wide budget of ``RX_BUDGET_BYTES`` per loop iteration: a read that
finds the budget spent (or its rest, past ``RX_SLICE_BYTES``) waits as bytes, its connection's
reading paused, and the waiting connections are served round-robin, one slice each, at the start of
the following iterations. Small reads (``SMALL_READ_BYTES``: a PING, a chat message) are always
handled at once and not charged, so interactive clients never queue behind a flood and a flood's
share is not spent by them (what one iteration does is still bounded: the budget, plus at most one
small read per readable connection).
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

RX_SLICE_BYTES = 4096        # one connection's share per turn (~150 small requests, ~1 ms)
RX_BUDGET_BYTES = 32768      # received bytes handled per loop iteration, all connections together
SMALL_READ_BYTES = 1024      # reads this small are handled at once, budget or not


class Waiter(Protocol):
    def rx_step(self) -> bool: ...   # feed one slice; True while more of its backlog waits


class RxScheduler:
    __slots__ = ("used", "waiting", "armed")

    def __init__(self) -> None:
        self.used = 0
        self.waiting: deque[Waiter] = deque()
        self.armed = False           # a _next_tick is scheduled (resets ``used``)

    def room(self, n: int) -> bool:
        """May a read of ``n`` bytes be fed now? (then call ``charge``)"""
        return n <= SMALL_READ_BYTES or self.used < RX_BUDGET_BYTES

    def charge(self, n: int) -> None:
        self.used += n
        if not self.armed:
            self.arm()

    def arm(self) -> None:
        """Schedule the next iteration's fresh budget (once per iteration)."""
        self.armed = True
        asyncio.get_running_loop().call_soon(self._next_tick)

    def wait(self, conn: Waiter) -> None:
        """``conn`` has a backlog: it gets a slice in a following iteration."""
        self.waiting.append(conn)
        if not self.armed:
            self.arm()

    def _next_tick(self) -> None:
        """First callback of an iteration: a fresh budget, spent round-robin on the waiting connections."""
        self.armed = False
        self.used = 0
        waiting = self.waiting
        for _ in range(len(waiting)):
            if self.used >= RX_BUDGET_BYTES:
                break
            conn = waiting.popleft()
            if conn.rx_step():
                waiting.append(conn)
        if waiting and not self.armed:
            self.arm()
