"""Long-term user memory in JSON files, the embedded default: ``UserFiles``, the ``DocBackend`` of
``server.memory.user_store.DocUserMemoryStore`` over one file per user, and ``JsonUserMemoryStore``.

One file per user (``<root>/<sha256(user)[:32]>.json``, the user id never becomes a path), written
atomically (temp file, fsync, rename, directory fsync), so a crash leaves the old or the new
document, never a torn one. A file that cannot be parsed is moved aside (``.corrupt``) and the user
starts empty. All file work runs in a worker thread; the store's lock per user orders the
read-modify-writes (the data directory belongs to one process: storage's lock).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, TypeVar

from storage.fsio import NotRegularFile, atomic_write, read_bytes

from server.memory.user_store import DocUserMemoryStore, UserDoc

log = logging.getLogger("nplt.memory")

T = TypeVar("T")


class UserFiles:
    """``DocBackend`` over one JSON file per user (see the module docstring). The data directory
    belongs to one process (storage's lock), so a save never conflicts: ``version`` is unused."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.on_change: Callable[[str | None], None] | None = None

    def _path(self, user_id: str) -> Path:
        return self.root / (hashlib.sha256(user_id.encode()).hexdigest()[:32] + ".json")

    def _read(self, user_id: str) -> UserDoc:
        path = self._path(user_id)
        try:
            return UserDoc.read(json.loads(read_bytes(str(path))), user_id)[1]   # (never through a link)
        except FileNotFoundError:
            return UserDoc()
        except (NotRegularFile, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("user memory file %s unreadable (%s): moved aside, starting empty", path, exc)
            os.replace(path, str(path) + ".corrupt")
            return UserDoc()

    def _write(self, user_id: str, doc: UserDoc) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        data = json.dumps(doc.to_json(user_id), ensure_ascii=False, indent=1).encode()
        atomic_write(str(self._path(user_id)), data)

    async def load(self, user_id: str) -> tuple[UserDoc, Any]:
        return await asyncio.to_thread(self._read, user_id), None

    async def save(self, user_id: str, doc: UserDoc, version: Any) -> bool:
        await asyncio.to_thread(self._write, user_id, doc)
        return True

    async def update(self, user_id: str, change: Callable[[UserDoc], tuple[UserDoc | None, T]]
                     ) -> tuple[UserDoc, Any, T]:
        doc, version = await self.load(user_id)       # the store's lock is the only writer's
        new, result = change(doc)
        if new is not None:
            await self.save(user_id, new, version)
        return (doc if new is None else new), version, result

    async def close(self) -> None:
        return None


class JsonUserMemoryStore(DocUserMemoryStore):
    """The embedded default: one JSON file per user under ``root``."""

    def __init__(self, root: str | os.PathLike, max_items: int = 200, max_cached: int = 256) -> None:
        super().__init__(UserFiles(root), max_items, max_cached)
