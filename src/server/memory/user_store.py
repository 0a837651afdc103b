"""Long-term user memory storage: the ``UserMemoryStore`` interface and its JSON-file backend.

One file per user (``<root>/<sha256(user)[:32]>.json``, the user id never becomes a path), written
atomically (temp file, fsync, rename, directory fsync), so a crash leaves the old or the new list,
never a torn one. A file that cannot be parsed is moved aside (``.corrupt``) and the user starts
empty. All file work runs in a worker thread; one lock per user orders the read-modify-writes.
A PostgreSQL table can implement the same five methods (``list``, ``add``, ``forget``,
``forget_session``, ``close``).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Protocol

from storage.fsio import atomic_write

log = logging.getLogger("nplt.memory")


@dataclass(frozen=True, slots=True)
class MemoryItem:
    """One durable fact or preference of a user, with where it came from."""
    id: str
    kind: str                 # "fact" | "preference"
    text: str
    session_id: str           # the session it was said in
    message_id: int           # the user message it was distilled from
    created_at: str           # ISO 8601 UTC
    source: str = "rules"     # "rules" | "model"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> MemoryItem:
        return cls(str(d["id"]), str(d["kind"]), str(d["text"]), str(d["session_id"]),
                   int(d["message_id"]), str(d["created_at"]), str(d.get("source", "rules")))


def new_item_id() -> str:
    return "m" + secrets.token_hex(6)


def dedupe_key(text: str) -> str:
    return " ".join(text.casefold().split()).rstrip(".。!！")


class UserMemoryStore(Protocol):
    async def list(self, user_id: str) -> list[MemoryItem]: ...
    async def add(self, user_id: str, items: Iterable[MemoryItem]) -> list[MemoryItem]: ...
    async def forget(self, user_id: str, item_id: str) -> bool: ...
    async def forget_session(self, user_id: str, session_id: str) -> int: ...
    async def close(self) -> None: ...


class JsonUserMemoryStore:
    """``UserMemoryStore`` over one JSON file per user (see the module docstring).

    ``max_items``: a user keeps at most this many items (the oldest go first). An item whose text
    is already known (case and spacing ignored) is not added again.
    """

    def __init__(self, root: str | os.PathLike, max_items: int = 200, max_cached: int = 256) -> None:
        self.root = Path(root)
        self.max_items = max_items
        self.max_cached = max_cached                 # users whose items stay in memory (LRU)
        self._cache: dict[str, list[MemoryItem]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def _path(self, user_id: str) -> Path:
        return self.root / (hashlib.sha256(user_id.encode()).hexdigest()[:32] + ".json")

    def _lock(self, user_id: str) -> asyncio.Lock:
        return self._locks.setdefault(user_id, asyncio.Lock())

    def _read(self, user_id: str) -> list[MemoryItem]:
        path = self._path(user_id)
        try:
            doc = json.loads(path.read_bytes())
            if doc.get("user_id") != user_id:
                raise ValueError("file belongs to another user id")
            return [MemoryItem.from_dict(d) for d in doc["items"]]
        except FileNotFoundError:
            return []
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("user memory file %s unreadable (%s): moved aside, starting empty", path, exc)
            os.replace(path, str(path) + ".corrupt")
            return []

    def _write(self, user_id: str, items: list[MemoryItem]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"user_id": user_id, "items": [i.to_dict() for i in items]},
                          ensure_ascii=False, indent=1).encode()
        atomic_write(str(self._path(user_id)), data)

    async def _load(self, user_id: str) -> list[MemoryItem]:
        items = self._cache.pop(user_id, None)
        if items is None:
            items = await asyncio.to_thread(self._read, user_id)
        self._cache[user_id] = items                 # most recent last
        while len(self._cache) > self.max_cached:
            self._cache.pop(next(iter(self._cache)))
        return items

    async def _save(self, user_id: str, items: list[MemoryItem]) -> None:
        await asyncio.to_thread(self._write, user_id, items)
        self._cache[user_id] = items

    async def list(self, user_id: str) -> list[MemoryItem]:
        async with self._lock(user_id):
            return list(await self._load(user_id))

    async def add(self, user_id: str, items: Iterable[MemoryItem]) -> list[MemoryItem]:
        """Store the items whose text is new (case and spacing ignored); returns those added."""
        async with self._lock(user_id):
            current = await self._load(user_id)
            known = {dedupe_key(i.text) for i in current}
            new = []
            for item in items:
                key = dedupe_key(item.text)
                if key not in known:
                    known.add(key)
                    new.append(item)
            if new:
                await self._save(user_id, (current + new)[-self.max_items:])
        return new

    async def forget(self, user_id: str, item_id: str) -> bool:
        async with self._lock(user_id):
            current = await self._load(user_id)
            kept = [i for i in current if i.id != item_id]
            if len(kept) == len(current):
                return False
            await self._save(user_id, kept)
            return True

    async def forget_session(self, user_id: str, session_id: str) -> int:
        """Remove every item distilled from ``session_id`` (clear, purge); returns how many."""
        async with self._lock(user_id):
            current = await self._load(user_id)
            kept = [i for i in current if i.session_id != session_id]
            if len(kept) != len(current):
                await self._save(user_id, kept)
            return len(current) - len(kept)

    async def close(self) -> None:
        self._cache.clear()
