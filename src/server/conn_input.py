"""InputWatch: the partial input of one connection, counted and timed.

After every read the connection hands it the outcome; it then

- counts what the codec holds (an incomplete frame, a fragmented message being reassembled) in the
  server-wide ``InputBudget`` (``server.conn_limits``), and refuses the growing fragmented message
  with SERVER_BUSY (not fatal) when the total is over ``max_total_input_buffer``;
- times the message in progress: a message that has started (its first byte arrived) must be
  complete within ``message_timeout_s`` (like nginx's client_body_timeout, but for the whole
  message), or ``on_timeout`` is called (the connection closes with MESSAGE_TIMEOUT).

``release()`` gives everything back when the connection closes.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from protocol import Connection as Codec
from protocol import ErrorCode
from server.config import LimitsConfig
from server.conn_limits import InputBudget

log = logging.getLogger("nplt.conn")


class InputWatch:
    __slots__ = ("codec", "budget", "limits", "loop", "on_timeout", "name", "counted", "started", "_timer")

    def __init__(self, codec: Codec, budget: InputBudget, limits: LimitsConfig, loop: asyncio.AbstractEventLoop,
                 on_timeout: Callable[[str], None], name: str) -> None:
        self.codec = codec
        self.budget = budget
        self.limits = limits
        self.loop = loop
        self.on_timeout = on_timeout
        self.name = name
        self.counted = 0                 # bytes of this connection in budget.total
        self.started: float | None = None  # when the message in progress started
        self._timer: asyncio.TimerHandle | None = None

    @property
    def busy(self) -> bool:
        """Anything to account for after a read (a cheap test for the hot path)."""
        return bool(self.counted) or self.started is not None or self.codec.in_message

    def after_read(self, completed: bool) -> None:
        """A read was fed to the codec; ``completed``: it finished at least one message."""
        codec = self.codec
        delta = codec.bytes_buffered - self.counted
        if delta:
            self.counted += delta
            total = self.budget.add(delta)
            if delta > 0 and total > self.budget.threshold(self.limits.max_total_input_buffer):
                self._refuse(total)
        if codec.in_message:
            if completed or self.started is None:
                self.started = self.loop.time()
            if self._timer is None:
                self._timer = self.loop.call_later(self.limits.message_timeout_s, self._check)
        else:
            self.started = None

    def _refuse(self, total: int) -> None:
        cap = self.limits.max_total_input_buffer
        freed = self.codec.refuse_message(
            ErrorCode.SERVER_BUSY,
            f"message refused: the server holds {total} bytes of incomplete messages, over "
            f"max_total_input_buffer ({cap}); send it again later")
        if freed:
            self.counted -= freed
            self.budget.give_back(freed)
            self.budget.refused += 1
            log.info("connection %s: a fragmented message (%d bytes so far) refused: %d bytes of partial input "
                     "held, over max_total_input_buffer (%d)", self.name, freed, total, cap)

    def _check(self) -> None:
        self._timer = None
        started = self.started
        if started is None or self.codec.closed:
            return
        timeout = self.limits.message_timeout_s
        left = started + timeout - self.loop.time()
        if left > 0:
            self._timer = self.loop.call_later(left, self._check)
            return
        self.on_timeout(f"a message was not completed within message_timeout_s ({timeout:g} s; "
                        f"{self.codec.bytes_buffered} bytes of it held)")

    def release(self) -> None:
        """The connection closed: its bytes leave the budget, the timer stops."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.started = None
        if self.counted:
            self.budget.give_back(self.counted)
            self.counted = 0
