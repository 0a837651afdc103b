"""The models an agent offers: the configured ones first, then those the endpoint lists at /v1/models.

``offered()`` never waits: it returns the configured models merged with the last list fetched, and
when that list is older than ``ttl_s`` (or was never fetched) it starts one background refresh on
the running event loop. A refresh is bounded by ``timeout_s``; a failure is logged once and keeps
the previous list (a failed refresh is retried after ``ttl_s`` too). At most ``max_models`` ids
are taken from the endpoint.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable

log = logging.getLogger(__name__)

MAX_MODEL_ID_CHARS = 200


def merge_models(configured: list[str], listed: list[str], max_models: int) -> list[str]:
    """``configured`` in order, then the endpoint's ids not already there (sorted), deduplicated."""
    out = list(dict.fromkeys(m for m in configured if m))
    seen = set(out)
    extra = sorted({m for m in listed if isinstance(m, str) and m.strip() and len(m) <= MAX_MODEL_ID_CHARS}
                   - seen)
    return out + extra[:max(0, max_models)]


class ModelCatalog:
    """Cached model list. ``fetch`` returns the endpoint's model ids (e.g. through ``client.models.list()``)."""

    def __init__(self, configured: list[str], fetch: Callable[[], Awaitable[list[str]]] | None, *,
                 ttl_s: float = 300.0, timeout_s: float = 5.0, max_models: int = 200,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.configured = list(configured)
        self._fetch = fetch
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.max_models = max_models
        self._clock = clock
        self._listed: list[str] = []
        self._fetched_at: float | None = None
        self._task: asyncio.Task | None = None
        self.last_error: str | None = None

    def offered(self) -> list[str]:
        """The merged list now; starts a background refresh when the cache is stale."""
        if self._fetch is not None and self._stale() and self._task is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None:
                self._task = loop.create_task(self.refresh())
                self._task.add_done_callback(self._done)
        return merge_models(self.configured, self._listed, self.max_models)

    def _stale(self) -> bool:
        return self._fetched_at is None or self._clock() - self._fetched_at >= self.ttl_s

    def _done(self, task: asyncio.Task) -> None:
        if self._task is task:
            self._task = None

    async def refresh(self) -> list[str]:
        """Fetch the endpoint's list now (bounded by ``timeout_s``); the merged list after it."""
        if self._fetch is None:
            return list(self.configured)
        try:
            async with asyncio.timeout(self.timeout_s):
                listed = await self._fetch()
        except asyncio.CancelledError:
            raise
        except Exception as exc:   # noqa: BLE001 - any failure only means "no extra models"
            error = f"{type(exc).__name__}: {exc}"[:200] if str(exc) else type(exc).__name__
            if error != self.last_error:
                log.warning("model list of the endpoint not available (%s); offering the configured models", error)
            self.last_error = error
        else:
            self._listed = [m for m in listed if isinstance(m, str)]
            self.last_error = None
        self._fetched_at = self._clock()
        return merge_models(self.configured, self._listed, self.max_models)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def ids_of(page: Any) -> list[str]:
    """The model ids of an SDK ``models.list()`` page."""
    return [str(getattr(m, "id", "")) for m in getattr(page, "data", None) or ()]
