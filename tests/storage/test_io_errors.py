"""Real failing writes (ENOSPC from write, EIO from fsync): the store raises StorageIOError (code
STORAGE_ERROR, not NOT_FOUND), acknowledges nothing, shows nothing half-written, and keeps working
once writes succeed again."""
from __future__ import annotations

import asyncio
import errno
import os

import pytest

import storage.fsio
from protocol import ErrorCode
from storage import AsyncHistoryStore, NotFound, StorageConfig, StorageError, StorageIOError
from storage_testlib import journal_path

_real_write = os.write


def _fail_journal_writes(monkeypatch) -> None:
    """os.write raises ENOSPC for journal files only (like a full disk), everything else works."""
    def write(fd: int, data) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".journal"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return _real_write(fd, data)
    monkeypatch.setattr(os, "write", write)


def _fail_fsync(monkeypatch) -> None:
    def sync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(storage.fsio, "datasync", sync)


def test_storage_io_error_is_distinct_from_not_found() -> None:
    assert issubclass(StorageIOError, StorageError) and not issubclass(StorageIOError, NotFound)
    assert StorageIOError.code == ErrorCode.STORAGE_ERROR == "STORAGE_ERROR"


def test_full_disk_append_is_not_stored_and_the_store_recovers(open_store, root, monkeypatch) -> None:
    store = open_store()
    sid = store.create("u").session_id
    store.append(sid, "user", "kept")
    before = journal_path(root, sid).read_bytes()
    with monkeypatch.context() as m:
        _fail_journal_writes(m)
        with pytest.raises(StorageIOError) as ei:
            store.append(sid, "assistant", "lost to a full disk")
        assert ei.value.code == "STORAGE_ERROR" and "No space left" in ei.value.message
        with pytest.raises(StorageIOError):
            store.rename(sid, "new title")
    assert journal_path(root, sid).read_bytes() == before            # nothing half-written on disk
    assert [m.content for m in store.messages(sid)] == ["kept"]     # nor in memory
    assert store.get(sid).title != "new title"
    m2 = store.append(sid, "assistant", "after the disk has room")   # works again, same id sequence
    assert m2.id == 2
    store.close()
    store = open_store()
    assert [(m.id, m.content) for m in store.messages(sid)] == [(1, "kept"), (2, "after the disk has room")]


def test_failed_fsync_is_not_acknowledged_and_not_visible(open_store, root, monkeypatch) -> None:
    store = open_store()
    sid = store.create("u").session_id
    store.append(sid, "user", "durable")
    before = journal_path(root, sid).read_bytes()
    with monkeypatch.context() as m:
        _fail_fsync(m)
        with pytest.raises(StorageIOError, match="durable"):
            store.append(sid, "assistant", "written but never fsynced")
    # the journal was cut back to its durable length and the session reloaded from disk
    assert journal_path(root, sid).read_bytes() == before
    assert [m.content for m in store.messages(sid)] == ["durable"]
    assert store.get(sid).message_count == 1
    assert store.append(sid, "assistant", "fsync works again").id == 2
    store.close()
    store = open_store()
    assert [m.content for m in store.messages(sid)] == ["durable", "fsync works again"]


def test_failed_snapshot_write_on_create(open_store, root, monkeypatch) -> None:
    store = open_store()
    with monkeypatch.context() as m:
        def write(fd: int, data) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        m.setattr(os, "write", write)
        with pytest.raises(StorageIOError):
            store.create("u", "never created")
    assert store.list("u")[0] == []
    assert not list(root.glob("session_*"))                          # no temp file left either
    assert store.create("u", "created").title == "created"


def test_async_append_reports_a_failed_fsync(root, monkeypatch) -> None:
    async def main() -> None:
        store = await AsyncHistoryStore.open(StorageConfig(root=str(root)))
        try:
            sid = (await store.create("u")).session_id
            with monkeypatch.context() as m:
                _fail_fsync(m)
                with pytest.raises(StorageIOError):
                    await store.append(sid, "user", "not durable")
            assert [x.content for x in await store.messages(sid)] == []
            assert (await store.append(sid, "user", "durable")).id == 1
        finally:
            await store.close()
    asyncio.run(main())
