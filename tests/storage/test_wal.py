"""The shared write-ahead log: a real child process appending to several sessions is SIGKILLed at
random points; the journal writes the kernel had not written back yet are then thrown away (each
journal cut at a random byte, as a power loss after the kill would) and every acknowledged message
must come back from the WAL. Also: torn tail records, replay twice, checkpoints then a crash, the
rule for a sequence number written twice, and sessions purged before the crash."""
from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import orjson

from storage import HistoryStore, StorageConfig
from storage.ids import journal_name, snapshot_name
from storage.wal import decode_records, encode_record, wal_files, wal_name
from storage.wal_replay import replay_wal
from storage_testlib import check_acked, journal_line, journal_path, kill_and_read_rest, msg_dict

CHILD = Path(__file__).with_name("crash_child.py")


def _paths(root: Path):
    return lambda sid: (str(root / snapshot_name(sid)), str(root / journal_name(sid)))


def _run_and_kill(root: Path, sids: list[str], checkpoint_s: float, want: int) -> list[tuple[str, int]]:
    """Start the ``wal`` child on ``sids``, read ``want`` acknowledgements, SIGKILL it; every ack."""
    proc = subprocess.Popen([sys.executable, str(CHILD), str(root), ",".join(sids), "wal", str(checkpoint_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    acked: list[tuple[str, int]] = []
    try:
        while len(acked) < want:
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"child exited early: {proc.stderr.read().decode()[-2000:]}")
            sid, mid = line.split()
            acked.append((sid.decode(), int(mid)))
    finally:
        rest = kill_and_read_rest(proc)
    for line in rest.splitlines():                     # printed before the kill landed: acked too
        sid, mid = line.split()
        acked.append((sid.decode(), int(mid)))
    assert proc.returncode == -signal.SIGKILL
    return acked


def _check(root: Path, sids: list[str], acked: dict[str, set[int]]) -> None:
    check_acked(root, sids, acked)
    assert wal_files(str(root)) == []                  # a clean close leaves nothing to replay


def test_sigkill_then_lost_journal_writes_come_back_from_the_wal(tmp_path: Path) -> None:
    root = tmp_path / "history"
    rng = random.Random(2468)
    with HistoryStore(StorageConfig(root=str(root))) as store:
        sids = [store.create("u", f"wal {i}").session_id for i in range(5)]
    acked: dict[str, set[int]] = {sid: set() for sid in sids}
    for k in range(8):
        # No checkpoint during the run and every journal is empty at the start (the previous check
        # closed the store cleanly), so nothing the child wrote to a journal was fsynced there.
        for sid, mid in _run_and_kill(root, sids, 3600, rng.randint(10, 150)):
            acked[sid].add(mid)
        logs = wal_files(str(root))
        assert logs, "the child left no WAL file"
        for sid in sids:                               # a power loss: unsynced journal bytes are gone
            jp = journal_path(root, sid)
            data = jp.read_bytes()
            jp.write_bytes(data[:rng.randint(0, len(data))])
        if k % 2:                                      # and the last WAL record was being written
            with open(logs[-1][1], "ab") as f:
                f.write(encode_record(sids[0], 10**6, journal_line(10**6, "rename", title="torn"))[:-7])
        if k % 3 == 0:                                 # replay twice: the crash came before the delete
            saved = tmp_path / "saved"
            shutil.rmtree(saved, ignore_errors=True)
            saved.mkdir()
            for _, p in logs:
                shutil.copy(p, saved)
            first = replay_wal(str(root), _paths(root))
            assert first.records > 0 and first.rewritten > 0
            journals = {sid: journal_path(root, sid).read_bytes() for sid in sids}
            for p in saved.iterdir():
                shutil.copy(p, root)
            again = replay_wal(str(root), _paths(root))
            assert again.records == first.records and again.rewritten == 0
            assert {sid: journal_path(root, sid).read_bytes() for sid in sids} == journals
        _check(root, sids, acked)
    assert sum(len(a) for a in acked.values()) >= 8 * 10


def test_sigkill_while_checkpoints_run_loses_nothing(tmp_path: Path) -> None:
    """Checkpoints every 20 ms (WAL files retired, journals fsynced, files deleted) while the child
    appends; SIGKILL lands anywhere among them."""
    root = tmp_path / "history"
    rng = random.Random(1357)
    with HistoryStore(StorageConfig(root=str(root))) as store:
        sids = [store.create("u", f"ckpt {i}").session_id for i in range(4)]
    acked: dict[str, set[int]] = {sid: set() for sid in sids}
    for _ in range(6):
        for sid, mid in _run_and_kill(root, sids, 0.02, rng.randint(50, 300)):
            acked[sid].add(mid)
        assert len(wal_files(str(root))) <= 3          # retired files do not pile up
        _check(root, sids, acked)


def test_torn_and_damaged_records_end_the_log() -> None:
    good = [encode_record("s_20260101_000000000001", n, journal_line(n, "rename", title=f"t{n}")) for n in (1, 2)]
    data = b"".join(good)
    assert decode_records(data) == ([("s_20260101_000000000001", n, journal_line(n, "rename", title=f"t{n}"))
                                     for n in (1, 2)], len(data))
    assert decode_records(data + good[0][:-1])[1] == len(data)          # no final newline
    bad = bytearray(good[1])
    bad[-5] ^= 1                                                         # checksum mismatch
    assert decode_records(good[0] + bytes(bad) + good[0])[1] == len(good[0])
    assert decode_records(b"\0" * 64)[1] == 0                            # zeros after a power loss


def _store_with(root: Path) -> str:
    with HistoryStore(StorageConfig(root=str(root))) as store:
        return store.create("u", "t").session_id


def test_a_later_record_for_a_seq_replaces_the_failed_rounds(tmp_path: Path) -> None:
    """A round whose fsync failed (and whose records could not be cut back) left seq 1 and 2; the
    session was reloaded and wrote seq 1 again: the later seq 1 wins and the old seq 2 is gone."""
    root = tmp_path / "h"
    sid = _store_with(root)
    old1 = journal_line(1, "append", msg=msg_dict(1, "never acknowledged"))
    old2 = journal_line(2, "append", msg=msg_dict(2, "never acknowledged either"))
    new1 = journal_line(1, "append", msg=msg_dict(1, "acknowledged"))
    (root / wal_name(1)).write_bytes(encode_record(sid, 1, old1) + encode_record(sid, 2, old2))
    (root / wal_name(2)).write_bytes(encode_record(sid, 1, new1))
    stats = replay_wal(str(root), _paths(root))
    assert (stats.files, stats.records, stats.rewritten) == (2, 3, 1)
    assert journal_path(root, sid).read_bytes() == new1
    with HistoryStore(StorageConfig(root=str(root))) as store:
        assert [m.content for m in store.messages(sid)] == ["acknowledged"]


def test_replay_keeps_checkpointed_lines_and_skips_what_the_snapshot_holds(tmp_path: Path) -> None:
    root = tmp_path / "h"
    sid = _store_with(root)
    lines = [journal_line(n, "append", msg=msg_dict(n, f"m{n}")) for n in range(1, 6)]
    journal_path(root, sid).write_bytes(b"".join(lines[:3]) + lines[3][:10])   # 1-3 checkpointed, 4 torn
    (root / wal_name(7)).write_bytes(b"".join(encode_record(sid, n, lines[n - 1]) for n in (3, 4, 5)))
    assert replay_wal(str(root), _paths(root)).rewritten == 1
    assert journal_path(root, sid).read_bytes() == b"".join(lines)
    with HistoryStore(StorageConfig(root=str(root))) as store:
        assert [m.content for m in store.messages(sid)] == [f"m{n}" for n in range(1, 6)]
    # after the clean close the snapshot holds all five: a replay of the same records changes nothing
    (root / wal_name(8)).write_bytes(b"".join(encode_record(sid, n, lines[n - 1]) for n in (3, 4, 5)))
    replay_wal(str(root), _paths(root))
    with HistoryStore(StorageConfig(root=str(root))) as store:
        assert [m.content for m in store.messages(sid)] == [f"m{n}" for n in range(1, 6)]


def test_records_of_a_session_without_snapshot_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / "h"
    _store_with(root)
    gone = "s_20260101_0000000000ff"
    (root / wal_name(1)).write_bytes(encode_record(gone, 1, journal_line(1, "rename", title="purged")))
    stats = replay_wal(str(root), _paths(root))
    assert (stats.skipped, stats.rewritten) == (1, 0)
    assert not (root / journal_name(gone)).exists() and wal_files(str(root)) == []


def test_checkpoint_empties_the_wal_and_the_journals_hold_every_line(open_store, root) -> None:
    store = open_store(wal_checkpoint_s=3600)
    sids = [store.create("u").session_id for _ in range(3)]
    for i in range(5):
        for sid in sids:
            store.append(sid, "user", f"m{i}")
    (log,) = wal_files(str(root))
    records, _ = decode_records(Path(log[1]).read_bytes())
    assert len(records) == 15 and {r[0] for r in records} == set(sids)
    for sid, seq, line in records:                     # each record is its journal's line, byte for byte
        assert line in journal_path(root, sid).read_bytes() and orjson.loads(line)["seq"] == seq
    store.checkpoint()
    assert wal_files(str(root)) == [] and store.flusher.wal.checkpoints == 1
    store.append(sids[0], "user", "after")             # a new WAL generation starts
    assert [g for g, _ in wal_files(str(root))] == [log[0] + 1]


def test_a_record_with_a_malformed_session_id_is_ignored(tmp_path: Path) -> None:
    root = tmp_path / "h"
    _store_with(root)
    (root / wal_name(1)).write_bytes(encode_record("s_20260101_../../x", 1, journal_line(1, "rename", title="x")))
    stats = replay_wal(str(root), _paths(root))
    assert (stats.records, stats.sessions, stats.rewritten) == (1, 0, 0) and wal_files(str(root)) == []
