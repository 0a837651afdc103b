"""User memory's per-user locks (review s32): a user's lock exists only while an operation holds or
awaits it, so the store does not keep one Lock per user ever seen; operations of one user still run
one at a time."""
from __future__ import annotations

import asyncio

from server.memory.user_files import JsonUserMemoryStore
from server.memory.user_store import MemoryItem
from testkit.server import poll

WHEN = "2026-11-27T10:00:00+00:00"


def said(text: str, message: int) -> MemoryItem:
    return MemoryItem(f"m{message}", "fact", text, "s1", message, WHEN)


async def test_idle_users_hold_no_lock(tmp_path):
    store = JsonUserMemoryStore(tmp_path / "um")
    for n in range(120):
        user = f"user{n}"
        await store.add(user, [said(f"{user} likes tea", 1)], learned=("s1", 1))
        assert [i.text for i in await store.list(user)] == [f"{user} likes tea"]
        assert await store.learned(user, "s1") == 1
        await store.mark_forgetting(user, "s9")
        await store.forget_session(user, "s9")
    assert store._locks == {}


async def test_one_users_operations_still_run_one_at_a_time(tmp_path):
    store = JsonUserMemoryStore(tmp_path / "um")
    async with store._lock("alice"):                 # an operation under way
        reader = asyncio.create_task(store.list("alice"))
        await poll(lambda: store._locks["alice"].users == 2, what="the reader waits for alice's lock")
        assert not reader.done() and list(store._locks) == ["alice"]
    assert await reader == [] and store._locks == {}
    # many at once: each add sees the one before (no lost update), the lock goes with the last
    await asyncio.gather(*(store.add("alice", [said(f"fact number {k}", k)]) for k in range(1, 21)))
    assert sorted(i.message_id for i in await store.list("alice")) == list(range(1, 21))
    assert store._locks == {}


async def test_a_cancelled_waiter_leaves_no_lock_behind(tmp_path):
    store = JsonUserMemoryStore(tmp_path / "um")
    async with store._lock("bob"):
        waiter = asyncio.create_task(store.list("bob"))
        await poll(lambda: store._locks["bob"].users == 2, what="the waiter waits for bob's lock")
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert store._locks["bob"].users == 1
    assert store._locks == {}
