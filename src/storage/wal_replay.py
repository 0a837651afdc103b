"""Startup: replay the shared WAL files left by a crash into the session journals, then delete them.

Runs before anything reads a journal (``HistoryStore.__init__``, under the root's ``.lock``). For
each session with records, the records (in WAL order; a later record for a sequence number replaces
that one and everything after it, which only a failed round can leave behind) form a contiguous run
of lines ``w0..w1``. The journal is rebuilt as: its lines before ``w0`` (made durable by an earlier
checkpoint), the WAL's lines ``w0..w1``, then its own lines ``w1+1, w1+2, ...`` if present (written
but never acknowledged). If that is exactly what the journal already holds, nothing is written (the
common case after a process crash: the kernel kept the journal writes); otherwise the new journal is
written to a temp file, fsynced and renamed in. Lines already folded into the snapshot
(``seq <= last_seq``) are skipped by the loader as usual, so replaying twice, or after a compaction,
changes nothing. A session without a snapshot (purged, or quarantined) is skipped, and so is one whose
journal is a symbolic link or not a regular file (the loader refuses that session). A WAL file that
is a symbolic link or not a regular file is moved to quarantine/ unread. The WAL files are deleted
only after every journal is durable.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from .fsio import NotRegularFile, fsync_dir, quarantine, read_bytes, write_file_synced
from .ids import SESSION_ID_RE
from .wal import decode_records, wal_files

log = logging.getLogger("storage")


@dataclass
class ReplayStats:
    files: int = 0            # WAL files read
    records: int = 0          # complete records in them
    torn: int = 0             # files that ended in a torn or damaged record
    sessions: int = 0         # sessions with records
    rewritten: int = 0        # journals that had to be rebuilt
    skipped: int = 0          # sessions without a snapshot (or whose journal is refused)


def replay_wal(root: str, paths: Callable[[str], tuple[str, str]]) -> ReplayStats:
    """Replay every WAL file in ``root`` into the journals, then delete the files."""
    stats = ReplayStats()
    files: list[tuple[int, str]] = []
    runs: dict[str, dict[int, bytes]] = {}
    for generation, path in wal_files(root):
        try:
            data = read_bytes(path)
        except NotRegularFile as exc:
            quarantine(root, path, reason=f"WAL file {exc.strerror}")
            continue
        files.append((generation, path))
        records, used = decode_records(data)
        stats.files += 1
        stats.records += len(records)
        if used < len(data):
            stats.torn += 1
            log.warning("storage: %s: ignoring %d bytes of a torn or damaged tail", path, len(data) - used)
        for sid, seq, line in records:
            if SESSION_ID_RE.fullmatch(sid) is None:     # never written by this store: not a path
                log.warning("storage: %s: record with a malformed session id ignored", path)
                continue
            run = runs.setdefault(sid, {})
            for later in [s for s in run if s >= seq]:
                del run[later]
            run[seq] = line
    rewritten_dirs = False
    for sid, run in runs.items():
        stats.sessions += 1
        snap, jpath = paths(sid)
        if not os.path.exists(snap):
            stats.skipped += 1
            log.warning("storage: WAL records of %s skipped: the session has no snapshot", sid)
            continue
        try:
            rewritten = _replay_session(jpath, run)
        except NotRegularFile as exc:
            stats.skipped += 1
            log.error("storage: WAL records of %s skipped: its journal %s", sid, exc.strerror)
            continue
        if rewritten:
            stats.rewritten += 1
            rewritten_dirs = True
    if rewritten_dirs:
        fsync_dir(root)
    for _, path in files:
        os.unlink(path)
    if files:
        fsync_dir(root)
        log.info("storage: WAL replay: %d files, %d records, %d sessions, %d journals rebuilt",
                 stats.files, stats.records, stats.sessions, stats.rewritten)
    return stats


def _replay_session(jpath: str, run: dict[int, bytes]) -> bool:
    """Make ``jpath`` hold the run's lines; True if it had to be rewritten."""
    try:
        data = read_bytes(jpath)
    except FileNotFoundError:
        data = b""
    valid = data.rfind(b"\n") + 1
    lines = [ln + b"\n" for ln in data[:valid].split(b"\n")[:-1]] if valid else []
    w0, w1 = min(run), max(run)
    i, prefix = 0, []
    while i < len(lines):
        seq = _seq(lines[i])
        if seq is not None and seq >= w0:
            break
        prefix.append(lines[i])
        i += 1
    tail, nxt = [], w1 + 1
    for ln in lines[i:]:
        seq = _seq(ln)
        if seq is None or seq > nxt:
            break
        if seq == nxt:
            tail.append(ln)
            nxt += 1
    new = prefix + [run[s] for s in sorted(run)] + tail
    if new == lines and valid == len(data):
        return False
    tmp = jpath + ".tmp"
    write_file_synced(tmp, b"".join(new))
    os.replace(tmp, jpath)
    return True


def _seq(line: bytes) -> int | None:
    try:
        entry = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    seq = entry.get("seq") if isinstance(entry, dict) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None
