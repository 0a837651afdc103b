"""Memory-layer test fixtures: a real HistoryStore on tmp_path, scripted summarizer agents, and
Hypothesis profiles ("long" for ``make fuzz``; NPLT_FUZZ=1 selects it too).
"""
from __future__ import annotations

import os
import sys
from typing import AsyncIterator

import pytest
from hypothesis import HealthCheck, settings

from storage import AsyncHistoryStore, StorageConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))     # for memory_testlib

settings.register_profile(
    "long", max_examples=3000, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
if os.environ.get("NPLT_FUZZ"):
    settings.load_profile("long")


@pytest.fixture
async def store(tmp_path) -> AsyncIterator[AsyncHistoryStore]:
    s = AsyncHistoryStore(StorageConfig(root=str(tmp_path / "history"), durability="batched"))
    try:
        yield s
    finally:
        await s.close()
