"""Knowledge-base fixtures: a started KnowledgeBase on tmp_path."""
from __future__ import annotations

import os
import sys
from typing import AsyncIterator

import pytest

from server.knowledge import KnowledgeBase, KnowledgeConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))     # for kb_testlib


@pytest.fixture
def kb_config() -> KnowledgeConfig:
    return KnowledgeConfig(chunk_target_chars=200, chunk_overlap_chars=40)


@pytest.fixture
async def kb(tmp_path, kb_config) -> AsyncIterator[KnowledgeBase]:
    k = KnowledgeBase(kb_config, tmp_path / "kb")
    await k.start()
    try:
        yield k
    finally:
        await k.close()
