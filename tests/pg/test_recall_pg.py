"""Recall on PostgreSQL with two nodes: what one node changed in a user's sessions (an edit, a
regenerate, a new session) reaches the other node's search, which nothing told about it."""
from __future__ import annotations

import os
import sys

from storage.config import StorageConfig
from storage.port import open_store

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "memory"))

from memory_testlib import changes_on_another_node  # noqa: E402


async def test_what_another_node_changed_reaches_this_nodes_search(pg_url, tmp_path):
    node_a = await open_store(StorageConfig(root=str(tmp_path / "a"), url=pg_url))
    node_b = await open_store(StorageConfig(root=str(tmp_path / "b"), url=pg_url))
    try:
        await changes_on_another_node(node_a, node_b)
    finally:
        await node_a.close()
        await node_b.close()
