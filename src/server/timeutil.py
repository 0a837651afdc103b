"""Cached ISO 8601 clocks for hot paths (PONG replies)."""
from __future__ import annotations

import time

from storage.models import now_iso

_clock = [0.0, ""]


def iso_now() -> str:
    """Current UTC time as ISO 8601, recomputed at most once per millisecond."""
    t = time.time()
    if t - _clock[0] >= 0.001:
        _clock[0], _clock[1] = t, now_iso()
    return _clock[1]


#: [monotonic time of the last refresh, the ISO time then]: ``iso_at``'s cache, which the one-PING
#: path of ``ServerConnection.data_received`` reads inline
pong_clock = [-1.0, ""]


def iso_at(now: float) -> str:
    """Current UTC time as ISO 8601, given the monotonic clock's ``now`` (the connection's clock, which
    it reads anyway): recomputed when ``now`` is a millisecond or more past the last refresh, or before it."""
    clock = pong_clock
    if not 0 <= now - clock[0] < 0.001:
        clock[0], clock[1] = now, now_iso()
    return clock[1]
