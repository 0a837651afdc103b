"""SIGKILL a child process that appends (and compacts) at random points, many times; after each
kill every acknowledged message must be there, ids contiguous, and every file must load."""
from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from storage import HistoryStore, StorageConfig
from storage_testlib import check_acked, check_files, kill_and_read_rest

CHILD = Path(__file__).with_name("crash_child.py")
KILLS = {"fsync": 14, "compact": 10, "batched": 6}


def run_and_kill(root: Path, sid: str, mode: str, acks_before_kill: int) -> list[int]:
    """Start the child, read ``acks_before_kill`` acknowledgements, SIGKILL it, return every ack."""
    proc = subprocess.Popen([sys.executable, str(CHILD), str(root), sid, mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    acked: list[int] = []
    try:
        while len(acked) < acks_before_kill:
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"child exited early: {proc.stderr.read().decode()[-2000:]}")
            acked.append(int(line))
    finally:
        rest = kill_and_read_rest(proc)
    acked += [int(x) for x in rest.split()]               # printed before the kill landed: acked too
    assert proc.returncode == -signal.SIGKILL
    return acked


def test_sigkill_never_loses_acknowledged_appends(tmp_path: Path) -> None:
    root = tmp_path / "history"
    rng = random.Random(1234)
    with HistoryStore(StorageConfig(root=str(root))) as store:
        sid = store.create("u", "crash").session_id
        for i in range(200):                               # a snapshot big enough that compaction
            store.append(sid, "user", f"prefill {i} " + "p" * 300)   # takes a while to write
    acked: list[int] = list(range(1, 201))
    plan = [m for m, n in KILLS.items() for _ in range(n)]
    rng.shuffle(plan)
    for k, mode in enumerate(plan):
        acked += run_and_kill(root, sid, mode, rng.randint(1, 40))
        if k % 3 == 2:                                     # otherwise the next child recovers by itself
            continue
        check_files(root)
        with HistoryStore(StorageConfig(root=str(root))) as store:
            ids = [m.id for m in store.messages(sid)]
            assert ids == list(range(1, len(ids) + 1))
            assert set(acked) <= set(ids)
            assert store.list("u")[0][0].message_count == len(ids)
    assert len(acked) >= 200 + len(plan)
    check_files(root)
    with HistoryStore(StorageConfig(root=str(root))) as store:
        ids = [m.id for m in store.messages(sid)]
        assert ids == list(range(1, len(ids) + 1)) and set(acked) <= set(ids)


@pytest.mark.parametrize("mode", ["group", "async", "async-batched"])
def test_sigkill_during_group_commit_loses_no_acknowledged_append(tmp_path: Path, mode: str) -> None:
    """Several writers on several sessions share flush rounds (``async``: coroutines on one event
    loop whose journal lines the flusher thread writes, with compactions; ``async-batched``: the
    same in batched mode, acknowledged once written); after each SIGKILL every acknowledged message
    of every session is present and ids are contiguous."""
    root = tmp_path / "history"
    rng = random.Random(4321)
    with HistoryStore(StorageConfig(root=str(root))) as store:
        sids = [store.create("u", f"group {i}").session_id for i in range(6)]
    acked: dict[str, set[int]] = {sid: set() for sid in sids}
    for _ in range(8):
        proc = subprocess.Popen([sys.executable, str(CHILD), str(root), ",".join(sids), mode],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        want, seen = rng.randint(20, 200), 0
        try:
            while seen < want:
                line = proc.stdout.readline()
                if not line:
                    raise AssertionError(f"child exited early: {proc.stderr.read().decode()[-2000:]}")
                sid, mid = line.split()
                acked[sid.decode()].add(int(mid))
                seen += 1
        finally:
            rest = kill_and_read_rest(proc)
        for line in rest.splitlines():                     # printed before the kill landed: acked too
            sid, mid = line.split()
            acked[sid.decode()].add(int(mid))
        assert proc.returncode == -signal.SIGKILL
        check_acked(root, sids, acked)
    assert sum(len(a) for a in acked.values()) >= 8 * 20
