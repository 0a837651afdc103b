"""A change in flight while the store closes: kept and acknowledged, or refused before anything of it
is written; never reported as failed while the close writes it to disk anyway."""
from __future__ import annotations

import threading

import pytest

from storage import HistoryStore, StorageConfig, StorageError
from storage_testlib import wait_for


@pytest.mark.parametrize("durability", ["fsync", "batched"])
@pytest.mark.parametrize("queued", [False, True], ids=["written", "queued"])
def test_a_change_in_flight_when_the_store_closes_is_kept_and_acknowledged(root, monkeypatch, durability, queued):
    store = HistoryStore(StorageConfig(root=str(root), durability=durability))
    sid = store.create("u").session_id
    store.append(sid, "user", "first")                  # loaded, journal open (append_loaded can queue)
    reached, go = threading.Event(), threading.Event()
    schedule = store.compactor.maybe_schedule

    def held(sess) -> None:                             # the change is written and applied, not yet requested
        reached.set()
        assert go.wait(10)
        schedule(sess)
    monkeypatch.setattr(store.compactor, "maybe_schedule", held)
    outcome: dict[str, object] = {}

    def write() -> None:
        try:
            if queued:
                got = store.append_loaded(sid, "user", "in flight")
                assert got is not None
                got[1].result(timeout=10)
                outcome["id"] = got[0].id
            else:
                outcome["id"] = store.append(sid, "user", "in flight").id
        except StorageError as exc:
            outcome["error"] = exc
    writer = threading.Thread(target=write)
    writer.start()
    assert reached.wait(10)
    closer = threading.Thread(target=store.close)
    closer.start()
    wait_for(lambda: store.flusher._refusing)          # the close waits for the admitted change
    with pytest.raises(StorageError):
        store.append(sid, "user", "after the close began")     # refused, nothing written
    go.set()
    writer.join(10)
    closer.join(10)
    assert not writer.is_alive() and not closer.is_alive()
    assert outcome == {"id": 2}                         # acknowledged ...
    with HistoryStore(StorageConfig(root=str(root), durability=durability)) as again:
        assert [m.content for m in again.messages(sid)] == ["first", "in flight"]     # ... and kept


def test_a_commit_after_the_close_began_is_refused_before_it_is_written(root):
    store = HistoryStore(StorageConfig(root=str(root)))
    sid = store.create("u").session_id
    store.append(sid, "user", "first")
    store.flusher.admit()                               # a commit under way holds the close back
    closer = threading.Thread(target=store.close)
    closer.start()
    wait_for(lambda: store.flusher._refusing)
    with pytest.raises(StorageError, match="closing"):
        store.flusher.admit()
    assert closer.is_alive()
    store.flusher.withdraw()                            # it failed before writing: the close goes on
    closer.join(10)
    assert not closer.is_alive()
    with HistoryStore(StorageConfig(root=str(root))) as again:
        assert [m.content for m in again.messages(sid)] == ["first"]
