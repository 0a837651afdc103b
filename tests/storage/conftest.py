"""Fixtures for storage tests: real stores on real files under tmp_path, always closed."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from storage import HistoryStore, StorageConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # for storage_testlib


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "history"


@pytest.fixture
def open_store(root: Path) -> Iterator[Callable[..., HistoryStore]]:
    stores: list[HistoryStore] = []

    def _open(**kw) -> HistoryStore:
        kw.setdefault("root", str(root))
        store = HistoryStore(StorageConfig(**kw))
        stores.append(store)
        return store

    yield _open
    for s in stores:
        s.close()
