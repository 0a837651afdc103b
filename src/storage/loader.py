"""Reading one session from its files: snapshot + journal replay, with quarantine of corrupt files
and the log lines for torn or unreadable journal lines."""
from __future__ import annotations

import logging
import os
from typing import Any

from .errors import CorruptSession, NotFound, StorageError, StorageIOError
from .fsio import quarantine
from .ids import journal_name, snapshot_name
from .index import SessionIndex, entry_for
from .journal import JournalWriter
from .session import READY, Loaded, LoadedSession, SnapshotError, UnsupportedSchema, load_session

log = logging.getLogger("storage")


class SessionLoader:
    """Finds a session's files under ``root`` and loads them."""

    def __init__(self, root: str, index: SessionIndex) -> None:
        self.root = root
        self.index = index

    def paths(self, sid: str) -> tuple[str, str]:
        return os.path.join(self.root, snapshot_name(sid)), os.path.join(self.root, journal_name(sid))

    def read(self, sid: str) -> Loaded:
        """Load one session from disk, quarantining a corrupt snapshot (and its journal)."""
        snap, jpath = self.paths(sid)
        try:
            loaded = load_session(snap, jpath)
        except FileNotFoundError:
            self.index.remove(sid)
            raise NotFound(f"session {sid} not found (its file is gone)") from None
        except UnsupportedSchema as exc:
            log.error("storage: %s left in place: %s", snap, exc)
            raise CorruptSession(f"session {sid} cannot be read by this version: {exc}") from None
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
        if scan.bad_lines or scan.rejected:
            log.warning("storage: %s: skipped unreadable lines %s and entries seq %s", jpath,
                        scan.bad_lines[:10], scan.rejected[:10])
            quarantine(self.root, jpath, copy=True, reason="journal with unreadable lines")
        return loaded

    def reload_entry(self, sid: str) -> dict[str, Any] | None:
        """Recovery callback: re-read one session and return its index entry (None if unusable)."""
        try:
            loaded = self.read(sid)
        except StorageError:          # quarantined, newer schema or unreadable: not indexed
            return None
        return entry_for(loaded.state.record, [*loaded.snap_stat, loaded.scan.disk_len])

    def fill(self, sess: LoadedSession) -> None:
        """Load ``sess`` (a cache slot whose lock the caller holds) from its files."""
        loaded = self.read(sess.sid)
        sess.state = loaded.state
        sess.writer = JournalWriter(sess.journal_path, loaded.scan.valid_len)
        sess.journal_lines = loaded.scan.lines
        sess.jdisk = loaded.scan.disk_len
        sess.snap_stat = loaded.snap_stat
        sess.status = READY
