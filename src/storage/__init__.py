"""Conversation storage: JSON snapshot + journal per session, index, bounded LRU (docs/storage.md)."""
from .async_store import AsyncHistoryStore
from .config import StorageConfig
from .errors import (CorruptSession, InvalidArgument, InvalidSessionId, MessageTooLarge, NotFound,
                     StorageClosed, StorageConfigError, StorageError, StorageLocked)
from .errors import StorageIOError
from .ids import new_session_id, validate_session_id
from .pg.errors import StorageUnavailable
from .port import StoragePort, open_store
from .models import ChatMessage, Page, SearchHit, SessionRecord, SummaryRecord, ToolCall
from .store import HistoryStore

__all__ = [
    "AsyncHistoryStore", "ChatMessage", "CorruptSession", "HistoryStore", "InvalidArgument",
    "InvalidSessionId", "MessageTooLarge", "NotFound", "Page", "SearchHit", "SessionRecord",
    "StorageClosed", "StorageConfig", "StorageConfigError", "StorageError", "StorageLocked",
    "StorageIOError",
    "SummaryRecord", "ToolCall", "new_session_id", "validate_session_id",
    "StoragePort", "StorageUnavailable", "open_store",
]
