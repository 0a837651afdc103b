"""``index.json``: one record per session (no summaries) so listing never opens history files.

Each entry also stores ``files`` = [snapshot inode, snapshot size, snapshot mtime_ns, journal size]
as they were when the entry was last updated. At startup an entry whose ``files`` differ from what
``stat`` reports now is stale and is rebuilt from that session's files; a missing or corrupt index
is rebuilt from all of them (see recovery.py). An index.json that is not a regular file (a
directory, a symbolic link, a FIFO) is moved to quarantine/ first, so the rebuilt one can be written.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any

import orjson

from .errors import InvalidArgument, InvalidSessionId
from .fsio import NotRegularFile, atomic_write, quarantine, read_bytes
from .ids import validate_session_id
from .models import SessionRecord

log = logging.getLogger("storage")

INDEX_NAME = "index.json"
INDEX_SCHEMA = 1
_REQUIRED = ("session_id", "user_id", "created_at", "updated_at")


def entry_for(record: SessionRecord, files: list[int]) -> dict[str, Any]:
    """The index entry of a session: its record without summaries, plus the ``files`` stamp."""
    return {"session_id": record.session_id, "user_id": record.user_id, "title": record.title,
            "created_at": record.created_at, "updated_at": record.updated_at,
            "message_count": record.message_count, "deleted": record.deleted, "model": record.model,
            "preview": record.preview, "title_auto": record.title_auto, "files": files}


def _valid_entry(e: Any) -> bool:
    """Every field of its type (an edited ``"deleted": "no"`` must not read as True): else the
    whole index is rebuilt from the session files."""
    if not isinstance(e, dict) or not all(isinstance(e.get(k), str) for k in _REQUIRED):
        return False
    files = e.get("files")
    if not (isinstance(files, list) and len(files) == 4 and all(type(x) is int for x in files)):
        return False
    try:
        SessionRecord.from_dict(e)
    except (TypeError, ValueError):
        return False
    return True


class SessionIndex:
    """In-memory index (authoritative while running), flushed atomically to ``index.json``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self._save_lock = threading.Lock()
        self.entries: dict[str, dict[str, Any]] = {}
        self.by_user: dict[str, dict[str, dict[str, Any]]] = {}
        self.dirty = False
        self.generation = 0

    def read_file(self) -> dict[str, dict[str, Any]] | None:
        """The entries stored in index.json, or None if it is missing or unusable."""
        try:
            doc = orjson.loads(read_bytes(self.path))
        except FileNotFoundError:
            log.info("storage: no %s, rebuilding it from the session files", self.path)
            return None
        except NotRegularFile as exc:
            # (moved aside unread: the rebuilt index is renamed onto this name, which a directory
            # or a link in the way would refuse or redirect)
            quarantine(os.path.dirname(self.path), self.path, reason=f"index {exc.strerror}")
            log.warning("storage: %s %s, rebuilding it from the session files", self.path, exc.strerror)
            return None
        except (OSError, orjson.JSONDecodeError) as exc:
            log.warning("storage: %s unreadable (%s), rebuilding it", self.path, exc)
            return None
        sessions = doc.get("sessions") if isinstance(doc, dict) else None
        if not isinstance(sessions, dict) or doc.get("schema_version") != INDEX_SCHEMA \
                or not all(_valid_entry(e) and e["session_id"] == k for k, e in sessions.items()):
            log.warning("storage: %s has an unexpected shape, rebuilding it", self.path)
            return None
        self.generation = int(doc.get("generation", 0)) if type(doc.get("generation")) is int else 0
        return sessions

    # -- entries ---------------------------------------------------------------------------
    def put_entry(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self._put(entry)

    def _put(self, entry: dict[str, Any]) -> None:
        sid = entry["session_id"]
        old = self.entries.get(sid)
        if old is not None and old["user_id"] != entry["user_id"]:
            self.by_user.get(old["user_id"], {}).pop(sid, None)
        self.entries[sid] = entry
        self.by_user.setdefault(entry["user_id"], {})[sid] = entry
        self.dirty = True

    def put(self, record: SessionRecord, files: list[int]) -> None:
        self.put_entry(entry_for(record, files))

    def remove(self, sid: str) -> None:
        with self.lock:
            old = self.entries.pop(sid, None)
            if old is not None:
                self.by_user.get(old["user_id"], {}).pop(sid, None)
                self.dirty = True

    def get(self, sid: str) -> dict[str, Any] | None:
        with self.lock:
            return self.entries.get(sid)

    def user_entries(self, user_id: str, *, include_deleted: bool = False) -> list[dict[str, Any]]:
        """The user's entries, newest ``updated_at`` first."""
        with self.lock:
            rows = [e for e in self.by_user.get(user_id, {}).values() if include_deleted or not e["deleted"]]
        rows.sort(key=lambda e: (e["updated_at"], e["session_id"]), reverse=True)
        return rows

    def list(self, user_id: str, before: str | None, limit: int, *,
             deleted: bool = False) -> tuple[list[SessionRecord], str | None]:
        """One page of the user's sessions (``deleted``: of the deleted ones); cursors are opaque
        ``updated_at|session_id`` strings."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidArgument(f"limit: expected a positive integer, got {limit!r}")
        if deleted:
            rows = [e for e in self.user_entries(user_id, include_deleted=True) if e["deleted"]]
        else:
            rows = self.user_entries(user_id)
        if before is not None:
            key = parse_cursor(before)
            rows = [e for e in rows if (e["updated_at"], e["session_id"]) < key]
        page = rows[:limit]
        nxt = f"{page[-1]['updated_at']}|{page[-1]['session_id']}" if len(rows) > limit else None
        return [SessionRecord.from_dict(e) for e in page], nxt

    # -- file ------------------------------------------------------------------------------
    def save(self, *, force: bool = False) -> bool:
        """Write index.json atomically if anything changed; True if written."""
        with self._save_lock:
            with self.lock:
                if not (self.dirty or force):
                    return False
                self.generation += 1
                doc = {"schema_version": INDEX_SCHEMA, "generation": self.generation,
                       "sessions": dict(self.entries)}
                self.dirty = False
            try:
                atomic_write(self.path, orjson.dumps(doc))
            except BaseException:
                self.dirty = True
                raise
            return True


def parse_cursor(cursor: object) -> tuple[str, str]:
    if isinstance(cursor, str) and "|" in cursor:
        updated, _, sid = cursor.rpartition("|")
        try:
            return updated, validate_session_id(sid)
        except InvalidSessionId:
            pass
    raise InvalidArgument(f"invalid session list cursor {str(cursor)[:60]!r}")
