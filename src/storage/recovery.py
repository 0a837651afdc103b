"""Startup: remove stray temp files, quarantine orphans (an empty one, an unfinished create, is
deleted) and rebuild stale index entries.

The index is trusted per session only when the entry's ``files`` stamp equals what ``stat`` reports
for that session's snapshot and journal now; any other session is re-read from its files. Sessions
in the index without files are dropped. Only ``stat`` is used for sessions that are up to date (of
the files themselves: a symbolic link never matches a stamp, so its session is re-read and refused).

A session that cannot be read at startup (``StorageIOError``: EACCES, EIO, ...) is not a missing
one: its previous index entry is kept as it was (stale stamp and all), so it is still listed and its
calls answer STORAGE_ERROR until it can be read; the next start re-reads it. Only a session that is
quarantined or of a newer schema (``reload`` returns None) leaves the index.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from .errors import StorageIOError
from .fsio import fsync_dir, quarantine
from .ids import JOURNAL_RE, SNAPSHOT_RE
from .index import SessionIndex

log = logging.getLogger("storage")

_TMP_SUFFIXES = (".json.tmp", ".journal.tmp")


def scan_root(root: str) -> tuple[dict[str, os.DirEntry], dict[str, os.DirEntry]]:
    """Session snapshots and journals found in ``root``, by session id; removes stray temp files."""
    snaps: dict[str, os.DirEntry] = {}
    journals: dict[str, os.DirEntry] = {}
    with os.scandir(root) as it:
        for e in it:
            name = e.name
            if name.startswith("session_") and name.endswith(_TMP_SUFFIXES) or name == "index.json.tmp":
                if e.is_dir(follow_symlinks=False):    # (never ours: os.unlink would fail on it)
                    quarantine(root, e.path, reason="a directory where a temp file is written")
                else:
                    log.warning("storage: removing unfinished temp file %s", e.path)
                    os.unlink(e.path)
                continue
            m = SNAPSHOT_RE.fullmatch(name) or JOURNAL_RE.fullmatch(name)
            if m is None:
                continue
            day, sid = m.groups()
            if sid[2:10] != day:
                log.warning("storage: ignoring %s: date does not match the session id", e.path)
                continue
            (snaps if name.endswith(".json") else journals)[sid] = e
    return snaps, journals


def recover(root: str, index: SessionIndex,
            reload: Callable[[str, str | None], dict[str, Any] | None]) -> dict[str, int]:
    """Fill ``index`` from index.json and the directory. ``reload(sid, owner)`` re-reads one session
    (``owner``: the user index.json gives it, None if none) and returns its index entry, or None if
    it was unusable (quarantined or skipped: also a snapshot whose record is another session's or
    another user's); StorageIOError if it could not be read right now (then the stored entry, if
    any, is kept)."""
    stored = index.read_file()
    snaps, journals = scan_root(root)
    stats = {"sessions": 0, "reloaded": 0, "dropped": 0, "orphans": 0}
    removed = False
    for sid, e in journals.items():
        if sid in snaps:
            continue
        if e.is_file(follow_symlinks=False) and e.stat(follow_symlinks=False).st_size == 0:
            # A create killed before its snapshot was renamed in: nothing was acknowledged.
            log.info("storage: removing %s: an empty journal without a snapshot (an unfinished create)", e.path)
            os.unlink(e.path)
            removed = True
        else:
            quarantine(root, e.path, reason="journal without snapshot")
        stats["orphans"] += 1
    if removed:
        fsync_dir(root)
    for sid, e in snaps.items():
        st = e.stat(follow_symlinks=False)
        jst = journals.get(sid)
        files = [st.st_ino, st.st_size, st.st_mtime_ns,
                 jst.stat(follow_symlinks=False).st_size if jst is not None else 0]
        entry = stored.get(sid) if stored is not None else None
        if entry is None or entry["files"] != files:
            stats["reloaded"] += 1
            try:
                fresh = reload(sid, entry["user_id"] if entry is not None else None)
            except StorageIOError as exc:
                if entry is None:
                    log.error("storage: session %s cannot be read (%s) and index.json has no entry for "
                              "it: not listed until a restart can read it", sid, exc)
                    continue
                log.error("storage: session %s cannot be read (%s): its index entry is kept, its calls "
                          "answer STORAGE_ERROR until it can be read", sid, exc)
                fresh = entry
            if fresh is None:
                continue
            entry = fresh
        if entry["session_id"] != sid:      # (reload checks it; never list a session under another's id)
            log.error("storage: session %s: its index entry is session %s's; not listed", sid, entry["session_id"])
            continue
        index.entries[sid] = entry
        index.by_user.setdefault(entry["user_id"], {})[sid] = entry
        stats["sessions"] += 1
    if stored is not None:
        stats["dropped"] = len(set(stored) - set(index.entries))
    index.dirty = stored is None or stats["reloaded"] > 0 or stats["dropped"] > 0
    if stats["reloaded"] or stats["dropped"] or stats["orphans"]:
        log.info("storage: index recovery: %s", stats)
    return stats
