"""Connections refused (over ``max_clients``, or while stopping): counted, and logged without flooding.

A flood of connections over the limit would otherwise write one warning each. The first refusal
is logged at once; later ones at most once per ``interval_s``, as one line saying how many were
refused since the last line. ``total`` is reported by STATS (``refused_total``).
"""
from __future__ import annotations

import logging
import time
from typing import Callable

log = logging.getLogger("nplt.conn")


class Refusals:
    def __init__(self, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.total = 0
        self._clock = clock
        self._unlogged = 0          # refused since the last line
        self._last: float | None = None

    def note(self, conn_id: int, peer: str, reason: str) -> bool:
        """Count one refusal; log it unless a line was written less than ``interval_s`` ago.

        Returns whether a line was written.
        """
        self.total += 1
        self._unlogged += 1
        now = self._clock()
        if self._last is not None and now - self._last < self.interval_s:
            return False
        if self._unlogged == 1:
            log.warning("connection %s from %s refused: %s", conn_id, peer, reason)
        else:
            log.warning("%d connections refused in the last %.0f s (%s); latest: %s from %s",
                        self._unlogged, now - self._last, reason, conn_id, peer)
        self._unlogged = 0
        self._last = now
        return True
