"""Session id validation, StorageConfig validation and the root lock."""
from __future__ import annotations

import pytest

from storage import (InvalidSessionId, StorageConfig, StorageConfigError, StorageLocked, new_session_id,
                     validate_session_id)

BAD_IDS = [
    "", "../../etc/passwd", "s_20261122_../../../x", "s_20261122_7F3A9C01D2E4", "s_20261122_7f3a9c01d2e",
    "s_20261122_7f3a9c01d2e45", "s_2026112a_7f3a9c01d2e4", "x_20261122_7f3a9c01d2e4",
    "s_20261122_7f3a9c01d2e4\n", "s_20261122_7f3a9c01d2e/", "s_20261122-7f3a9c01d2e4",
    "s_２０２６１１２２_7f3a9c01d2e4", "s_20261122_7f3a9c01d2g4", "s_20261122_7f3a 9c01d2e4", "s_20261122_7f3a9c01d2e4\x00",
]


def test_new_ids_are_valid_and_unique() -> None:
    ids = {new_session_id() for _ in range(2000)}
    assert len(ids) == 2000
    for sid in list(ids)[:50]:
        assert validate_session_id(sid) == sid


@pytest.mark.parametrize("bad", BAD_IDS)
def test_bad_ids_rejected_with_clear_error(bad: str) -> None:
    with pytest.raises(InvalidSessionId, match=r"expected s_YYYYMMDD_<12 lowercase hex digits>") as ei:
        validate_session_id(bad)
    assert ei.value.code == "INVALID_MESSAGE"


@pytest.mark.parametrize("bad", [None, 5, b"s_20261122_7f3a9c01d2e4", ["x"]])
def test_non_string_ids_rejected(bad: object) -> None:
    with pytest.raises(InvalidSessionId, match="expected a string"):
        validate_session_id(bad)


def test_store_rejects_bad_ids_without_touching_files(open_store, root, tmp_path) -> None:
    store = open_store()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    for bad in ("../../etc/passwd", "s_20261122_../../../../tmp/x", "../history/index"):
        for call in (lambda: store.get(bad), lambda: store.append(bad, "user", "x"),
                     lambda: store.page(bad), lambda: store.purge(bad), lambda: store.export(bad, "json"),
                     lambda: store.search("u", "x", session_id=bad), lambda: store.clear(bad)):
            with pytest.raises(InvalidSessionId):
                call()
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_config_defaults_and_from_dict() -> None:
    c = StorageConfig.from_dict({})
    assert (c.root, c.durability, c.batch_ms, c.lru_size, c.idle_evict_s, c.max_message_bytes) == \
        ("storage/history", "fsync", 50, 512, 600.0, 1 << 20)
    c = StorageConfig.from_dict({"durability": "batched", "batch_ms": 5, "compact_threshold": 100, "idle_evict_s": 3})
    assert (c.durability, c.batch_ms, c.compact_threshold, c.idle_evict_s) == ("batched", 5, 100, 3.0)


@pytest.mark.parametrize("d, msg", [
    ({"batch_ms": "x"}, r"\[storage\] batch_ms: expected an integer in 1\.\.10000, got 'x'"),
    ({"batch_ms": 0}, r"\[storage\] batch_ms: expected a value in 1\.\.10000, got 0"),
    ({"lru_size": True}, r"\[storage\] lru_size: expected an integer"),
    ({"durability": "sometimes"}, r"\[storage\] durability: expected one of fsync, batched, got 'sometimes'"),
    ({"root": ""}, r"\[storage\] root: expected a non-empty string"),
    ({"idle_evict_s": "soon"}, r"\[storage\] idle_evict_s: expected a number"),
    ({"max_message_bytes": 10}, r"\[storage\] max_message_bytes: expected a value in 1024\.\."),
    ({"bogus": 1}, r"\[storage\] bogus: unknown key \(allowed: .*batch_ms"),
])
def test_config_errors_are_precise(d: dict, msg: str) -> None:
    with pytest.raises(StorageConfigError, match=msg) as ei:
        StorageConfig.from_dict(d)
    assert isinstance(ei.value, ValueError)
    assert ei.value.path.startswith("storage.")


def test_second_store_on_same_root_is_refused(open_store) -> None:
    open_store()
    with pytest.raises(StorageLocked, match="already in use"):
        open_store()
