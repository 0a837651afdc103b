"""Long-term user memory in JSON files, the embedded default: ``UserFiles``, the ``DocBackend`` of
``server.memory.user_store.DocUserMemoryStore`` over one file per user, and ``JsonUserMemoryStore``.

One file per user (``<root>/<sha256(user)[:32]>.json``, the user id never becomes a path), written
atomically (temp file, fsync, rename, directory fsync), so a crash leaves the old or the new
document, never a torn one. A file that cannot be parsed is moved aside (``set_aside``:
``<name>.corrupt.<UTC timestamp>[.<n>]``, never overwriting an earlier one) and the user starts
empty. A file with more than ``max_items`` entries in a list is cut to the newest as it is read
(``UserDoc.read``, a WARNING) and written back so cut, once. All file work runs in a worker thread;
the store's lock per user orders the read-modify-writes (the data directory belongs to one process:
storage's lock).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, TypeVar

from storage.fsio import NotRegularFile, atomic_write, fsync_dir, read_bytes

from server.memory.user_store import DocUserMemoryStore, UserDoc, over_max

log = logging.getLogger("nplt.memory")

T = TypeVar("T")

#: what ``set_aside`` puts between a file's name and the time it was set aside
CORRUPT_SUFFIX = ".corrupt"


def set_aside(path: str) -> str:
    """Move the unreadable file ``path`` (a symbolic link as the link itself: its target is never
    touched) to ``<path>.corrupt.<UTC timestamp>[.<n>]`` beside it, never over an existing name
    (as the history store's ``quarantine/``), and return that name. One process owns the directory
    (storage's lock) and the store's lock per user orders the reads of one file, so nothing else
    takes the name between the check and the rename."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    base = f"{path}{CORRUPT_SUFFIX}.{stamp}"
    dest, n = base, 1
    while os.path.lexists(dest):
        dest, n = f"{base}.{n}", n + 1
    os.replace(path, dest)
    fsync_dir(os.path.dirname(path) or ".")
    return dest


class UserFiles:
    """``DocBackend`` over one JSON file per user (see the module docstring). The data directory
    belongs to one process (storage's lock), so a save never conflicts: ``version`` is unused."""

    def __init__(self, root: str | os.PathLike, max_items: int | None = None) -> None:
        self.root = Path(root)
        self.max_items = max_items          # a file with more is cut to the newest as it is read
        self.on_change: Callable[[str | None], None] | None = None

    def _path(self, user_id: str) -> Path:
        return self.root / (hashlib.sha256(user_id.encode()).hexdigest()[:32] + ".json")

    def _read(self, user_id: str) -> UserDoc:
        path = self._path(user_id)
        try:
            raw = json.loads(read_bytes(str(path)))                           # (never through a link)
            doc = UserDoc.read(raw, user_id, self.max_items)[1]
        except FileNotFoundError:
            return UserDoc()
        except (NotRegularFile, ValueError, KeyError, TypeError, AttributeError) as exc:
            dest = set_aside(str(path))
            log.warning("user memory file %s unreadable (%s): moved to %s, starting empty", path, exc, dest)
            return UserDoc()
        if self.max_items is not None and over_max(raw, self.max_items):
            try:                                # cut once: the next read does not parse it all again
                self._write(user_id, doc)
            except OSError as exc:
                log.warning("user memory file %s: writing it with the newest max_items entries failed (%s)",
                            path, exc)
        return doc

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
        super().__init__(UserFiles(root, max_items), max_items, max_cached)
