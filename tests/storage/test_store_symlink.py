"""The store never reads or writes through a symbolic link (or anything but a regular file) in its
root: a session whose snapshot or journal is a link is refused with an ERROR line and its files,
the link itself, are moved to quarantine/; the file the link points to is never read, written,
truncated or copied, and every other session keeps being served."""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import orjson
import pytest
from storage_testlib import journal_line, journal_path, last_seq, msg_dict, quarantined, snap_path

from storage import CorruptSession, NotFound, StorageIOError
from storage import fsio
from storage.wal import wal_name

OUTSIDE = b"line one of an unrelated file\nline two\nthird line without newline"


def two_sessions(open_store) -> tuple[str, str]:
    store = open_store()
    victim, other = store.create("u", "victim").session_id, store.create("u", "other").session_id
    store.append(victim, "user", "first")
    store.append(other, "user", "kept")
    store.close()
    return victim, other


def link(path: Path, target: Path) -> None:
    path.unlink()
    path.symlink_to(target)


def linked_aside(root: Path, name: str) -> Path:
    [q] = [root / "quarantine" / n for n in quarantined(root) if n.startswith(name)]
    return q


def test_a_journal_linked_outside_refuses_its_session_and_never_touches_the_target(
        open_store, root, tmp_path, caplog) -> None:
    victim, other = two_sessions(open_store)
    outside = tmp_path / "outside.txt"
    outside.write_bytes(OUTSIDE)
    link(journal_path(root, victim), outside)
    caplog.set_level(logging.ERROR, "storage")
    store = open_store()
    assert f"session {victim} refused" in caplog.text and "is a symbolic link" in caplog.text
    assert [r.session_id for r in store.list("u")[0]] == [other]
    with pytest.raises(NotFound):
        store.get(victim)
    assert store.append(other, "user", "still served").id == 2
    store.close()                                        # (a close compacts every loaded session)
    assert outside.read_bytes() == OUTSIDE
    q = linked_aside(root, journal_path(root, victim).name)
    assert q.is_symlink() and q.resolve() == outside     # the link was moved, its target not copied
    assert linked_aside(root, snap_path(root, victim).name).is_file()
    assert not journal_path(root, victim).exists() and not os.path.lexists(journal_path(root, victim))


def test_a_snapshot_linked_outside_is_refused(open_store, root, tmp_path) -> None:
    victim, other = two_sessions(open_store)
    outside = tmp_path / "outside.json"
    shutil.copyfile(snap_path(root, victim), outside)    # a valid snapshot, just not the store's
    before = outside.read_bytes()
    link(snap_path(root, victim), outside)
    store = open_store()
    with pytest.raises(NotFound):
        store.get(victim)
    assert store.messages(other)[0].content == "kept"
    store.close()
    assert outside.read_bytes() == before
    assert linked_aside(root, snap_path(root, victim).name).is_symlink()


def test_a_link_made_while_the_store_runs_is_refused_on_load_and_on_write(open_store, root, tmp_path) -> None:
    victim, other = two_sessions(open_store)
    outside = tmp_path / "outside.txt"
    outside.write_bytes(OUTSIDE)
    store = open_store()
    assert store.get(other).title == "other"             # loaded; its journal is not open yet
    link(journal_path(root, other), outside)
    with pytest.raises(StorageIOError):                   # the journal is opened by its first write
        store.append(other, "user", "through the link?")
    assert store.get(victim).title == "victim"
    store.evict_idle(now=float("inf"))
    link(journal_path(root, victim), outside)
    with pytest.raises(CorruptSession, match="symbolic link"):
        store.get(victim)                                 # loaded again: refused
    assert linked_aside(root, journal_path(root, victim).name).is_symlink()
    assert outside.read_bytes() == OUTSIDE


def test_a_search_does_not_read_a_journal_linked_outside(open_store, root, tmp_path) -> None:
    """A search loads a session that is not loaded transiently: the link is refused there too, not
    read as a journal with unreadable lines and a torn tail (which would be copied and cut)."""
    victim, _ = two_sessions(open_store)
    outside = tmp_path / "outside.txt"
    data = journal_line(last_seq(root, victim) + 1, "append", msg=msg_dict(2, "planted")) + b"{not json\n" + OUTSIDE
    outside.write_bytes(data)
    store = open_store()
    assert store.loaded_count() == 0
    link(journal_path(root, victim), outside)
    assert store.search("u", "planted") == []
    assert [h.snippet for h in store.search("u", "kept")] == ["kept"]
    store.close()
    assert outside.read_bytes() == data
    kept = [root / "quarantine" / n for n in quarantined(root)]
    assert not [p for p in kept if not p.is_symlink() and b"planted" in p.read_bytes()]


def test_index_wal_and_lock_links_are_never_followed(open_store, root, tmp_path) -> None:
    _, other = two_sessions(open_store)
    outside = tmp_path / "outside.txt"
    outside.write_bytes(OUTSIDE)
    link(root / "index.json", outside)
    (root / wal_name(7)).symlink_to(outside)
    store = open_store()
    assert store.messages(other)[0].content == "kept"
    store.close()
    assert outside.read_bytes() == OUTSIDE
    assert not (root / "index.json").is_symlink()        # rebuilt as a file of its own
    assert other in orjson.loads((root / "index.json").read_bytes())["sessions"]
    assert linked_aside(root, wal_name(7)).is_symlink()
    gone = tmp_path / "created-through-the-lock-link"
    link(root / ".lock", gone)
    with pytest.raises(fsio.NotRegularFile):
        open_store()
    assert not gone.exists()


def test_open_regular_refuses_links_and_fifos_without_blocking(tmp_path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"x")
    (tmp_path / "link").symlink_to(target)
    os.mkfifo(tmp_path / "fifo")
    for name in ("link", "fifo"):
        with pytest.raises(fsio.NotRegularFile):
            fsio.open_regular(str(tmp_path / name))
    with pytest.raises(fsio.NotRegularFile):
        fsio.open_regular(str(tmp_path / "link"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    assert target.read_bytes() == b"x"
    fd = fsio.open_regular(str(target))
    try:
        assert os.get_blocking(fd) and os.read(fd, 10) == b"x"
    finally:
        os.close(fd)


def test_quarantine_moves_a_link_instead_of_copying_its_target(tmp_path) -> None:
    target = tmp_path / "target"
    target.write_bytes(OUTSIDE)
    root = tmp_path / "root"
    root.mkdir()
    (root / "j.journal").symlink_to(target)
    dest = Path(fsio.quarantine(str(root), str(root / "j.journal"), copy=True))
    assert dest.is_symlink() and not os.path.lexists(root / "j.journal")
    assert target.read_bytes() == OUTSIDE
    dangling = root / "d.journal"
    dangling.symlink_to(tmp_path / "nowhere")
    assert Path(fsio.quarantine(str(root), str(dangling))).is_symlink()
