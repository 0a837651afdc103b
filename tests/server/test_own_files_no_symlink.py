"""The server's own files outside the history store (the in-flight turns marker, the user memory
files) are never read or written through a symbolic link: a link planted in the data directory
cannot make the server read, append to or truncate a file elsewhere."""
from __future__ import annotations

import asyncio
import os

from server.inflight import InFlightTurns, read_marker
from server.memory.user_files import JsonUserMemoryStore
from server.memory.user_store import MemoryItem


def test_a_linked_turns_marker_is_removed_and_its_target_left_alone(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"+s_precious\nkeep me")
    marker = tmp_path / "data" / "turns_in_flight.log"
    marker.parent.mkdir()
    marker.symlink_to(outside)
    assert read_marker(str(marker)) == []              # not read through the link
    assert not marker.is_symlink()

    async def mark() -> None:
        turns = InFlightTurns(str(marker))
        try:
            await turns.started("s_1")
        finally:
            turns.close()
    marker.symlink_to(outside)                         # planted again while the server runs
    try:
        asyncio.run(mark())
    except OSError:
        pass                                           # refused: the marker is not written through it
    assert outside.read_bytes() == b"+s_precious\nkeep me"


async def test_a_linked_user_memory_file_is_moved_aside_not_read(tmp_path):
    root = tmp_path / "um"
    store = JsonUserMemoryStore(root)
    item = MemoryItem("m1", "fact", "The prod DB host is db-prod-42", "s1", 1, "2026-11-20T10:15:00+00:00")
    await store.add("alice", [item])
    path = next(root.iterdir())
    outside = tmp_path / "bob.json"
    os.replace(path, outside)                          # someone else's file, linked in its place
    path.symlink_to(outside)
    fresh = JsonUserMemoryStore(root)
    assert await fresh.list("alice") == []             # not read through the link
    assert any(p.is_symlink() for p in root.glob(path.name + ".corrupt.*")) and b"db-prod-42" in outside.read_bytes()
    await fresh.add("alice", [MemoryItem("m2", "fact", "The CI host is ci-3", "s1", 2, "x")])
    assert not path.is_symlink() and b"db-prod-42" in outside.read_bytes()
