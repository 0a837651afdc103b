"""Long-term user memory storage: ``MemoryItem``, the ``UserMemoryStore`` interface, one user's
document (``UserDoc``) and ``DocUserMemoryStore``, which does the operations on documents kept by a
``DocBackend``: JSON files (``server.memory.user_files``, the embedded default) or one row per user
in PostgreSQL (``server.memory.user_store_pg``) when the history is there, so every node sees the
same memory.

Besides the items, a user's document keeps what makes forgetting durable (docs/memory.md,
"Forgetting"):

* ``learned``: per session, the highest message id distilled (written with the items it gave), so a
  restart or an evicted cache never distills the same messages again;
* ``forgotten``: tombstones ``[session id, message id, hash of the normalised text]`` of items the
  user forgot or a correction replaced; the same statement distilled again from the same message is
  not added back. An empty hash stands for every item of the message (an edit superseded it);
* ``pending``: sessions being forgotten (a clear, delete or purge marks them *before* the history
  changes); a document loaded with pending sessions drops their items at once, so a crash between
  the clear and the removal cannot bring them back.

The three lists are bounded by ``max_items`` entries each (the oldest go first).
"""
from __future__ import annotations

import asyncio
import hashlib
import secrets
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Protocol, TypeVar

from storage import StorageUnavailable

T = TypeVar("T")
MAX_SAVE_TRIES = 20      # a locked update redone this many times (first documents racing): an error


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


def tombstone(item: MemoryItem) -> tuple[str, int, str]:
    """What stays of a forgotten item: its source and a hash of its normalised text (never the text)."""
    return item.session_id, item.message_id, hashlib.sha256(dedupe_key(item.text).encode()).hexdigest()[:32]


#: the hash of a message's tombstone: no item of that message is added (it was edited away)
WHOLE_MESSAGE = ""


class UserMemoryStore(Protocol):
    async def list(self, user_id: str) -> list[MemoryItem]: ...
    async def add(self, user_id: str, items: Iterable[MemoryItem], learned: tuple[str, int] | None = None,
                  key: Callable[[MemoryItem], str | None] | None = None) -> list[MemoryItem]: ...
    async def learned(self, user_id: str, session_id: str) -> int: ...
    async def forget(self, user_id: str, item_id: str) -> bool: ...
    async def forget_messages(self, user_id: str, session_id: str, message_ids: Iterable[int]) -> int: ...
    async def mark_forgetting(self, user_id: str, session_id: str) -> None: ...
    async def forget_session(self, user_id: str, session_id: str) -> int: ...
    async def close(self) -> None: ...


@dataclass(slots=True)
class UserDoc:
    """One user's file: items, per-session learned positions, tombstones, sessions being forgotten."""
    items: list[MemoryItem] = field(default_factory=list)
    learned: dict[str, int] = field(default_factory=dict)
    forgotten: list[tuple[str, int, str]] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)

    def to_json(self, user_id: str) -> dict:
        return {"user_id": user_id, "items": [i.to_dict() for i in self.items], "learned": self.learned,
                "forgotten": [list(t) for t in self.forgotten], "pending": self.pending}

    @classmethod
    def from_json(cls, doc: dict) -> UserDoc:
        learned = {str(k): int(v) for k, v in (doc.get("learned") or {}).items()}
        forgotten = [(str(s), int(m), str(k)) for s, m, k in doc.get("forgotten") or ()]
        pending = [str(s) for s in doc.get("pending") or ()]
        items = [MemoryItem.from_dict(x) for x in doc["items"]]
        return cls([i for i in items if i.session_id not in pending], learned, forgotten, pending)

    @classmethod
    def read(cls, doc: Any, user_id: str | None = None) -> tuple[str, UserDoc]:
        """(its user id, the document) of a stored document (a file's JSON, a PostgreSQL row's),
        checked to be ``user_id``'s when given. ValueError, KeyError, TypeError or AttributeError
        when it is not a user memory document."""
        owner = doc["user_id"]
        if not isinstance(owner, str):
            raise TypeError("user_id is not a string")
        if user_id is not None and owner != user_id:
            raise ValueError("the document belongs to another user id")
        return owner, cls.from_json(doc)


class DocBackend(Protocol):
    """Where the user documents live: ``load`` gives a user's document and its version (None: no
    document yet); ``save`` writes one if the stored version is still ``version`` (False: someone
    else wrote it meanwhile, nothing written). ``update`` applies ``change`` (document -> (the new
    document or None for no write, result)) to the stored document with no other write between its
    read and its write, and returns (the document now stored, its version, result); None only when
    another process created the user's first document meanwhile. ``on_change``: set by the store,
    called with a user id (or None: every user) when another process changed that user's document."""
    on_change: Callable[[str | None], None] | None

    async def load(self, user_id: str) -> tuple[UserDoc, Any]: ...
    async def save(self, user_id: str, doc: UserDoc, version: Any) -> bool: ...
    async def update(self, user_id: str, change: Callable[[UserDoc], tuple[UserDoc | None, T]]
                     ) -> tuple[UserDoc, Any, T] | None: ...
    async def close(self) -> None: ...


class DocUserMemoryStore:
    """``UserMemoryStore`` over a ``DocBackend``: each operation reads the user's document (cached,
    LRU), changes a copy and saves it; a save that finds the document changed by another process
    (another node on the same PostgreSQL) reloads it and does the operation again.

    ``max_items``: a user keeps at most this many items (the oldest go first). An item whose text
    is already known (case and spacing ignored) is not added again.
    """

    def __init__(self, backend: DocBackend, max_items: int = 200, max_cached: int = 256) -> None:
        self.backend = backend
        self.max_items = max_items
        self.max_cached = max_cached                 # users whose documents stay in memory (LRU)
        self._cache: dict[str, tuple[UserDoc, Any]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._marked: dict[tuple[str, str], int] = {}   # (user, session) -> marks of this process not ended
        backend.on_change = self._changed_elsewhere

    def _changed_elsewhere(self, user_id: str | None) -> None:
        if user_id is None:
            self._cache.clear()
        else:
            self._cache.pop(user_id, None)

    def _lock(self, user_id: str) -> asyncio.Lock:
        return self._locks.setdefault(user_id, asyncio.Lock())

    async def _load(self, user_id: str) -> tuple[UserDoc, Any]:
        got = self._cache.pop(user_id, None)
        if got is None:
            doc, version = await self.backend.load(user_id)
            changed = self._finish_stopped(user_id, doc)
            if changed is not None:
                got = await self._save(user_id, changed, version)
                if got is None:             # changed meanwhile: the next load sees it
                    return doc, version
            else:
                got = (doc, version)
        self._remember(user_id, got)
        return got

    def _remember(self, user_id: str, got: tuple[UserDoc, Any]) -> None:
        """Cache a user's (document, version) as the most recently used (LRU of ``max_cached``)."""
        self._cache.pop(user_id, None)
        self._cache[user_id] = got                   # most recent last
        while len(self._cache) > self.max_cached:
            self._cache.pop(next(iter(self._cache)))

    def _finish_stopped(self, user_id: str, doc: UserDoc) -> UserDoc | None:
        """A freshly read ``doc`` without the sessions marked pending by a process that stopped before
        finishing their clear (their items are already left out: ``UserDoc.from_json``); None when
        there are none."""
        left = [s for s in doc.pending if (user_id, s) in self._marked]
        return None if left == doc.pending else UserDoc(doc.items, doc.learned, doc.forgotten, left)

    async def _save(self, user_id: str, doc: UserDoc, version: Any) -> tuple[UserDoc, Any] | None:
        """Write ``doc`` (a new object: the cached one changes only once it is stored); None when the
        stored document is no longer ``version`` (nothing written, the cache entry dropped)."""
        self._trim(doc)
        new_version = (version or 0) + 1
        if not await self.backend.save(user_id, doc, version):
            self._cache.pop(user_id, None)
            return None
        self._cache[user_id] = (doc, new_version)
        return doc, new_version

    def _trim(self, doc: UserDoc) -> UserDoc:
        n = self.max_items
        doc.forgotten = doc.forgotten[-n:]
        while len(doc.learned) > n:
            doc.learned.pop(next(iter(doc.learned)))
        return doc

    async def _update(self, user_id: str, change: Callable[[UserDoc], tuple[UserDoc | None, T]]) -> T:
        """Apply ``change`` (document -> (the new document or None for no write, result)) under the
        user's lock: on the cached document with a compare-and-set save, and when another process
        wrote meanwhile, once more with the stored document locked by the backend (no write gets
        in between). Redoing the optimistic save instead could lose every time to a node whose
        cached document spares it the read (seen: 20 losses in a row to a node adding items)."""
        async with self._lock(user_id):
            doc, version = await self._load(user_id)
            new, result = change(doc)
            if new is None or await self._save(user_id, new, version) is not None:
                return result
            for _ in range(MAX_SAVE_TRIES):
                got = await self.backend.update(user_id, lambda d: self._settled(user_id, d, change))
                if got is not None:
                    doc, version, result = got
                    self._remember(user_id, (doc, version))
                    return result
        raise StorageUnavailable(f"user memory of one user was created {MAX_SAVE_TRIES} times during one update")

    def _settled(self, user_id: str, doc: UserDoc, change: Callable[[UserDoc], tuple[UserDoc | None, T]]
                 ) -> tuple[UserDoc | None, T]:
        """``change`` of a freshly read document, after what ``_load`` does to one (sessions left
        pending by a process that stopped are done), trimmed as ``_save`` does."""
        finished = self._finish_stopped(user_id, doc)
        new, result = change(doc if finished is None else finished)
        new = finished if new is None else new
        return (None if new is None else self._trim(new)), result

    async def list(self, user_id: str) -> list[MemoryItem]:
        async with self._lock(user_id):
            return list((await self._load(user_id))[0].items)

    async def learned(self, user_id: str, session_id: str) -> int:
        """The highest message id of ``session_id`` distilled so far (0: none)."""
        async with self._lock(user_id):
            return (await self._load(user_id))[0].learned.get(session_id, 0)

    async def add(self, user_id: str, items: Iterable[MemoryItem], learned: tuple[str, int] | None = None,
                  key: Callable[[MemoryItem], str | None] | None = None) -> list[MemoryItem]:
        """Store the items whose text is new (case and spacing ignored), not forgotten from the same
        message and not of a session being forgotten (``pending``); returns those added. ``learned`` = (session id, message id): that session's
        messages up to that id are distilled, recorded in the same write whenever ``items`` is not
        empty (a message that gave nothing is cheap to distill again: no write for it).

        ``key``: what an item is about (None: nothing in particular). An added item replaces the
        items with its key (a correction: "the DB host is db-2" after "... is db-1"); they leave
        tombstones, as if forgotten."""
        items = list(items)

        def change(doc: UserDoc) -> tuple[UserDoc | None, list[MemoryItem]]:
            known = {dedupe_key(i.text) for i in doc.items}
            dead = set(doc.forgotten)
            forgetting = set(doc.pending)         # (a learning that ends after a clear began adds nothing of it)
            subjects: dict[str, str | None] | None = None     # item id -> key(item), each item's once
            kept, new, tombs = list(doc.items), [], []
            for item in items:
                text_key = dedupe_key(item.text)
                if text_key in known or tombstone(item) in dead or item.session_id in forgetting or \
                        (item.session_id, item.message_id, WHOLE_MESSAGE) in dead:
                    continue
                subject = key(item) if key is not None else None
                if subject is not None:
                    if subjects is None:
                        subjects = {i.id: key(i) for i in kept}          # type: ignore[misc]
                    gone = {i.id for i in kept + new if subjects.get(i.id) == subject}
                    if gone:
                        tombs.extend(tombstone(i) for i in kept if i.id in gone)
                        known -= {dedupe_key(i.text) for i in kept + new if i.id in gone}
                        kept = [i for i in kept if i.id not in gone]
                        new = [i for i in new if i.id not in gone]
                    subjects[item.id] = subject
                known.add(text_key)
                new.append(item)
            moved = learned is not None and learned[1] > doc.learned.get(learned[0], 0)
            if not (new or (moved and items)):      # (also when all were known: forgetting one must hold)
                return None, new
            marks = dict(doc.learned)
            if learned is not None:
                sid, upto = learned
                marks.pop(sid, None)
                marks[sid] = max(upto, doc.learned.get(sid, 0))     # most recent last
            return UserDoc((kept + new)[-self.max_items:], marks, doc.forgotten + tombs, list(doc.pending)), new
        return await self._update(user_id, change)

    async def forget(self, user_id: str, item_id: str) -> bool:
        """Remove one item, leaving a tombstone so its message never gives it back."""
        def change(doc: UserDoc) -> tuple[UserDoc | None, bool]:
            gone = [i for i in doc.items if i.id == item_id]
            if not gone:
                return None, False
            tombs = doc.forgotten + [tombstone(i) for i in gone]
            return UserDoc([i for i in doc.items if i.id != item_id], dict(doc.learned), tombs,
                           list(doc.pending)), True
        return await self._update(user_id, change)

    async def forget_messages(self, user_id: str, session_id: str, message_ids: Iterable[int]) -> int:
        """Remove the items distilled from these messages of ``session_id`` (an edit supersedes them);
        returns how many. Each message not yet recorded as learned leaves a tombstone, so a learning
        of it still under way adds nothing."""
        ids = set(message_ids)

        def change(doc: UserDoc) -> tuple[UserDoc | None, int]:
            kept = [i for i in doc.items if not (i.session_id == session_id and i.message_id in ids)]
            done = doc.learned.get(session_id, 0)
            dead = set(doc.forgotten)
            tombs = [t for t in ((session_id, m, WHOLE_MESSAGE) for m in sorted(ids) if m > done) if t not in dead]
            if len(kept) == len(doc.items) and not tombs:
                return None, 0
            return (UserDoc(kept, dict(doc.learned), doc.forgotten + tombs, list(doc.pending)),
                    len(doc.items) - len(kept))
        return await self._update(user_id, change)

    async def mark_forgetting(self, user_id: str, session_id: str) -> None:
        """Durably note that ``session_id`` is being forgotten (before a clear, delete or purge changes
        the history); ``forget_session`` ends it. A crash in between: the next load drops its items."""
        key = (user_id, session_id)
        async with self._lock(user_id):
            self._marked[key] = self._marked.get(key, 0) + 1

        def change(doc: UserDoc) -> tuple[UserDoc | None, None]:
            if session_id in doc.pending:
                return None, None
            return UserDoc(list(doc.items), dict(doc.learned), list(doc.forgotten), doc.pending + [session_id]), None
        await self._update(user_id, change)

    async def forget_session(self, user_id: str, session_id: str) -> int:
        """Remove every item distilled from ``session_id`` (clear, purge); returns how many. Its
        learned position stays: a restore of the cleared messages does not teach them again."""
        key = (user_id, session_id)
        async with self._lock(user_id):
            marks = self._marked.pop(key, 0) - 1
            if marks > 0:                    # another clear of the session is still under way
                self._marked[key] = marks

        def change(doc: UserDoc) -> tuple[UserDoc | None, int]:
            pending = doc.pending if marks > 0 else [s for s in doc.pending if s != session_id]
            kept = [i for i in doc.items if i.session_id != session_id]
            if len(kept) == len(doc.items) and pending == doc.pending:
                return None, 0
            return UserDoc(kept, dict(doc.learned), list(doc.forgotten), list(pending)), len(doc.items) - len(kept)
        return await self._update(user_id, change)

    async def close(self) -> None:
        self._cache.clear()
        await self.backend.close()
