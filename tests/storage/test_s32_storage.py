"""Review s32 (storage): private file modes, an index.json that is a directory, a session unreadable
at start-up, a search with one unreadable session, and a purging clear that leaves no preview in
index.json.

An unreadable file: as root (where chmod 000 stops no read) the snapshot read is made to fail with
EACCES in-process (``storage.session.read_regular``, what ``load_session`` reads it with); otherwise
the snapshot really is chmod 000.
"""
from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

import storage.session as session_mod
from protocol import MsgType as T
from storage import HistoryStore, StorageConfig, StorageIOError
from storage.fsio import QUARANTINE_DIR, quarantine
from storage.index import INDEX_NAME
from testkit.server import ReplyError, V3Client, running_server


def _modes(root: Path) -> dict[str, int]:
    """Every path under ``root`` (and root) -> its permission bits."""
    return {str(p): stat.S_IMODE(p.lstat().st_mode) for p in [root, *root.rglob("*")]}


@contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _snapshot(root: Path, sid: str) -> Path:
    (path,) = root.glob(f"session_*_{sid}.json")
    return path


@contextmanager
def _unreadable(path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``path`` cannot be read (EACCES) inside the block."""
    if os.geteuid() != 0:
        path.chmod(0)
        try:
            yield
        finally:
            path.chmod(0o600)
        return
    real = session_mod.read_regular

    def refusing(p: str):
        if os.path.abspath(p) == str(path):
            raise PermissionError(errno.EACCES, "Permission denied", p)
        return real(p)

    with monkeypatch.context() as m:
        m.setattr(session_mod, "read_regular", refusing)
        yield


# -- 1. modes --------------------------------------------------------------------------------------

def test_the_store_creates_private_files_and_directories_whatever_the_umask(root):
    with _umask(0o022):
        store = HistoryStore(StorageConfig(root=str(root)))        # fsync mode: a WAL file too
        try:
            sid = store.create("alice").session_id
            store.append(sid, "user", "private words")
            assert any(p.name.startswith("wal_") for p in root.iterdir())
            (root / "stray.journal").write_bytes(b"x")               # (made here: 0644)
            dest = quarantine(str(root), str(root / "stray.journal"), copy=True, reason="test")
            assert dest is not None and os.path.exists(dest)
            while_open = _modes(root)
        finally:
            store.close()
    shared = {p: oct(m) for p, m in {**while_open, **_modes(root)}.items()
              if m & 0o077 and not p.endswith("stray.journal")}
    assert shared == {}
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o600 and stat.S_IMODE((root / "quarantine").stat().st_mode) == 0o700


def test_a_shared_history_directory_is_warned_about_at_start_not_refused(root, caplog):
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="storage"):
        HistoryStore(StorageConfig(root=str(root))).close()
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "accessible to other accounts" in r.message]
    assert len(warned) == 1 and "0755" in warned[0].message and "chmod 700" in warned[0].message
    caplog.clear()
    root.chmod(0o700)
    with caplog.at_level(logging.WARNING, logger="storage"):
        HistoryStore(StorageConfig(root=str(root))).close()
    assert not [r for r in caplog.records if "accessible to other accounts" in r.message]


# -- 2. index.json that is not a regular file ------------------------------------------------------

@pytest.mark.parametrize("name", [INDEX_NAME, INDEX_NAME + ".tmp"])
def test_an_index_json_directory_is_moved_to_quarantine_and_the_index_rebuilt(root, open_store, name):
    store = open_store()
    sid = store.create("alice", title="kept").session_id
    store.append(sid, "user", "hello")
    store.close()
    index = root / name
    if index.exists():
        index.unlink()
    index.mkdir()
    (index / "inside").write_text("something")
    store = open_store()                                     # (before: IsADirectoryError, exit 1)
    assert [r.title for r in store.list("alice")[0]] == ["kept"]
    assert [m.content for m in store.messages(sid)] == ["hello"]
    store.close()
    assert (root / INDEX_NAME).is_file() and not (root / (INDEX_NAME + ".tmp")).exists()
    assert sid in orjson.loads((root / INDEX_NAME).read_bytes())["sessions"]
    moved = [p for p in (root / QUARANTINE_DIR).iterdir() if p.name.startswith(name + ".")]
    assert len(moved) == 1 and (moved[0] / "inside").read_text() == "something"
    store = open_store()                                     # and the next start is an ordinary one
    assert store.recovery_stats["reloaded"] == 0
    assert [r.session_id for r in store.list("alice")[0]] == [sid]


# -- 3. a session unreadable at start-up ----------------------------------------------------------

def _stale_stamp(root: Path, sid: str) -> None:
    """Make index.json's stamp of ``sid`` stale, as a crash after its last change leaves it."""
    path = root / INDEX_NAME
    doc = orjson.loads(path.read_bytes())
    doc["sessions"][sid]["files"] = [0, 0, 0, 0]
    doc["sessions"][sid]["preview"] = "from before the crash"
    path.write_bytes(orjson.dumps(doc))


def test_a_session_unreadable_at_start_keeps_its_entry_in_the_store(root, open_store, monkeypatch):
    store = open_store()
    sid = store.create("alice", title="mine").session_id
    store.append(sid, "user", "hello")
    store.close()
    _stale_stamp(root, sid)
    with _unreadable(_snapshot(root, sid), monkeypatch):
        store = open_store()
        assert [r.session_id for r in store.list("alice")[0]] == [sid]      # still listed
        with pytest.raises(StorageIOError):
            store.messages(sid)
        assert store.list("alice")[0][0].preview == "from before the crash"
    assert [m.content for m in store.messages(sid)] == ["hello"]           # readable again: no restart
    assert store.list("alice")[0][0].preview == "hello"                    # (and its entry brought up to date)


async def _seed(tmp_path: Path, *texts: str) -> list[str]:
    """One session per text (its only message, echoed by the EchoAgent), created through a real
    server that is then stopped; the session ids, oldest first."""
    sids = []
    async with running_server(tmp_path) as (_, addr):
        c = await V3Client.connect(addr)
        for i, text in enumerate(texts):
            if i:
                await c.call(T.SESSION_NEW)
            sid = (await c.call(T.SESSION_INFO))["session"]["session_id"]
            r = await c.call(T.CHAT_TEXT, text=text)
            await c.turn_events(r["turn_id"])
            sids.append(sid)
        await c.close()
    return sids


async def test_a_session_unreadable_at_start_is_storage_error_on_the_wire_not_not_found(tmp_path, monkeypatch):
    root = tmp_path / "history"
    old, new = await _seed(tmp_path, "the older one", "the newer one")
    _stale_stamp(root, old)
    with _unreadable(_snapshot(root, old), monkeypatch):
        async with running_server(tmp_path) as (_, addr):
            c = await V3Client.connect(addr, new_session=False)
            listed = [s["session_id"] for s in (await c.call(T.SESSION_LIST))["sessions"]]
            assert listed == [new, old]                                        # not dropped
            with pytest.raises(ReplyError) as err:
                await c.call(T.HISTORY_REQUEST, session_id=old)
            assert err.value.code == "STORAGE_ERROR" and err.value.body["fatal"] is False
            assert "Permission denied" in err.value.body["message"]
            await c.close()


# -- 4. search with one unreadable session --------------------------------------------------------

async def test_search_skips_an_unreadable_session_and_finds_the_others(tmp_path, monkeypatch, caplog):
    root = tmp_path / "history"
    old, new = await _seed(tmp_path, "kiwi in the older session", "kiwi in the newer session")
    with _unreadable(_snapshot(root, old), monkeypatch), caplog.at_level(logging.WARNING, logger="storage"):
        async with running_server(tmp_path) as (_, addr):
            c = await V3Client.connect(addr, new_session=False)
            hits = (await c.call(T.HISTORY_SEARCH, query="kiwi"))["hits"]
            assert {h["session_id"] for h in hits} == {new} and hits
            with pytest.raises(ReplyError) as err:                             # that session alone: said
                await c.call(T.HISTORY_SEARCH, query="kiwi", session_id=old)
            assert err.value.code == "STORAGE_ERROR"
            await c.close()
    assert any(r.levelno == logging.WARNING and f"skipped session {old}" in r.message for r in caplog.records)


# -- 5. a purging clear leaves no title or preview in index.json ----------------------------------

def _holding(root: Path, needle: bytes) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes())


async def test_a_purging_clear_rewrites_index_json_before_its_reply(tmp_path):
    root = tmp_path / "history"
    token = "zebra-7731-secret"
    (sid,) = await _seed(tmp_path, f"my {token} here")
    assert INDEX_NAME in _holding(root, token.encode())              # the preview (and title) in it
    slow_index = {"index_flush_ms": 3_600_000}
    async with running_server(tmp_path, storage=slow_index) as (_, addr):
        c = await V3Client.connect(addr, session_id=sid)
        assert c.session_id == sid
        await c.call(T.CLEAR_REQUEST, purge=True)
        assert _holding(root, token.encode()) == []                   # at once: no flush waited for
        await c.close()
