"""Reading one session from its files: snapshot + journal replay, with quarantine of corrupt files
and the log lines for torn or unreadable journal lines.

A journal that needs rewriting when it is read (unreadable lines, copied once to quarantine/; a
purging clear that a crash kept from finishing) is folded at once into a new snapshot and emptied,
as a compaction does, so the next read finds neither the bad lines nor the purged text."""
from __future__ import annotations

import logging
import os
from typing import Any

from .errors import CorruptSession, NotFound, StorageIOError
from .fsio import NotRegularFile, fsync_dir, open_regular, quarantine
from .ids import journal_name, snapshot_name
from .index import SessionIndex, entry_for
from .journal import JournalScan, JournalWriter
from .session import (READY, Loaded, LoadedSession, SnapshotError, UnsupportedSchema, file_stat, load_session,
                      write_snapshot)

log = logging.getLogger("storage")


class SessionLoader:
    """Finds a session's files under ``root`` and loads them."""

    def __init__(self, root: str, index: SessionIndex) -> None:
        self.root = root
        self.index = index

    def paths(self, sid: str) -> tuple[str, str]:
        return os.path.join(self.root, snapshot_name(sid)), os.path.join(self.root, journal_name(sid))

    def read(self, sid: str, owner: str | None = None) -> Loaded:
        """Load one session from disk, quarantining a corrupt snapshot (and its journal): also one
        whose record is another session's (its ``session_id`` is not the one of its file name) or
        another user's (``owner``, else the index entry's user: sessions never change hands, so a
        file saying otherwise was copied or edited; serving it would hand one user's conversation
        to another)."""
        snap, jpath = self.paths(sid)
        if owner is None:
            entry = self.index.get(sid)
            owner = entry["user_id"] if entry is not None else None
        try:
            loaded = load_session(snap, jpath, sid)
            user = loaded.state.record.user_id
            if owner is not None and user != owner:
                raise SnapshotError(f"its record gives session {sid} to user {user!r}, but it is user "
                                    f"{owner!r}'s (sessions never change hands: a copy or an edit?)")
        except FileNotFoundError:
            self.index.remove(sid)
            raise NotFound(f"session {sid} not found (its file is gone)") from None
        except UnsupportedSchema as exc:
            log.error("storage: %s left in place: %s", snap, exc)
            raise CorruptSession(f"session {sid} cannot be read by this version: {exc}") from None
        except NotRegularFile as exc:
            what = f"{os.path.basename(exc.filename)} {exc.strerror}"
            log.error("storage: session %s refused: %s %s (never read or written through); its files "
                      "are moved to quarantine/", sid, exc.filename, exc.strerror)
            quarantine(self.root, snap, reason=f"session refused: {what}")
            quarantine(self.root, jpath, reason=f"session refused: {what}")
            self.index.remove(sid)
            raise CorruptSession(f"session {sid} is refused ({what}); its files were moved to "
                                 f"quarantine/") from None
        except OSError as exc:
            log.error("storage: cannot read %s: %s", snap, exc)
            raise StorageIOError(f"session {sid} cannot be read right now: {exc.strerror or exc}") from None
        except SnapshotError as exc:
            quarantine(self.root, snap, reason=f"corrupt snapshot: {exc}")
            quarantine(self.root, jpath, reason="journal of a quarantined snapshot")
            self.index.remove(sid)
            raise CorruptSession(f"session {sid} is unreadable ({exc}); its files were moved to "
                                 f"quarantine/") from None
        scan = loaded.scan
        if scan.torn:
            log.warning("storage: %s: ignored a torn last line (%d bytes)", jpath, scan.disk_len - scan.valid_len)
        if loaded.repaired:
            # (the original is kept once; the fold below writes the repaired record, so the next
            # read neither warns nor copies again)
            quarantine(self.root, snap, copy=True, reason=f"snapshot with fields of the wrong type, repaired: "
                                                         f"{'; '.join(loaded.repaired)[:500]}")
        bad = bool(scan.bad_lines or scan.rejected)
        if bad:
            log.warning("storage: %s: skipped unreadable lines %s and entries seq %s", jpath,
                        scan.bad_lines[:10], scan.rejected[:10])
            quarantine(self.root, jpath, copy=True, reason="journal with unreadable lines")
        purge = any(e.get("op") == "clear" and e.get("purge") for e in scan.entries)
        if purge:
            log.info("storage: %s: finishing a purging clear (a crash kept it from rewriting the files)", jpath)
        if bad or purge or loaded.repaired:
            self._fold(sid, snap, jpath, loaded)
        return loaded

    def _fold(self, sid: str, snap: str, jpath: str, loaded: Loaded) -> None:
        """Write what was loaded as the new snapshot and empty the journal (as a compaction does).
        A failure is logged and leaves the journal as it was (the next read tries again)."""
        tmp = snap + ".tmp"
        try:
            write_snapshot(tmp, loaded.state.head(), loaded.state.msgs)
            os.replace(tmp, snap)
            fsync_dir(self.root)
            loaded.snap_stat = file_stat(snap)
            fd = open_regular(jpath, os.O_WRONLY)
            try:
                os.ftruncate(fd, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            log.error("storage: could not rewrite session %s after reading it: %s", sid, exc)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return
        loaded.scan = JournalScan()
        if self.index.get(sid) is not None:          # (at startup, recovery adds the entry itself)
            self.index.put(loaded.state.record, [*loaded.snap_stat, 0])

    def reload_entry(self, sid: str, owner: str | None = None) -> dict[str, Any] | None:
        """Recovery callback: re-read one session and return its index entry (None if unusable:
        quarantined or of a newer schema). ``owner``: the user index.json gave it. StorageIOError
        (it cannot be read right now) is raised: the session is not gone, recovery keeps its
        previous entry."""
        try:
            loaded = self.read(sid, owner)
        except NotFound:              # quarantined, newer schema (CorruptSession) or gone: not indexed
            return None
        return entry_for(loaded.state.record, [*loaded.snap_stat, loaded.scan.disk_len])

    def fill(self, sess: LoadedSession) -> None:
        """Load ``sess`` (a cache slot whose lock the caller holds) from its files; an index entry
        whose ``files`` stamp is not theirs is replaced by the one read."""
        loaded = self.read(sess.sid)
        sess.state = loaded.state
        sess.writer = JournalWriter(sess.journal_path, loaded.scan.valid_len)
        sess.journal_lines = loaded.scan.lines
        sess.jdisk = loaded.scan.disk_len
        sess.snap_stat = loaded.snap_stat
        sess.status = READY
        entry = self.index.get(sess.sid)
        if entry is not None and entry["files"] != sess.files():
            # (an entry kept at startup although its files could not be read: brought up to date
            # now that they can)
            self.index.put(loaded.state.record, sess.files())
