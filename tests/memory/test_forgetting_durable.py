"""Forgetting is durable: a forgotten long-term memory item does not come back when the session's
messages are distilled again (a restart, an evicted cache, a real server process restarted), a
clear killed (SIGKILL) between the history change and the removal of the items does not bring them
back either, and learning follows ``user_memory.enabled`` alone (recall and summaries off too)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from memory_testlib import OfflineStub, store_turn
from protocol import MsgType as T
from server.memory import MemoryConfig, MemoryManager
from server.memory.user_files import JsonUserMemoryStore
from server.memory.user_store import MemoryItem
from storage import AsyncHistoryStore, StorageConfig
from testkit.process import ServerProcess
from testkit.server import V3Client, poll

SRC = str(Path(__file__).resolve().parents[2] / "src")


def manager(store, root: Path, **sections) -> MemoryManager:
    cfg = MemoryConfig.from_dict({"summarization": {"enabled": False}, **sections})
    return MemoryManager(cfg, store, OfflineStub(), None, "SYS", user_store=JsonUserMemoryStore(root))


def texts(root: Path) -> str:
    return "".join(p.read_text() for p in root.iterdir()) if root.exists() else ""


async def test_a_forgotten_item_stays_forgotten_after_a_restart_and_an_evicted_cache(tmp_path):
    hist, um = tmp_path / "history", tmp_path / "um"
    store = AsyncHistoryStore(StorageConfig(root=str(hist), durability="batched"))
    mm = manager(store, um, context={"max_sessions_cached": 1})
    a = (await store.create("alice")).session_id
    await store_turn(store, mm, a, "alice", "The vault host is vault-7.", "noted")
    await mm.wait_idle()
    [item] = await mm.user_memory.list("alice")
    assert await mm.user_memory.forget("alice", item.id)
    b = (await store.create("alice")).session_id          # evicts a's view and learned position
    await store_turn(store, mm, b, "alice", "check disk on web1", "ok")
    await store_turn(store, mm, a, "alice", "check disk on web2", "ok")
    await mm.wait_idle()
    assert await mm.user_memory.list("alice") == []
    await mm.aclose()
    await store.close()

    store = AsyncHistoryStore(StorageConfig(root=str(hist), durability="batched"))    # a restart
    mm = manager(store, um)
    await store_turn(store, mm, a, "alice", "The backup host is bk-3.", "ok")
    await mm.wait_idle()
    assert [i.text for i in await mm.user_memory.list("alice")] == ["The backup host is bk-3."]
    assert "vault-7" not in texts(um)
    c = (await store.create("alice")).session_id
    ctx, _ = await store_turn(store, mm, c, "alice", "what is the vault host?", "?")
    assert "vault-7" not in str(ctx.messages)
    await mm.aclose()
    await store.close()


async def test_a_forgotten_statement_is_not_added_back_from_its_message_but_a_new_one_is(tmp_path):
    s = JsonUserMemoryStore(tmp_path / "um")
    item = MemoryItem("m1", "fact", "The vault host is vault-7.", "s1", 1, "x")
    assert await s.add("alice", [item], learned=("s1", 1)) == [item]
    assert await s.learned("alice", "s1") == 1 and await s.learned("alice", "s2") == 0
    assert await s.forget("alice", "m1")
    again = MemoryItem("m2", "fact", "the vault host is  vault-7", "s1", 1, "x")
    assert await JsonUserMemoryStore(tmp_path / "um").add("alice", [again]) == []        # tombstone, from disk
    said_again = MemoryItem("m3", "fact", "The vault host is vault-7.", "s1", 9, "y")    # said once more, later
    assert await s.add("alice", [said_again]) == [said_again]


async def test_learning_follows_user_memory_enabled_alone(tmp_path, store):
    mm = manager(store, tmp_path / "um", recall={"enabled": False})
    assert not mm.config.recall.enabled and not mm.config.summarization.enabled
    a = (await store.create("bob")).session_id
    await store_turn(store, mm, a, "bob", "The prod DB host is db-9.", "ok")
    await mm.wait_idle()
    assert [i.text for i in await mm.user_memory.list("bob")] == ["The prod DB host is db-9."]
    b = (await store.create("bob")).session_id
    ctx, _ = await store_turn(store, mm, b, "bob", "which prod DB host?", "db-9")
    assert "db-9" in str(ctx.messages)
    await mm.aclose()


CLEAR_THEN_DIE = """
import asyncio, os, signal, sys
sys.path[:0] = [{tests!r}]
from memory_testlib import OfflineStub
from server.memory import MemoryConfig, MemoryManager
from server.memory.user_files import JsonUserMemoryStore
from storage import AsyncHistoryStore, StorageConfig

async def main():
    store = AsyncHistoryStore(StorageConfig(root={hist!r}))
    mm = MemoryManager(MemoryConfig.from_dict({{"summarization": {{"enabled": False}}}}), store, OfflineStub(),
                       None, "SYS", user_store=JsonUserMemoryStore({um!r}))
    await mm.begin_forget({sid!r}, "alice")          # what SessionService.clear does first
    await store.{op}({sid!r})                         # the history change is durable
    os.kill(os.getpid(), signal.SIGKILL)             # killed before the items are removed
asyncio.run(main())
"""


async def test_a_clear_or_delete_killed_before_the_items_are_removed_does_not_bring_them_back(tmp_path):
    for op in ("clear", "delete"):
        hist, um = tmp_path / op / "history", tmp_path / op / "um"
        store = AsyncHistoryStore(StorageConfig(root=str(hist)))
        mm = manager(store, um)
        a = (await store.create("alice")).session_id
        await store_turn(store, mm, a, "alice", "The vault host is vault-7.", "noted")
        await store_turn(store, mm, (await store.create("alice")).session_id, "alice", "Answer in French.", "ok")
        await mm.wait_idle()
        assert len(await mm.user_memory.list("alice")) == 2
        await mm.aclose()
        await store.close()

        code = CLEAR_THEN_DIE.format(tests=str(Path(__file__).parent), hist=str(hist), um=str(um), sid=a, op=op)
        proc = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", code], capture_output=True,
                                       env={**os.environ, "PYTHONPATH": SRC}, timeout=60)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
        assert "vault-7" in texts(um)                  # the removal never ran: still in the file...
        assert a in json.loads(next(um.iterdir()).read_text())["pending"]

        store = AsyncHistoryStore(StorageConfig(root=str(hist)))          # ...until the next start
        mm = manager(store, um)
        assert [i.text for i in await mm.user_memory.list("alice")] == ["Answer in French."]
        assert "vault-7" not in texts(um) and json.loads(next(um.iterdir()).read_text())["pending"] == []
        b = (await store.create("alice")).session_id
        ctx, _ = await store_turn(store, mm, b, "alice", "what is the vault host?", "?")
        assert "vault-7" not in str(ctx.messages)
        await mm.aclose()
        await store.close()


async def test_a_forgotten_item_stays_forgotten_after_a_real_server_restart(tmp_path):
    data = tmp_path / "data"
    srv = await ServerProcess.start(data)
    try:
        c = await V3Client.connect(srv.addr)
        sid = c.session_id
        r = await c.call(T.CHAT_TEXT, text="The vault host is vault-7.")
        assert (await c.turn_events(r["turn_id"], timeout=30))[-1].type == T.TURN_END

        async def learned() -> bool:
            return len((await c.call(T.MEMORY_LIST))["items"]) == 1
        await poll(learned, timeout=30)
        [item] = (await c.call(T.MEMORY_LIST))["items"]
        await c.call(T.MEMORY_FORGET, item_id=item["id"])
        await c.close()
    finally:
        srv.kill()                                     # no orderly shutdown either
    srv = await ServerProcess.start(data)
    try:
        c = await V3Client.connect(srv.addr, session_id=sid)
        r = await c.call(T.CHAT_TEXT, text="The backup host is bk-3.")
        assert (await c.turn_events(r["turn_id"], timeout=30))[-1].type == T.TURN_END

        async def learned_new() -> bool:
            return len((await c.call(T.MEMORY_LIST))["items"]) >= 1
        await poll(learned_new, timeout=30)
        assert [i["text"] for i in (await c.call(T.MEMORY_LIST))["items"]] == ["The backup host is bk-3."]
        await c.close()
    finally:
        assert await srv.stop() == 0


async def test_items_are_hidden_from_the_mark_until_removed_and_not_after(tmp_path, store):
    mm = manager(store, tmp_path / "um")
    a = (await store.create("alice")).session_id
    await store_turn(store, mm, a, "alice", "The vault host is vault-7.", "noted")
    await mm.wait_idle()
    b = (await store.create("alice")).session_id
    await mm.begin_forget(a, "alice")
    await mm.begin_forget(a, "alice")                  # two clears of the same session at once
    ctx, _ = await store_turn(store, mm, b, "alice", "what is the vault host?", "?")
    assert "vault-7" not in str(ctx.messages)          # hidden from the mark on
    mm.forget_session(a)                               # a plain index reset (regenerate) meanwhile
    await store.clear(a)
    mm.forget_session(a, "alice", cleared=True)        # the first clear ends: the second still marks it
    await mm.wait_idle()
    assert a in json.loads(next((tmp_path / "um").iterdir()).read_text())["pending"]
    ctx, _ = await store_turn(store, mm, b, "alice", "what is the vault host?", "?")
    assert "vault-7" not in str(ctx.messages)
    mm.forget_session(a, "alice", cleared=True)
    await mm.wait_idle()
    assert await mm.user_memory.list("alice") == [] and "vault-7" not in texts(tmp_path / "um")
    assert json.loads(next((tmp_path / "um").iterdir()).read_text())["pending"] == []
    await store_turn(store, mm, a, "alice", "The backup host is bk-3.", "ok")   # learned again after the clear
    await mm.wait_idle()
    ctx, _ = await store_turn(store, mm, b, "alice", "which backup host?", "?")
    assert "bk-3" in str(ctx.messages)                 # not hidden any more
    await mm.aclose()


async def test_a_statement_said_twice_in_a_session_stays_forgotten_after_a_restart(tmp_path):
    hist, um = tmp_path / "history", tmp_path / "um"
    store = AsyncHistoryStore(StorageConfig(root=str(hist), durability="batched"))
    mm = manager(store, um)
    a = (await store.create("alice")).session_id
    await store_turn(store, mm, a, "alice", "The vault host is vault-7.", "noted")
    await store_turn(store, mm, a, "alice", "the vault host is  vault-7", "noted")       # known already
    await mm.wait_idle()
    [item] = await mm.user_memory.list("alice")
    assert await mm.user_memory.forget("alice", item.id)
    await mm.aclose()
    await store.close()
    store = AsyncHistoryStore(StorageConfig(root=str(hist), durability="batched"))
    mm = manager(store, um)
    await store_turn(store, mm, a, "alice", "check disk on web1", "ok")     # the tail is distilled again
    await mm.wait_idle()
    assert await mm.user_memory.list("alice") == []
    await mm.aclose()
    await store.close()


async def test_a_fact_acknowledged_by_turn_end_survives_a_sigkill_right_after(tmp_path):
    data = tmp_path / "data"
    srv = await ServerProcess.start(data)
    try:
        c = await V3Client.connect(srv.addr)
        told_in = c.session_id
        r = await c.call(T.CHAT_TEXT, text="Remember that the staging server is stage-7.internal")
        end = (await c.turn_events(r["turn_id"], timeout=30))[-1]
        assert end.type == T.TURN_END and end.body["message"]["content"].startswith("Noted:")
    finally:
        srv.kill()                                     # at once: no orderly shutdown, no background work
    srv = await ServerProcess.start(data)
    try:
        c = await V3Client.connect(srv.addr)
        items = (await c.call(T.MEMORY_LIST))["items"]   # no waiting: stored before the TURN_END
        assert [(i["text"], i["session_id"]) for i in items] == [("The staging server is stage-7.internal", told_in)]
        await c.call(T.SESSION_NEW)
        r = await c.call(T.CHAT_TEXT, text="what is the staging server?")
        end = (await c.turn_events(r["turn_id"], timeout=30))[-1]
        assert "stage-7.internal" in end.body["message"]["content"]
        await c.close()
    finally:
        assert await srv.stop() == 0
