"""The storage port: the async conversation-store API the server uses, and ``open_store`` that opens
the backend a StorageConfig names.

Two backends implement it: AsyncHistoryStore (JSON snapshot + journal files under ``root``, the
default) and PgHistoryStore (PostgreSQL through asyncpg, when ``url`` is set; docs/storage.md).
The PostgreSQL code, and asyncpg, are imported only when ``url`` is set.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from .config import StorageConfig
from .errors import StorageConfigError
from .models import ChatMessage, EncodedPage, Page, SearchHit, SessionRecord, SummaryRecord, ToolCall


@runtime_checkable
class StoragePort(Protocol):
    """What the server needs from a conversation store. Every method may raise a StorageError
    (NotFound, InvalidArgument, MessageTooLarge, StorageClosed, StorageUnavailable, ...)."""

    async def create(self, user_id: str, title: str | None = None, model: str | None = None) -> SessionRecord: ...

    async def get(self, session_id: str) -> SessionRecord: ...

    async def list(self, user_id: str, *, before: str | None = None, limit: int = 50,
                   deleted: bool = False) -> tuple[list[SessionRecord], str | None]: ...

    async def records(self, session_ids: Iterable[str]) -> dict[str, SessionRecord]: ...

    async def rename(self, session_id: str, title: str, *, auto: bool = False) -> SessionRecord: ...

    async def set_model(self, session_id: str, model: str | None) -> SessionRecord: ...

    async def delete(self, session_id: str) -> SessionRecord: ...

    async def restore(self, session_id: str) -> SessionRecord: ...

    async def set_system_prompt(self, session_id: str, prompt: str | None) -> SessionRecord: ...

    async def undelete(self, session_id: str) -> SessionRecord: ...

    async def purge(self, session_id: str) -> None: ...

    async def clear(self, session_id: str, *, purge: bool = False) -> int: ...

    # ``fence``: the id of the user message the appended answer belongs to. PostgreSQL stores it only
    # if the session is still as that turn left it (not deleted or cleared since, no message stored
    # after ``fence`` but superseded ones), checked in the same statement, else raises a StorageError
    # with code STORAGE_UNAVAILABLE (``storage.pg.appends.SessionMoved``), nothing stored. The JSON
    # backend (one node: its turns of a session run one at a time in this process) ignores it.
    async def append(self, session_id: str, role: str, content: str, *, tool_calls: Iterable[ToolCall | dict] = (),
                     metadata: dict[str, Any] | None = None, timestamp: str | None = None,
                     fence: int | None = None) -> ChatMessage: ...

    async def update(self, session_id: str, message: ChatMessage) -> ChatMessage: ...

    async def page(self, session_id: str, before: int | None = None, limit: int = 50) -> Page: ...

    async def page_encoded(self, session_id: str, before: int | None = None, limit: int = 50) -> EncodedPage: ...

    async def messages(self, session_id: str, *, after_id: int = 0) -> list[ChatMessage]: ...

    async def search(self, user_id: str, query: str, *, session_id: str | None = None,
                     limit: int = 20) -> list[SearchHit]: ...

    async def export(self, session_id: str, fmt: str, model: str | None = None, *,
                     max_bytes: int | None = None) -> str: ...

    async def add_summary(self, session_id: str, summary: SummaryRecord) -> SessionRecord: ...

    async def close(self) -> None: ...


async def open_store(config: StorageConfig) -> StoragePort:
    """The backend ``config`` selects: PostgreSQL when ``config.url`` is set, else the JSON files
    under ``config.root``. Opening PostgreSQL applies pending schema migrations."""
    if config.url:
        try:
            from .pg.store import PgHistoryStore   # asyncpg is loaded only here
        except ModuleNotFoundError as exc:
            if exc.name != "asyncpg":
                raise
            raise StorageConfigError("url", "the PostgreSQL backend needs asyncpg: "
                                     "pip install 'nplt-assistant[pg]'") from None
        return await PgHistoryStore.open(config)
    from .async_store import AsyncHistoryStore
    return await AsyncHistoryStore.open(config)
