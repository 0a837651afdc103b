"""A cached ISO 8601 clock for hot paths (PONG replies)."""
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
