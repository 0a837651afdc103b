"""Long-term user memory storage: ``MemoryItem``, the ``UserMemoryStore`` interface, one user's
document (``UserDoc``) and ``DocUserMemoryStore``, which does the operations on documents kept by a
``DocBackend``: JSON files (``server.memory.user_files``, the embedded default) or one row per user
in PostgreSQL (``server.memory.user_store_pg``) when the history is there, so every node sees the
same memory.

An item is kept once per text and names every statement of it, (session, message) (``also``, at
most ``MAX_ITEM_STATEMENTS``): a clear, delete, purge or edit takes back its own statements, and the
item goes with its last one, so clearing one session does not forget what another still says.

Besides the items, a user's document keeps what makes forgetting durable (docs/memory.md,
"Forgetting"):

* ``learned``: per session, the highest message id distilled (written with the items it gave), so a
  restart or an evicted cache never distills the same messages again;
* ``forgotten``: tombstones ``[session id, message id, hash of the normalised text]`` of items the
  user forgot or a correction replaced; the same statement distilled again from the same message is
  not added back. An empty hash stands for every item of the message (an edit superseded it);
* ``replaced``: items a correction replaced ("... is db-2 now" after "... is db-1"), each with what
  replaced it ``[item id, session id, message id]`` (no item id: a statement that the value no
  longer holds). When that item or statement is taken back (its message edited, its session
  cleared, deleted or purged), the replaced item comes back, with the statements of its own that are
  left. Forgetting an item (``forget``, a request to forget) drops what it replaced for good;
* ``pending``: sessions being forgotten (a clear, delete or purge marks them *before* the history
  changes); a document loaded with pending sessions drops their statements at once, so a crash
  between the clear and the removal cannot bring them back;
* ``floors``: per session, the highest message id a clear, delete or purge took back ("cleared up
  to message N", ``ALL_MESSAGES`` for a purged session), written by ``forget_session`` and kept: an
  item of that session from a message at or below it is never added, on any node, so a learning
  that was still distilling a cleared message (another node's summary model, slower than the clear)
  cannot bring it back after the pending mark has ended.

The five lists are bounded by ``max_items`` entries each (the oldest go first), also as a document
is read (``UserDoc.read``'s ``max_items``, ``DocUserMemoryStore._cap``): a file written by hand or
under a higher ``max_items`` never has a change run over more (a WARNING names the user and how many
were dropped). A change over more than ``INLINE_CHANGE_ENTRIES`` entries runs in a worker thread.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any, AsyncIterator, Callable, Iterable, Protocol, TypeVar

from storage import StorageUnavailable

log = logging.getLogger("nplt.memory")

T = TypeVar("T")
#: a change of one user's document over more entries than this (items, tombstones, replaced items:
#: ``max_items`` set high) runs in a worker thread, so other users' requests are not held up meanwhile
INLINE_CHANGE_ENTRIES = 2_000
MAX_SAVE_TRIES = 20      # a locked update redone this many times (first documents racing): an error
#: statements (session, message) one item names at most (the newest are kept): the same fact said in
#: more sessions than this goes when the newest of them are cleared
MAX_ITEM_STATEMENTS = 16

#: the floor of a session that is gone for good (purged): every message of it is taken back
ALL_MESSAGES = 2 ** 62

Statement = tuple[str, int, str]          # (session id, message id, when)
ReplacedBy = tuple[str, str, int]         # (item id or "" for a statement alone, session id, message id)


@dataclass(frozen=True, slots=True)
class MemoryItem:
    """One durable fact or preference of a user, with where it came from: the first statement of it
    (``session_id``, ``message_id``, ``created_at``) and the others (``also``)."""
    id: str
    kind: str                 # "fact" | "preference"
    text: str
    session_id: str           # the session it was said in
    message_id: int           # the user message it was distilled from
    created_at: str           # ISO 8601 UTC
    source: str = "rules"     # "rules" | "model"
    also: tuple[Statement, ...] = ()     # the same text stated again elsewhere: (session, message, when)

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.also:
            d["also"] = [list(s) for s in self.also]
        else:
            del d["also"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> MemoryItem:
        also = tuple((str(s), int(m), str(t)) for s, m, t in d.get("also") or ())
        return cls(str(d["id"]), str(d["kind"]), str(d["text"]), str(d["session_id"]),
                   int(d["message_id"]), str(d["created_at"]), str(d.get("source", "rules")), also)

    def statements(self) -> list[Statement]:
        return [(self.session_id, self.message_id, self.created_at), *self.also]

    def sessions(self) -> set[str]:
        return {s for s, _, _ in self.statements()}

    def stated(self, statements: Iterable[Statement]) -> MemoryItem | None:
        """This item with these statements (one per message; the first names it, at most
        ``MAX_ITEM_STATEMENTS``, the newest), None when there are none."""
        each = list({(s, m): (s, m, t) for s, m, t in statements}.values())[-MAX_ITEM_STATEMENTS:]
        if not each:
            return None
        (session_id, message_id, created_at), *rest = each
        return replace(self, session_id=session_id, message_id=message_id, created_at=created_at, also=tuple(rest))


@dataclass(frozen=True, slots=True)
class Retraction:
    """A sentence of a user message that takes items back (``distill.takes_back``): every item that
    ``matches`` is removed, leaving tombstones. ``restorable``: a value that no longer holds ("... is
    not db-1 anymore"): what it removed comes back when its message is taken back; else a request to
    forget: what it removed (and what that had replaced) is gone for good."""
    session_id: str
    message_id: int
    matches: Callable[[MemoryItem], bool]
    restorable: bool = False


def new_item_id() -> str:
    return "m" + secrets.token_hex(6)


def dedupe_key(text: str) -> str:
    return " ".join(text.casefold().split()).rstrip(".。!！")


def _text_hash(text: str) -> str:
    return hashlib.sha256(dedupe_key(text).encode()).hexdigest()[:32]


def tombstone(item: MemoryItem) -> tuple[str, int, str]:
    """What stays of a forgotten item: its source and a hash of its normalised text (never the text)."""
    return item.session_id, item.message_id, _text_hash(item.text)


def tombstones(item: MemoryItem) -> list[tuple[str, int, str]]:
    """``tombstone`` of every statement of the item."""
    digest = _text_hash(item.text)
    return [(s, m, digest) for s, m, _ in item.statements()]


#: the hash of a message's tombstone: no item of that message is added (it was edited away)
WHOLE_MESSAGE = ""


class UserMemoryStore(Protocol):
    async def list(self, user_id: str) -> list[MemoryItem]: ...
    async def add(self, user_id: str, items: Iterable[MemoryItem | Retraction],
                  learned: tuple[str, int] | None = None,
                  key: Callable[[MemoryItem], str | None] | None = None) -> list[MemoryItem]: ...
    async def learned(self, user_id: str, session_id: str) -> int: ...
    async def forget(self, user_id: str, item_id: str) -> bool: ...
    async def forget_messages(self, user_id: str, session_id: str, message_ids: Iterable[int]) -> int: ...
    async def mark_forgetting(self, user_id: str, session_id: str) -> None: ...
    async def forget_session(self, user_id: str, session_id: str, upto: int | None = None) -> int: ...
    async def close(self) -> None: ...


@dataclass(slots=True)
class UserDoc:
    """One user's file: items, per-session learned positions, tombstones, sessions being forgotten,
    replaced items (with what replaced them), per-session floors of what a clear took back."""
    items: list[MemoryItem] = field(default_factory=list)
    learned: dict[str, int] = field(default_factory=dict)
    forgotten: list[tuple[str, int, str]] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    replaced: list[tuple[MemoryItem, ReplacedBy]] = field(default_factory=list)
    floors: dict[str, int] = field(default_factory=dict)

    def to_json(self, user_id: str) -> dict:
        out = {"user_id": user_id, "items": [i.to_dict() for i in self.items], "learned": self.learned,
               "forgotten": [list(t) for t in self.forgotten], "pending": self.pending,
               "replaced": [{"item": i.to_dict(), "by": list(by)} for i, by in self.replaced]}
        if self.floors:                       # (absent: a document an older server reads as before)
            out["floors"] = self.floors
        return out

    def cleared(self, session_id: str, message_id: int) -> bool:
        """The message is at or below its session's floor: a clear, delete or purge took it back."""
        return message_id <= self.floors.get(session_id, 0)

    @classmethod
    def from_json(cls, doc: dict) -> UserDoc:
        learned = {str(k): int(v) for k, v in (doc.get("learned") or {}).items()}
        forgotten = [(str(s), int(m), str(k)) for s, m, k in doc.get("forgotten") or ()]
        pending = [str(s) for s in doc.get("pending") or ()]
        items = [MemoryItem.from_dict(x) for x in doc["items"]]
        replaced = [(MemoryItem.from_dict(r["item"]), (str(r["by"][0]), str(r["by"][1]), int(r["by"][2])))
                    for r in doc.get("replaced") or ()]
        floors = {str(k): int(v) for k, v in (doc.get("floors") or {}).items()}
        loaded = cls(items, learned, forgotten, pending, replaced, floors)
        if not pending:
            return loaded
        left = set(pending)
        taken = take_back(loaded, lambda s, m: s in left)
        return loaded if taken is None else taken[0]

    def copy(self) -> UserDoc:
        return UserDoc(list(self.items), dict(self.learned), list(self.forgotten), list(self.pending),
                       list(self.replaced), dict(self.floors))

    @classmethod
    def read(cls, doc: Any, user_id: str | None = None, max_items: int | None = None) -> tuple[str, UserDoc]:
        """(its user id, the document) of a stored document (a file's JSON, a PostgreSQL row's),
        checked to be ``user_id``'s when given. ValueError, KeyError, TypeError or AttributeError
        when it is not a user memory document. ``max_items``: a document with more entries than that
        in a list (items, tombstones, replaced items, learned positions, floors: a file written by
        hand, or under a higher ``max_items``) keeps the newest, before they are parsed, with a
        WARNING naming the user and how many were dropped (``capped``)."""
        owner = doc["user_id"]
        if not isinstance(owner, str):
            raise TypeError("user_id is not a string")
        if user_id is not None and owner != user_id:
            raise ValueError("the document belongs to another user id")
        if max_items is not None:
            doc = capped(doc, owner, max_items)
        return owner, cls.from_json(doc)


_CAPPED = (("items", list), ("forgotten", list), ("replaced", list), ("learned", dict), ("floors", dict))


def over_max(doc: Any, max_items: int) -> bool:
    """A stored document (JSON) with more than ``max_items`` entries in a list or map that is kept
    to ``max_items`` (``capped``)."""
    return isinstance(doc, dict) and any(isinstance(doc.get(name), kind) and len(doc[name]) > max_items
                                         for name, kind in _CAPPED)


def capped(doc: dict, user_id: str, max_items: int) -> dict:
    """A stored document (JSON) with at most ``max_items`` entries in each of its lists and maps,
    the newest (the last); a WARNING names the user and what was dropped. The document itself when
    nothing is over."""
    if not over_max(doc, max_items):
        return doc
    dropped: dict[str, int] = {}
    out = dict(doc)
    for name, kind in _CAPPED:
        entries = doc.get(name)
        if isinstance(entries, kind) and len(entries) > max_items:
            dropped[name] = len(entries) - max_items
            out[name] = entries[-max_items:] if kind is list else dict(list(entries.items())[-max_items:])
    log.warning("user memory of user %r holds more than max_items (%d) entries: the oldest were dropped, "
                "the newest kept (%s)", user_id, max_items,
                ", ".join(f"{n} {name}" for name, n in dropped.items()))
    return out


def take_back(doc: UserDoc, gone: Callable[[str, int], bool]) -> tuple[UserDoc, int] | None:
    """``doc`` without the statements ``gone`` accepts (session id, message id) -- a clear, delete,
    purge or edit -- and how many items went; None when nothing changes. Each item, and each replaced
    item, loses those statements and goes with its last one. A replaced item comes back (its
    tombstones dropped) when what replaced it went now: an item, or a statement that a value no
    longer holds; a replaced item that went passes what replaced it on to the items it had replaced."""
    items: list[MemoryItem] = []
    went: set[str] = set()
    for item in doc.items:
        left = item.stated(st for st in item.statements() if not gone(st[0], st[1]))
        if left is None:
            went.add(item.id)
        else:
            items.append(left)
    heirs: dict[str, ReplacedBy] = {}          # a replaced item that went -> what had replaced it
    entries: list[tuple[MemoryItem, ReplacedBy]] = []
    for item, by in doc.replaced:
        left = item.stated(st for st in item.statements() if not gone(st[0], st[1]))
        if left is None:
            heirs[item.id] = by
        else:
            entries.append((left, by))
    back: list[MemoryItem] = []
    replaced: list[tuple[MemoryItem, ReplacedBy]] = []
    for item, by in entries:
        for _ in range(len(heirs)):
            if by[0] not in heirs:
                break
            by = heirs[by[0]]
        if by[0] in went or (not by[0] and gone(by[1], by[2])):
            back.append(item)
        else:
            replaced.append((item, by))
    known = {dedupe_key(i.text): n for n, i in enumerate(items)}
    for item in back:                          # (said again meanwhile: one item with both statements)
        n = known.get(dedupe_key(item.text))
        if n is None:
            known[dedupe_key(item.text)] = len(items)
            items.append(item)
        else:
            items[n] = items[n].stated(items[n].statements() + item.statements()) or items[n]
    if items == doc.items and replaced == doc.replaced:
        return None
    dead = {t for item in back for t in tombstones(item)}
    forgotten = [t for t in doc.forgotten if t not in dead]
    return UserDoc(items, dict(doc.learned), forgotten, list(doc.pending), replaced, dict(doc.floors)), len(went)


def _known_upto(doc: UserDoc, session_id: str) -> int:
    """The highest message id of ``session_id`` the document knows: its learned position, its
    statements (items and replaced items), its tombstones."""
    ids = [doc.learned.get(session_id, 0)]
    ids += [m for item in doc.items for s, m, _ in item.statements() if s == session_id]
    ids += [m for item, _ in doc.replaced for s, m, _ in item.statements() if s == session_id]
    ids += [m for s, m, _ in doc.forgotten if s == session_id]
    return max(ids)


def _without_replaced_by(replaced: list[tuple[MemoryItem, ReplacedBy]], ids: set[str]
                         ) -> list[tuple[MemoryItem, ReplacedBy]]:
    """``replaced`` without what the items ``ids`` replaced, what those had replaced, and so on (they
    were forgotten: nothing of them comes back)."""
    ids = set(ids)
    while True:
        dropped = {i.id for i, by in replaced if by[0] in ids}
        if not dropped:
            return replaced
        ids |= dropped
        replaced = [(i, by) for i, by in replaced if i.id not in dropped]


class DocBackend(Protocol):
    """Where the user documents live: ``load`` gives a user's document and its version (None: no
    document yet); ``save`` writes one if the stored version is still ``version`` (False: someone
    else wrote it meanwhile, nothing written). ``update`` applies ``change`` (document -> (the new
    document or None for no write, result)) to the stored document with no other write between its
    read and its write, and returns (the document now stored, its version, result); None only when
    another process created the user's first document meanwhile. ``on_change``: set by the store,
    called with a user id (or None: every user) when another process changed that user's document.

    A backend that can read the history may also have ``cleared_upto(session_id)`` (an awaitable
    int): the highest message id a clear, delete or purge of the session took back, as the history
    says it (``ALL_MESSAGES`` for a session that is gone); ``forget_session`` records it as the
    session's floor (``PgUserDocs``: the session's row on the same database)."""
    on_change: Callable[[str | None], None] | None

    async def load(self, user_id: str) -> tuple[UserDoc, Any]: ...
    async def save(self, user_id: str, doc: UserDoc, version: Any) -> bool: ...
    async def update(self, user_id: str, change: Callable[[UserDoc], tuple[UserDoc | None, T]]
                     ) -> tuple[UserDoc, Any, T] | None: ...
    async def close(self) -> None: ...


class _UserLock:
    """One user's lock and how many operations hold or await it (``DocUserMemoryStore._lock``)."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class DocUserMemoryStore:
    """``UserMemoryStore`` over a ``DocBackend``: each operation reads the user's document (cached,
    LRU), changes a copy and saves it; a save that finds the document changed by another process
    (another node on the same PostgreSQL) reloads it and does the operation again.

    ``max_items``: a user keeps at most this many items (the oldest go first). An item whose text
    is already known (case and spacing ignored) is not added again: the known item names this
    statement too.
    """

    def __init__(self, backend: DocBackend, max_items: int = 200, max_cached: int = 256) -> None:
        self.backend = backend
        self.max_items = max_items
        self.max_cached = max_cached                 # users whose documents stay in memory (LRU)
        self._cache: dict[str, tuple[UserDoc, Any]] = {}
        self._locks: dict[str, _UserLock] = {}       # users with an operation holding or awaiting their lock
        self._marked: dict[tuple[str, str], int] = {}   # (user, session) -> marks of this process not ended
        backend.on_change = self._changed_elsewhere

    def _changed_elsewhere(self, user_id: str | None) -> None:
        if user_id is None:
            self._cache.clear()
        else:
            self._cache.pop(user_id, None)

    @asynccontextmanager
    async def _lock(self, user_id: str) -> AsyncIterator[None]:
        """Hold the user's lock. It exists only while someone holds or waits for it: the last one
        out drops it, so the dictionary holds the users with an operation under way, not every user
        ever seen (one Lock each, never freed, before)."""
        entry = self._locks.get(user_id)
        if entry is None:
            entry = self._locks[user_id] = _UserLock()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if not entry.users and self._locks.get(user_id) is entry:
                del self._locks[user_id]

    async def _load(self, user_id: str) -> tuple[UserDoc, Any]:
        got = self._cache.pop(user_id, None)
        if got is None:
            doc, version = await self.backend.load(user_id)
            self._cap(user_id, doc)
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
        if left == doc.pending:
            return None
        done = doc.copy()
        done.pending = left
        return done

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

    def _cap(self, user_id: str, doc: UserDoc) -> UserDoc:
        """A document as a backend read it, trimmed to ``max_items`` (``_trim``) with a WARNING when
        it held more (a backend that does not cap while it reads, ``UserDoc.read``'s ``max_items``),
        so no change runs over more."""
        n = self.max_items
        over = {name: len(entries) - n for name, entries in (
            ("items", doc.items), ("forgotten", doc.forgotten), ("replaced", doc.replaced),
            ("learned", doc.learned), ("floors", doc.floors)) if len(entries) > n}
        if over:
            log.warning("user memory of user %r holds more than max_items (%d) entries: the oldest were "
                        "dropped, the newest kept (%s)", user_id, n,
                        ", ".join(f"{k} {name}" for name, k in over.items()))
            self._trim(doc)
        return doc

    def _trim(self, doc: UserDoc) -> UserDoc:
        n = self.max_items
        doc.items = doc.items[-n:]                   # (replaced items that came back may exceed it)
        doc.forgotten = doc.forgotten[-n:]
        doc.replaced = doc.replaced[-n:]
        while len(doc.learned) > n:
            doc.learned.pop(next(iter(doc.learned)))
        while len(doc.floors) > n:
            doc.floors.pop(next(iter(doc.floors)))
        return doc

    async def _update(self, user_id: str, change: Callable[[UserDoc], tuple[UserDoc | None, T]]) -> T:
        """Apply ``change`` (document -> (the new document or None for no write, result)) under the
        user's lock: on the cached document with a compare-and-set save, and when another process
        wrote meanwhile, once more with the stored document locked by the backend (no write gets
        in between). Redoing the optimistic save instead could lose every time to a node whose
        cached document spares it the read (seen: 20 losses in a row to a node adding items)."""
        async with self._lock(user_id):
            doc, version = await self._load(user_id)
            if len(doc.items) + len(doc.forgotten) + len(doc.replaced) > INLINE_CHANGE_ENTRIES:
                new, result = await asyncio.to_thread(change, doc)    # (the cached document is not changed)
            else:
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
        self._cap(user_id, doc)
        finished = self._finish_stopped(user_id, doc)
        new, result = change(doc if finished is None else finished)
        new = finished if new is None else new
        return (None if new is None else self._trim(new)), result

    async def list(self, user_id: str) -> list[MemoryItem]:
        async with self._lock(user_id):
            return list((await self._load(user_id))[0].items)

    async def learned(self, user_id: str, session_id: str) -> int:
        """The highest message id of ``session_id`` distilled so far, or taken back by a clear, delete
        or purge (its floor), when that is higher (0: none): a learning skips those messages."""
        async with self._lock(user_id):
            doc = (await self._load(user_id))[0]
            return max(doc.learned.get(session_id, 0), doc.floors.get(session_id, 0))

    async def add(self, user_id: str, items: Iterable[MemoryItem | Retraction],
                  learned: tuple[str, int] | None = None,
                  key: Callable[[MemoryItem], str | None] | None = None) -> list[MemoryItem]:
        """Store the items whose text is new (case and spacing ignored), not forgotten from the same
        message, not of a session being forgotten (``pending``) and not of a message a clear, delete or
        purge took back (at or below its session's floor: checked on the document this write
        replaces, so on every node); returns those added. An item
        whose text is known adds its statement (session, message) to the known item. A
        ``Retraction`` among them (in message order) removes the items it matches. ``learned`` =
        (session id, message id): that session's messages up to that id are distilled, recorded in
        the same write whenever ``items`` is not empty (a message that gave nothing is cheap to
        distill again: no write for it).

        ``key``: what an item is about (None: nothing in particular). An added item replaces the
        items with its key (a correction: "the DB host is db-2" after "... is db-1"); they leave
        tombstones, as if forgotten, and are kept as replaced, to come back if the correction is
        taken back (``take_back``)."""
        entries = list(items)

        def change(doc: UserDoc) -> tuple[UserDoc | None, list[MemoryItem]]:
            dead = set(doc.forgotten)
            forgetting = set(doc.pending)         # (a learning that ends after a clear began adds nothing of it)
            subjects: dict[str, str | None] = {}  # item id -> key(item), each item's once

            def about(item: MemoryItem) -> str | None:
                if item.id not in subjects:
                    subjects[item.id] = key(item) if key is not None else None
                return subjects[item.id]
            live, replaced, tombs = list(doc.items), list(doc.replaced), []
            new: set[str] = set()
            changed = False
            for entry in entries:
                if entry.session_id in forgetting or (entry.session_id, entry.message_id, WHOLE_MESSAGE) in dead \
                        or doc.cleared(entry.session_id, entry.message_id):
                    continue
                if isinstance(entry, Retraction):
                    gone = [i for i in live if entry.matches(i)]
                    live = [i for i in live if i not in gone]
                    tombs.extend(t for i in gone for t in tombstones(i))
                    if entry.restorable:
                        replaced.extend((i, ("", entry.session_id, entry.message_id)) for i in gone)
                    else:                     # forgotten: what they (or the match) replaced is gone too
                        ids = {i.id for i in gone} | {i.id for i, _ in replaced if entry.matches(i)}
                        kept = _without_replaced_by([(i, by) for i, by in replaced if i.id not in ids], ids)
                        changed |= len(kept) != len(replaced)
                        replaced = kept
                    changed |= bool(gone)
                    continue
                item = entry
                if tombstone(item) in dead:
                    continue
                text = dedupe_key(item.text)
                same = next((n for n, i in enumerate(live) if dedupe_key(i.text) == text), None)
                if same is not None:           # known: one more statement of it
                    more = live[same].stated(live[same].statements() + item.statements()) or live[same]
                    changed |= more != live[same]
                    live[same] = more
                    continue
                subject = about(item)
                if subject is not None:
                    gone = [i for i in live if about(i) == subject]
                    live = [i for i in live if i not in gone]
                    tombs.extend(t for i in gone for t in tombstones(i))
                    replaced.extend((i, (item.id, item.session_id, item.message_id)) for i in gone
                                    if (i.session_id, i.message_id) != (item.session_id, item.message_id))
                live.append(item)
                new.add(item.id)
                changed = True
            added = [i for i in live if i.id in new]
            moved = learned is not None and learned[1] > doc.learned.get(learned[0], 0)
            if not (changed or (moved and entries)):   # (also when all were known: forgetting one must hold)
                return None, added
            marks = dict(doc.learned)
            if learned is not None:
                sid, upto = learned
                marks.pop(sid, None)
                marks[sid] = max(upto, doc.learned.get(sid, 0))     # most recent last
            return UserDoc(live[-self.max_items:], marks, doc.forgotten + tombs, list(doc.pending), replaced,
                           dict(doc.floors)), added
        return await self._update(user_id, change)

    async def forget(self, user_id: str, item_id: str) -> bool:
        """Remove one item, leaving a tombstone of each of its statements so none of their messages
        gives it back; what it replaced is dropped for good."""
        def change(doc: UserDoc) -> tuple[UserDoc | None, bool]:
            gone = [i for i in doc.items if i.id == item_id]
            if not gone:
                return None, False
            done = doc.copy()
            done.items = [i for i in doc.items if i.id != item_id]
            done.forgotten = doc.forgotten + [t for i in gone for t in tombstones(i)]
            done.replaced = _without_replaced_by(doc.replaced, {item_id})
            return done, True
        return await self._update(user_id, change)

    async def forget_messages(self, user_id: str, session_id: str, message_ids: Iterable[int]) -> int:
        """Take back the statements of these messages of ``session_id`` (an edit supersedes them:
        ``take_back``); returns how many items went. Each message not yet recorded as learned leaves
        a tombstone, so a learning of it still under way adds nothing."""
        ids = set(message_ids)

        def change(doc: UserDoc) -> tuple[UserDoc | None, int]:
            taken = take_back(doc, lambda s, m: s == session_id and m in ids)
            done = doc.learned.get(session_id, 0)
            dead = set(doc.forgotten)
            tombs = [t for t in ((session_id, m, WHOLE_MESSAGE) for m in sorted(ids) if m > done) if t not in dead]
            if taken is None and not tombs:
                return None, 0
            new, n = taken if taken is not None else (doc.copy(), 0)
            new.forgotten = new.forgotten + tombs
            return new, n
        return await self._update(user_id, change)

    async def mark_forgetting(self, user_id: str, session_id: str) -> None:
        """Durably note that ``session_id`` is being forgotten (before a clear, delete or purge changes
        the history); ``forget_session`` ends it. A crash in between: the next load drops its statements."""
        key = (user_id, session_id)
        async with self._lock(user_id):
            self._marked[key] = self._marked.get(key, 0) + 1

        def change(doc: UserDoc) -> tuple[UserDoc | None, None]:
            if session_id in doc.pending:
                return None, None
            new = doc.copy()
            new.pending = doc.pending + [session_id]
            return new, None
        await self._update(user_id, change)

    async def forget_session(self, user_id: str, session_id: str, upto: int | None = None) -> int:
        """Take back every statement of ``session_id`` (clear, delete, purge: ``take_back``); returns
        how many items went. Its learned position stays: a restore of the cleared messages does not
        teach them again. The session's floor rises to ``upto`` (the highest message id the clear
        took back; None: what the backend's ``cleared_upto`` reads from the history, else the highest
        message id of the session the document knows), so a learning of a cleared message that ends
        later, on any node, adds nothing (``add``)."""
        key = (user_id, session_id)
        async with self._lock(user_id):
            marks = self._marked.pop(key, 0) - 1
            if marks > 0:                    # another clear of the session is still under way
                self._marked[key] = marks
        if upto is None:
            from_history = getattr(self.backend, "cleared_upto", None)
            if from_history is not None:
                upto = await from_history(session_id)

        def change(doc: UserDoc) -> tuple[UserDoc | None, int]:
            pending = doc.pending if marks > 0 else [s for s in doc.pending if s != session_id]
            floor = max(upto if upto is not None else _known_upto(doc, session_id), doc.floors.get(session_id, 0))
            taken = take_back(doc, lambda s, m: s == session_id)
            if taken is None and pending == doc.pending and floor == doc.floors.get(session_id, 0):
                return None, 0
            new, n = taken if taken is not None else (doc.copy(), 0)
            new.pending = list(pending)
            if floor:
                new.floors.pop(session_id, None)
                new.floors[session_id] = floor           # most recent last
            return new, n
        return await self._update(user_id, change)

    async def close(self) -> None:
        self._cache.clear()
        await self.backend.close()
