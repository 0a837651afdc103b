"""Storage exceptions. Each carries a ``code``: the protocol ``ErrorCode`` (docs/protocol.md §8) the
server forwards as is."""
from __future__ import annotations

from protocol import ErrorCode


class StorageError(Exception):
    """Base class of every error the store raises on purpose."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.code = ErrorCode(cls.code)     # a code that is not a protocol code fails at definition

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(StorageError, LookupError):
    """No such session (or purged), or no such message in it."""

    code = ErrorCode.NOT_FOUND


class CorruptSession(NotFound):
    """The session's snapshot could not be read; it was moved to ``<root>/quarantine/``."""


class InvalidSessionId(StorageError, ValueError):
    """A session id that is not ``s_YYYYMMDD_<12 lowercase hex>`` (never used as a path)."""

    code = ErrorCode.INVALID_MESSAGE


class InvalidArgument(StorageError, ValueError):
    """A bad argument: unknown role, empty query, bad cursor, unknown export format, ..."""

    code = ErrorCode.INVALID_MESSAGE


class MessageTooLarge(InvalidArgument):
    """A message whose JSON encoding exceeds ``max_message_bytes``."""

    code = ErrorCode.MESSAGE_TOO_LARGE


class StorageClosed(StorageError):
    """The store was closed."""

    code = ErrorCode.SHUTTING_DOWN


class StorageIOError(StorageError):
    """Reading or writing a session's files failed (disk full, I/O error, permissions). The change
    that raised it was not stored and is not visible; the store keeps working once I/O succeeds."""

    code = ErrorCode.STORAGE_ERROR


class StorageLocked(StorageError):
    """Another process (or another open store) already uses this root directory."""


class StorageConfigError(ValueError):
    """A ``[storage]`` config value is unknown, of the wrong type or out of range."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"[storage] {key}: {message}" if key else f"[storage] {message}")
        self.path = f"storage.{key}" if key else "storage"
        self.key = key
        self.message = message
