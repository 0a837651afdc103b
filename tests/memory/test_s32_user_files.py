"""Review s32: an unreadable user memory file is moved aside under a name no later one takes: two
damaged files of the same user in a row are both kept (before, the second ``os.replace`` to
``<name>.corrupt`` overwrote the first copy)."""
from __future__ import annotations

import os
import re

from server.memory.user_files import JsonUserMemoryStore, set_aside
from server.memory.user_store import MemoryItem

ASIDE_RE = re.compile(r"[0-9a-f]{32}\.json\.corrupt\.[0-9]{8}T[0-9]{6}(\.[0-9]+)?")


async def test_a_second_unreadable_file_does_not_overwrite_the_first_copy(tmp_path):
    root = tmp_path / "um"
    await JsonUserMemoryStore(root).add("alice", [MemoryItem("m1", "fact", "first", "s1", 1, "x")])
    path = next(root.iterdir())
    path.write_text("{first damage")
    assert await JsonUserMemoryStore(root).list("alice") == []          # moved aside, starts empty
    store = JsonUserMemoryStore(root)
    await store.add("alice", [MemoryItem("m2", "fact", "second", "s1", 2, "x")])
    path.write_text("{second damage")
    assert await JsonUserMemoryStore(root).list("alice") == []
    aside = sorted(p for p in os.listdir(root) if p != path.name)
    assert len(aside) == 2 and all(ASIDE_RE.fullmatch(p) for p in aside), aside
    assert sorted((root / p).read_text() for p in aside) == ["{first damage", "{second damage"]
    assert not path.exists()


def test_set_aside_never_takes_an_existing_name_and_moves_a_link_itself(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text("someone else's")
    names = []
    for n in range(3):
        p = tmp_path / "u.json"
        if n == 2:
            p.symlink_to(outside)
        else:
            p.write_text(f"copy {n}")
        names.append(set_aside(str(p)))
        assert not os.path.lexists(p)
    assert len(set(names)) == 3 and all(os.path.lexists(n) for n in names)
    assert [open(n).read() for n in names[:2]] == ["copy 0", "copy 1"]
    assert os.path.islink(names[2]) and outside.read_text() == "someone else's"
