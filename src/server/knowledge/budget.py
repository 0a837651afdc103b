"""What one parse may still produce: the characters extracted so far against
``max_extracted_chars``, and the cancellation check every parser polls (``Budget``)."""
from __future__ import annotations

from typing import Callable

from protocol import ErrorCode
from server.errors import HandlerError
from server.knowledge.config import KnowledgeConfig
from server.knowledge.encodings import unsupported


class Cancelled(HandlerError):
    """The ingest was cancelled (its caller left, the knowledge base is closing)."""

    def __init__(self) -> None:
        super().__init__(ErrorCode.SHUTTING_DOWN, "ingest cancelled (the client left or the server is stopping)")


def _never() -> bool:
    return False


class Budget:
    """The characters a parse has produced so far, against ``max_extracted_chars``, and the
    cancellation check. ``add`` and ``check`` are called at every page / block / piece."""

    __slots__ = ("limit", "total", "cancelled")

    def __init__(self, cfg: KnowledgeConfig, cancelled: Callable[[], bool] | None = None) -> None:
        self.limit = cfg.max_extracted_chars
        self.total = 0
        self.cancelled = cancelled or _never

    def check(self) -> None:
        if self.cancelled():
            raise Cancelled()

    def add(self, n: int) -> None:
        self.total += n
        if self.total > self.limit:
            raise over_limit(self.total, self.limit)
        self.check()


def over_limit(total: int, limit: int) -> HandlerError:
    return unsupported(f"document holds over {limit} characters of text ({total} so far; "
                       f"limit max_extracted_chars = {limit})")
