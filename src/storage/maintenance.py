"""The maintenance thread: periodic index writes, idle eviction and retried LRU trims."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("storage")


class Maintenance:
    """Runs ``save_index`` at most every ``index_s`` and ``evict`` every tick, until ``close``."""

    def __init__(self, *, tick_s: float, index_s: float, save_index: Callable[[], None],
                 evict: Callable[[float], None]) -> None:
        self._tick = min(tick_s, index_s)
        self._index_s = index_s
        self._save_index = save_index
        self._evict = evict
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="storage-maintenance", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_index = time.monotonic() + self._index_s
        while not self._stop.wait(self._tick):
            try:
                now = time.monotonic()
                if now >= next_index:
                    self._save_index()
                    next_index = now + self._index_s
                self._evict(now)
            except Exception:
                log.exception("storage: maintenance step failed")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
