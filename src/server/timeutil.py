"""A cached ISO 8601 clock for hot paths (PONG replies): one cache, refreshed at most once per
millisecond of a monotonic clock."""
from __future__ import annotations

import time

from storage.models import now_iso

#: [monotonic time of the last refresh, the ISO time then]: ``iso_at``'s cache, which the one-PING
#: path of ``ServerConnection.data_received`` reads inline
pong_clock = [-1.0, ""]


def iso_at(now: float) -> str:
    """Current UTC time as ISO 8601, given a monotonic clock's ``now`` (a connection's clock, which
    it reads anyway): recomputed when ``now`` is a millisecond or more past the last refresh, or
    before it (another event loop's clock)."""
    clock = pong_clock
    if not 0 <= now - clock[0] < 0.001:
        clock[0], clock[1] = now, now_iso()
    return clock[1]


def iso_now() -> str:
    """``iso_at`` for a caller without a connection's clock at hand."""
    return iso_at(time.monotonic())
