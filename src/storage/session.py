"""One session in memory (record + raw message dicts) and its snapshot format.

Messages are kept as the plain dicts orjson produced (converted to ChatMessage only when returned),
so a cold load costs little more than ``orjson.loads`` of the snapshot. Ids ascend with position,
so any id is found by bisection. Every change goes through ``SessionState.apply`` both live and on
journal replay, so what is in memory is exactly what a reload produces.
"""
from __future__ import annotations

import gc
import logging
import os
import threading
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import orjson

from .fsio import open_regular, read_regular, write_all
from .journal import JournalScan, JournalWriter, scan_journal
from .models import DEFAULT_TITLE, ChatMessage, SessionRecord, SummaryRecord, encode_message

log = logging.getLogger("storage")

SCHEMA_VERSION = 1
PREVIEW_CHARS = 80
LOADING, READY, GONE = "loading", "ready", "gone"


#: Journal ops that do not change ``updated_at``: renaming a session, switching its model or
#: summarizing it is not activity, so it does not move the session to the top of the list.
QUIET_OPS = frozenset({"rename", "model", "summary", "prompt"})

class SnapshotError(ValueError):
    """The snapshot is not a valid session file."""


class UnsupportedSchema(SnapshotError):
    """The snapshot was written by a newer version (left in place, not quarantined)."""


def _mid(m: dict[str, Any]) -> int:
    return m["id"]


class SessionState:
    """Pure in-memory state of one session; no locking, no I/O."""

    __slots__ = ("record", "msgs", "cleared", "next_id", "last_seq", "text", "wire", "superseded", "wire_bytes")

    def __init__(self, record: SessionRecord, msgs: list[dict[str, Any]], cleared: int = 0,
                 next_id: int = 1, last_seq: int = 0) -> None:
        self.record = record
        self.msgs = msgs
        self.cleared = cleared
        self.next_id = max(next_id, msgs[-1]["id"] + 1 if msgs else 1)
        self.last_seq = last_seq
        self.text: Any = None            # textscan.SessionText of the last search (checked by last_seq)
        # Once a page was read: parallel to msgs, each message's JSON as sent (None: not encoded
        # yet, or changed since) and whether it is superseded. Kept in step by apply().
        self.wire: list[bytes | None] | None = None
        self.superseded: list[bool] = []
        self.wire_bytes = 0              # their total size (counted in the LRU's weight)

    # -- positions -------------------------------------------------------------------------
    def vis_start(self) -> int:
        """Position of the first visible (not cleared) message."""
        return bisect_right(self.msgs, self.cleared, key=_mid) if self.cleared else 0

    def position(self, message_id: int) -> int | None:
        i = bisect_left(self.msgs, message_id, key=_mid)
        return i if i < len(self.msgs) and self.msgs[i]["id"] == message_id else None

    def visible_range(self, before: int | None, limit: int) -> tuple[int, int, int]:
        """(start, end, vis_start) of the newest ``limit`` visible messages with id < before."""
        vis = self.vis_start()
        end = len(self.msgs) if before is None else bisect_left(self.msgs, before, key=_mid)
        end = max(end, vis)
        return max(vis, end - limit), end, vis

    def after_pos(self, after_id: int) -> int:
        """Position of the first visible message with id > after_id."""
        return max(self.vis_start(), bisect_right(self.msgs, after_id, key=_mid))

    def after(self, after_id: int) -> list[dict[str, Any]]:
        return self.msgs[self.after_pos(after_id):]

    def encoded(self, start: int, end: int) -> tuple[list[bytes], list[bool]]:
        """The JSON (``to_message(d).to_dict()``) and superseded flag of ``msgs[start:end]``, each
        message encoded once and then served from ``wire`` (a page is two list slices)."""
        wire = self.wire
        if wire is None:
            wire = self.wire = [None] * len(self.msgs)
            self.superseded = [False] * len(self.msgs)
        seg = wire[start:end]
        if None in seg:
            for i in range(start, end):
                if wire[i] is None:
                    raw, self.superseded[i] = encode_message(to_message(self.msgs[i]))
                    wire[i] = raw
                    self.wire_bytes += len(raw)
            seg = wire[start:end]
        return seg, self.superseded[start:end]  # type: ignore[return-value]

    # -- changes ---------------------------------------------------------------------------
    def refresh(self) -> None:
        """Recompute the derived record fields (message_count, preview)."""
        vis = self.vis_start()
        self.record.message_count = len(self.msgs) - vis
        last = self.msgs[-1] if len(self.msgs) > vis else None
        self.record.preview = str(last.get("content", ""))[:PREVIEW_CHARS] if last else ""

    def apply(self, e: dict[str, Any], *, refresh: bool = True) -> bool:
        """Apply one journal entry; False if already applied (seq not above last_seq)."""
        seq = e["seq"]
        if seq <= self.last_seq:
            return False
        op, rec = e["op"], self.record
        if op in ("append", "update"):
            m = e["msg"]
            if not isinstance(m, dict) or type(m.get("id")) is not int or not isinstance(m.get("role"), str):
                raise ValueError("malformed message")
        if op == "append":
            mid = m["id"]
            if self.msgs and mid <= self.msgs[-1]["id"]:
                raise ValueError(f"append of message id {mid!r} out of order")
            self.msgs.append(m)
            self.next_id = mid + 1
            if self.wire is not None:
                self.wire.append(None)
                self.superseded.append(False)
        elif op == "update":
            i = self.position(m["id"])
            if i is None:
                raise ValueError(f"update of unknown message id {m['id']!r}")
            self.msgs[i] = m
            if self.wire is not None and (old := self.wire[i]) is not None:
                self.wire[i] = None
                self.wire_bytes -= len(old)
        elif op == "rename":
            rec.title = str(e["title"])
            rec.title_auto = e.get("auto") is True
        elif op == "model":
            rec.model = e["model"]
        elif op == "clear":
            # The summaries only ever cover messages up to "through": they go with what they summarize.
            self.cleared = int(e["through"])
            rec.summaries = []
            if rec.title_auto:           # made from a cleared message: "New chat" until the next one
                rec.title, rec.title_auto = DEFAULT_TITLE, False
            if e.get("purge"):           # the hidden messages are dropped for good
                gone = self.vis_start()
                del self.msgs[:gone]
                if self.wire is not None:
                    self.wire_bytes -= sum(len(raw) for raw in self.wire[:gone] if raw is not None)
                    del self.wire[:gone], self.superseded[:gone]
        elif op == "delete":
            rec.deleted = True
        elif op == "undelete":
            rec.deleted = False
        elif op == "restore":
            rec.deleted, self.cleared = False, 0
        elif op == "prompt":
            rec.system_prompt = e["system_prompt"]
        elif op == "summary":
            rec.summaries.append(SummaryRecord.from_dict(e["summary"]))
        else:
            raise ValueError(f"unknown journal op {op!r}")
        if "at" in e and op not in QUIET_OPS:
            rec.updated_at = str(e["at"])
        self.last_seq = seq
        if refresh:
            self.refresh()
        return True

    # -- snapshot --------------------------------------------------------------------------
    def head(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "session": self.record.to_dict(),
                "cleared_through_id": self.cleared, "next_id": self.next_id, "last_seq": self.last_seq}


def encode_snapshot(head: dict[str, Any], msgs: list[dict[str, Any]]) -> bytes:
    """Snapshot bytes: the head object, then ``"messages"`` with one message per line."""
    body = b",\n".join(map(orjson.dumps, msgs))
    return b"".join((orjson.dumps(head)[:-1], b',\n"messages":[\n', body, b"\n]}\n"))


WRITE_CHUNK = 256            # messages encoded per write() while streaming a snapshot
SYNC_EVERY = 4 << 20         # fdatasync the temp snapshot every this many bytes


def write_snapshot(path: str, head: dict[str, Any], msgs: list[dict[str, Any]]) -> None:
    """Stream the snapshot (same bytes as encode_snapshot) into ``path`` and fsync it.

    Encoding in chunks releases the GIL at every write, so a big compaction in the background does
    not stall appends for its whole duration, and syncing every few MiB keeps the amount of dirty
    data small, so the journal's own fsyncs are not queued behind tens of MiB of snapshot."""
    fd = open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        write_all(fd, orjson.dumps(head)[:-1] + b',\n"messages":[\n')
        pending = 0
        for i in range(0, len(msgs), WRITE_CHUNK):
            part = b",\n".join(map(orjson.dumps, msgs[i:i + WRITE_CHUNK]))
            write_all(fd, b",\n" + part if i else part)
            pending += len(part)
            if pending >= SYNC_EVERY:
                os.fdatasync(fd)
                pending = 0
        write_all(fd, b"\n]}\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def decode_snapshot(data: bytes, sid: str | None = None, *, mtime: str | None = None,
                    repaired: list[str] | None = None) -> SessionState:
    """Parse snapshot bytes; raises SnapshotError (or UnsupportedSchema).

    ``sid``: the session id its file name says; a record of another session (a backup restored
    under the wrong name, another session's file copied over this one) is a SnapshotError naming
    both ids: serving it would list that other session twice, under an id its record denies.
    Fields of the wrong type that can be repaired safely are (``SessionRecord.from_snapshot``; a
    bad ``cleared_through_id`` -> 0: everything visible, ``next_id`` -> above the last message,
    ``last_seq`` -> 0: every journal line is replayed, those already folded in are recognised by
    their ids), each logged as a WARNING and described in ``repaired`` (``mtime``: the file's, for
    the dates no message gives)."""
    # The parsed tree is acyclic dicts and lists: pausing the cyclic GC while it is built avoids
    # repeated full traversals of a growing heap (measured ~1.6x faster for 100k messages).
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SnapshotError(f"not valid JSON: {exc}") from None
    finally:
        if paused:
            gc.enable()
    if not isinstance(doc, dict):
        raise SnapshotError("not a JSON object")
    ver = doc.get("schema_version")
    if type(ver) is int and ver > SCHEMA_VERSION:
        raise UnsupportedSchema(f"schema_version {ver} is newer than {SCHEMA_VERSION}")
    if ver != SCHEMA_VERSION:
        raise SnapshotError(f"bad schema_version {ver!r}")
    msgs = doc.get("messages")
    if not isinstance(msgs, list):
        raise SnapshotError("bad messages: not a list")
    try:
        ids = [m["id"] for m in msgs]
    except (KeyError, TypeError) as exc:
        raise SnapshotError(f"bad message: {exc!r}") from None
    if any(type(i) is not int for i in ids) or any(a >= b for a, b in zip(ids, ids[1:])):
        raise SnapshotError("message ids are not ascending integers")
    try:
        record, problems = SessionRecord.from_snapshot(doc.get("session"), messages=msgs, fallback_time=mtime)
    except (KeyError, TypeError, ValueError) as exc:
        raise SnapshotError(f"bad session record: {exc}") from None
    if sid is not None and record.session_id != sid:
        raise SnapshotError(f"its record is session {record.session_id!r} of user {record.user_id!r}, not "
                            f"session {sid!r} as its file name says (a copy or a restore under the wrong name?)")
    last_id = ids[-1] if ids else 0
    nums = []
    for key, safe, why in (("cleared_through_id", 0, "every message visible"),
                           ("next_id", last_id + 1, "after the last message"),
                           ("last_seq", 0, "every journal line replayed")):
        n = doc.get(key, 0)
        if type(n) is not int or n < 0:
            problems.append(f"{key}: {n!r} is not a non-negative integer, replaced by {safe} ({why})")
            n = safe
        nums.append(n)
    if problems:
        for p in problems:
            log.warning("storage: session %s: snapshot field %s", record.session_id, p)
        if repaired is not None:
            repaired.extend(problems)
    return SessionState(record, msgs, nums[0], max(nums[1], 1), nums[2])


@dataclass(slots=True)
class Loaded:
    state: SessionState
    scan: JournalScan
    snap_stat: tuple[int, int, int]
    replayed: int
    repaired: list[str]          # snapshot fields of the wrong type that were replaced (decode_snapshot)


def file_stat(path: str) -> tuple[int, int, int]:
    """(inode, size, mtime_ns) of ``path`` itself (a symbolic link's own, never its target's)."""
    return _stamp(os.lstat(path))


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def load_session(snap_path: str, journal_path: str, sid: str | None = None) -> Loaded:
    """Snapshot + journal replay. Raises FileNotFoundError, SnapshotError (also when the snapshot's
    record is not session ``sid``), NotRegularFile (a file is a symbolic link or not a regular file)."""
    data, st = read_regular(snap_path)
    snap_stat = _stamp(st)
    repaired: list[str] = []
    mtime = datetime.fromtimestamp(st.st_mtime, timezone.utc).isoformat()
    state = decode_snapshot(data, sid, mtime=mtime, repaired=repaired)
    scan = scan_journal(journal_path)
    replayed = 0
    for e in scan.entries:
        try:
            replayed += state.apply(e, refresh=False)
        except (KeyError, TypeError, ValueError) as exc:
            scan.rejected.append(e["seq"])
            log.warning("storage: %s: skipping journal entry seq=%s: %s", journal_path, e.get("seq"), exc)
    state.refresh()
    return Loaded(state, scan, snap_stat, replayed, repaired)


class LoadedSession:
    """A session in the LRU: state plus its lock, journal writer and bookkeeping."""

    __slots__ = ("sid", "lock", "status", "state", "writer", "journal_lines", "jdisk", "snap_stat",
                 "compacting", "transient", "last_used", "snap_path", "journal_path")

    def __init__(self, sid: str, snap_path: str, journal_path: str) -> None:
        self.sid = sid
        self.lock = threading.RLock()
        self.status = LOADING
        self.state: SessionState | None = None
        self.writer: JournalWriter | None = None
        self.journal_lines = 0
        self.jdisk = 0
        self.snap_stat = (0, 0, 0)
        self.compacting = False
        self.transient = False
        self.last_used = 0.0
        self.snap_path = snap_path
        self.journal_path = journal_path

    def nbytes(self) -> int:
        """What the session weighs in the LRU: its snapshot and journal bytes (the JSON it was
        loaded from; the Python objects take a few times that) and the JSON cached for pages."""
        return self.snap_stat[1] + self.jdisk + (self.state.wire_bytes if self.state is not None else 0)

    def files(self) -> list[int]:
        """What the index records to detect staleness: snapshot (inode, size, mtime_ns), journal size."""
        return [*self.snap_stat, self.jdisk]


def to_message(d: dict[str, Any]) -> ChatMessage:
    """A stored message dict as a ChatMessage; a malformed one (hand-edited file) becomes a
    placeholder instead of failing the whole request."""
    try:
        return ChatMessage.from_dict(d)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        log.warning("storage: unreadable stored message %r: %r", d.get("id") if isinstance(d, dict) else d, exc)
        mid = d.get("id") if isinstance(d, dict) else None
        return ChatMessage(mid if type(mid) is int else 0, "system", "[unreadable message]",
                           metadata={"unreadable": True})
