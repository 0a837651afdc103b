"""Events a client can cause without limit, logged without flooding (``ThrottledLog``): connections
refused (over ``max_clients``, or while stopping: ``Refusals``), failed logins and connections closed
before their HELLO (``server.auth.LoginGuard``).

A flood of such events would otherwise write one line each, and rotate every other line out of the
log files. The first event is logged at once; later ones at most once per ``interval_s``, as one line
saying how many there were since the last line, and the latest. ``total`` counts them all (STATS
reports the refusals' as ``refused_total``).
"""
from __future__ import annotations

import logging
import time
from typing import Callable

log = logging.getLogger("nplt.conn")
LOG_INTERVAL_S = 10.0     # at most one line per this interval per kind of event (after the first at once)


class ThrottledLog:
    """One kind of event, counted and logged at ``level`` at most once per ``interval_s``.

    ``first`` and ``summary`` are %-templates over ``id`` (connection), ``peer``, ``reason`` and, for
    ``summary``, ``n`` (events since the last line) and ``s`` (seconds since it).
    """

    first = "connection %(id)s from %(peer)s: %(reason)s"
    summary = "%(n)d events in the last %(s).0f s; latest: connection %(id)s from %(peer)s: %(reason)s"

    def __init__(self, interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic, *,
                 level: int = logging.WARNING, first: str | None = None, summary: str | None = None) -> None:
        self.interval_s = interval_s
        self.level = level
        self.total = 0
        if first is not None:
            self.first = first
        if summary is not None:
            self.summary = summary
        self._clock = clock
        self._unlogged = 0          # events since the last line
        self._last: float | None = None

    def note(self, conn_id: int | str, peer: str, reason: str) -> bool:
        """Count one event; log it unless a line was written less than ``interval_s`` ago.

        Returns whether a line was written.
        """
        self.total += 1
        self._unlogged += 1
        now = self._clock()
        if self._last is not None and now - self._last < self.interval_s:
            return False
        args = {"id": conn_id, "peer": peer, "reason": reason}
        if self._unlogged == 1:
            log.log(self.level, self.first, args)
        else:
            log.log(self.level, self.summary, {**args, "n": self._unlogged, "s": now - self._last})
        self._unlogged = 0
        self._last = now
        return True


class Refusals(ThrottledLog):
    """Connections refused (over ``max_clients`` or ``max_clients_per_ip``, or while stopping)."""

    first = "connection %(id)s from %(peer)s refused: %(reason)s"
    summary = "%(n)d connections refused in the last %(s).0f s (%(reason)s); latest: %(id)s from %(peer)s"
