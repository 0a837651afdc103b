"""Helpers shared by the storage tests (importable because conftest puts this folder on sys.path)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

import orjson

from storage import HistoryStore, StorageConfig
from storage.ids import journal_name, snapshot_name


def snap_path(root: Path, sid: str) -> Path:
    return root / snapshot_name(sid)


def journal_path(root: Path, sid: str) -> Path:
    return root / journal_name(sid)


def last_seq(root: Path, sid: str) -> int:
    """The last change seq on disk (snapshot head + journal lines)."""
    seq = orjson.loads(snap_path(root, sid).read_bytes())["last_seq"]
    jp = journal_path(root, sid)
    if jp.exists():
        for line in jp.read_bytes().splitlines():
            seq = max(seq, orjson.loads(line)["seq"])
    return seq


def journal_line(seq: int, op: str, **fields) -> bytes:
    return orjson.dumps({"seq": seq, "op": op, "at": "2026-01-01T00:00:00+00:00", **fields}) + b"\n"


def msg_dict(mid: int, content: str, role: str = "user") -> dict:
    return {"id": mid, "role": role, "content": content, "timestamp": "2026-01-01T00:00:00+00:00",
            "tool_calls": [], "metadata": {}}


def drain(store: HistoryStore) -> None:
    """Wait until background compaction has settled: none running and none queued.

    The compactor has one FIFO worker, and a finishing compaction may queue the next one itself, so
    a no-op job is pushed through until no loaded session is marked compacting (30 s deadline).
    """
    deadline = time.monotonic() + 30
    while True:
        store.compactor.barrier(timeout=30)
        busy = [s.sid for s in store.cache.sessions() if s.compacting]
        if not busy:
            return
        assert time.monotonic() < deadline, f"compaction never settled for {busy}"


def quarantined(root: Path) -> list[str]:
    q = root / "quarantine"
    return sorted(os.listdir(q)) if q.exists() else []


def kill_and_read_rest(proc: subprocess.Popen) -> bytes:
    """SIGKILL the child; the rest of its stdout, with what ``readline`` already buffered
    (``communicate`` reads the pipe itself and would skip that, tearing the line it cut)."""
    proc.send_signal(signal.SIGKILL)
    rest = proc.stdout.read()
    proc.stderr.read()
    proc.wait(60)
    return rest


def check_files(root: Path) -> None:
    assert not (root / "quarantine").exists(), os.listdir(root / "quarantine")
    for p in root.glob("session_*.json"):
        doc = orjson.loads(p.read_bytes())                 # every snapshot is complete JSON
        assert doc["schema_version"] == 1
    for p in root.glob("session_*.journal"):
        lines = p.read_bytes().split(b"\n")
        for line in lines[:-1]:                            # complete lines all parse; the last may be torn
            orjson.loads(line)


def check_acked(root: Path, sids: list[str], acked: dict[str, set[int]]) -> None:
    """After SIGKILLs: the files are sound, and every session holds messages 1..n with no gap,
    every acknowledged one among them."""
    check_files(root)
    with HistoryStore(StorageConfig(root=str(root))) as store:
        for sid in sids:
            ids = [m.id for m in store.messages(sid)]
            assert ids == list(range(1, len(ids) + 1))
            assert acked[sid] <= set(ids), sorted(acked[sid] - set(ids))[:10]


def wait_for(pred: Callable[[], object], timeout: float = 30) -> None:
    """Poll ``pred`` (another thread's progress) until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.001)
