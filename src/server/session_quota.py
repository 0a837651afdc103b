"""``[limits] max_sessions_per_user``: a user's sessions, those in the trash included, counted per
user (read from the store once, kept by creates and purges) and checked one create at a time."""
from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any

from protocol import ErrorCode
from server.errors import HandlerError

#: ``[limits] max_sessions_per_user``'s default, for a SessionService built without the limits
DEFAULT_MAX_SESSIONS = 10_000
#: On a store other nodes share (PostgreSQL), a user's session count is read from it again after this
#: long (seconds), so sessions made or purged on other nodes are counted: a user creating sessions on
#: several nodes at once may pass ``max_sessions_per_user`` by what the others made in that time. On
#: the JSON backend (one process owns the data directory) the count, read once, is kept exact.
COUNT_REFRESH_S = 60.0


def quota_text(have: int, cap: int) -> str:
    """QUOTA_EXCEEDED's message for a session over ``max_sessions_per_user`` (v2 clients read it too)."""
    return (f"you have {have} sessions, the trash included, and max_sessions_per_user is {cap}: no new "
            "session was made. Purge sessions you no longer need from the trash (deleted sessions count "
            "until purged; an NPLT v3 client can list and purge the trash), or ask the operator to raise "
            "[limits] max_sessions_per_user")


class SessionQuota:
    """The per-user session count against ``max_sessions_per_user`` (``limits``: the server's
    ``[limits]``; None: the default)."""

    def __init__(self, store: Any, limits: Any = None) -> None:
        self.store = store
        self.limits = limits
        # user -> (sessions, the trash included; when read from the store)
        self._counts: dict[str, tuple[int, float]] = {}
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    @property
    def max_sessions(self) -> int:
        return getattr(self.limits, "max_sessions_per_user", DEFAULT_MAX_SESSIONS)

    @contextlib.asynccontextmanager
    async def creating(self, user_id: str) -> AsyncIterator[None]:
        """Around one create of ``user_id``'s: QUOTA_EXCEEDED when the user is at the limit; counted
        when the block ends without an error. A user's creates go one at a time (on this node), so two
        at once cannot both take the last place."""
        lock = self._locks.get(user_id)
        if lock is None:
            lock = self._locks[user_id] = asyncio.Lock()
        async with lock:
            cap = self.max_sessions
            have = await self.count(user_id)
            if have >= cap:
                raise HandlerError(ErrorCode.QUOTA_EXCEEDED, quota_text(have, cap))
            yield
            self.counted(user_id, +1)

    async def count(self, user_id: str) -> int:
        """The user's sessions, those in the trash included: read from the store once (again after
        ``COUNT_REFRESH_S`` on a store other nodes share), then kept by ``counted``."""
        hit = self._counts.get(user_id)
        now = time.monotonic()
        if hit is not None and (getattr(self.store, "link", None) is None or now - hit[1] < COUNT_REFRESH_S):
            return hit[0]
        cap = self.max_sessions + 1     # (a page of every live session and one of every deleted one)
        live, _ = await self.store.list(user_id, limit=cap)
        trash, _ = await self.store.list(user_id, limit=cap, deleted=True)
        n = len(live) + len(trash)
        self._counts[user_id] = (n, now)
        return n

    def counted(self, user_id: str, delta: int) -> None:
        """A session of the user made (+1) or purged (-1), when the count is known."""
        hit = self._counts.get(user_id)
        if hit is not None:
            self._counts[user_id] = (max(0, hit[0] + delta), hit[1])
