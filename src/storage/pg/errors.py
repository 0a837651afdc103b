"""StorageUnavailable: the backing database cannot be reached (or did not answer in time)."""
from __future__ import annotations

from protocol import ErrorCode

from ..errors import StorageError


class StorageUnavailable(StorageError):
    """PostgreSQL is unreachable, restarting, or did not answer within the statement timeout.
    Nothing the failed call tried to write was acknowledged; retrying later is safe."""

    code = ErrorCode.STORAGE_UNAVAILABLE
