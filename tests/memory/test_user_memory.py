"""Long-term user memory: rules (English and Chinese), the crash-safe JSON store, injection into the
prompts of other sessions with its own budget and source, isolation between users, config off,
forgetting on clear, and the summary model as distiller."""
from __future__ import annotations

import logging
import os

import pytest

from memory_testlib import OfflineStub, ScriptedSummarizer, store_turn
from server.memory import MemoryConfig, MemoryManager
from server.memory.context import MEMORY_HEADER
from server.memory.distill import distill_rules, distill_with_model, parse_model_answer
from server.memory.user_store import JsonUserMemoryStore, MemoryItem


def config(**um) -> MemoryConfig:
    return MemoryConfig.from_dict({"summarization": {"enabled": False}, "user_memory": um})


def manager(store, tmp_path, agent=None, **um) -> MemoryManager:
    cfg = config(**um)
    return MemoryManager(cfg, store, agent or OfflineStub(), None, "SYS",
                         user_store=JsonUserMemoryStore(tmp_path / "um", cfg.user_memory.max_items))


def memory_block(ctx) -> str | None:
    blocks = [m["content"] for m in ctx.messages if m["role"] == "system" and m["content"].startswith(MEMORY_HEADER)]
    assert len(blocks) <= 1
    return blocks[0] if blocks else None


@pytest.mark.parametrize("text, expected", [
    ("The prod DB host is db-prod-42.", [("fact", "The prod DB host is db-prod-42.")]),
    ("Please always answer in Chinese.", [("preference", "Please always answer in Chinese.")]),
    ("I prefer short answers with the commands first.", [("preference", "I prefer short answers with the commands first.")]),
    ("我叫小王。以后请用中文回答。我们的数据库在杭州。",
     [("fact", "我叫小王。"), ("preference", "以后请用中文回答。"), ("fact", "我们的数据库在杭州。")]),
    ("What is the prod DB host?", []),
    ("数据库在哪里？", []),
    ("Check disk usage on web1", []),
    ("my password is hunter2", []),           # secrets are never kept
    # the words that only ask to keep something are not kept with it
    ("Remember that the staging server is stage-7.internal", [("fact", "The staging server is stage-7.internal")]),
    ("note: the backup bucket is s3://bk-3", [("fact", "The backup bucket is s3://bk-3")]),
    ("记住我们的备份服务器在杭州机房。", [("fact", "我们的备份服务器在杭州机房。")]),
    ("Remember to check the disk", [("fact", "Remember to check the disk")]),   # a reminder: kept whole
])
def test_rules_keep_durable_statements_only(text, expected):
    assert distill_rules(text) == expected


def test_model_answers_are_parsed_or_refused():
    assert parse_model_answer('[{"kind": "preference", "text": "answer in Chinese"}]') == \
        [("preference", "answer in Chinese")]
    assert parse_model_answer("[]") == []
    assert parse_model_answer("no json here") is None
    assert parse_model_answer('[{"kind": "fact"}]') is None


async def test_store_is_atomic_isolated_and_survives_a_corrupt_file(tmp_path):
    root = tmp_path / "um"
    s = JsonUserMemoryStore(root, max_items=3)
    item = MemoryItem("m1", "fact", "prod DB host is db-prod-42", "s1", 1, "2026-11-20T10:15:00+00:00")
    assert await s.add("alice", [item]) == [item]
    assert await s.add("alice", [MemoryItem("m2", "fact", "Prod  DB host is db-prod-42", "s2", 3, "x")]) == []
    assert [i.id for i in await JsonUserMemoryStore(root).list("alice")] == ["m1"]     # read back from disk
    assert await s.list("bob") == []
    for n in range(5):                          # max_items: the oldest go first
        await s.add("alice", [MemoryItem(f"n{n}", "fact", f"fact {n}", "s1", n, "x")])
    assert [i.id for i in await s.list("alice")] == ["n2", "n3", "n4"]
    assert not [p for p in os.listdir(root) if p.endswith(".tmp")]
    path = next(root.iterdir())
    path.write_text("{not json")
    fresh = JsonUserMemoryStore(root)
    assert await fresh.list("alice") == []
    assert os.path.exists(str(path) + ".corrupt")
    assert await fresh.forget("alice", "nope") is False


async def test_a_fact_from_one_session_reaches_the_prompt_of_another(store, tmp_path):
    mm = manager(store, tmp_path)
    a = (await store.create("alice")).session_id
    await store_turn(store, mm, a, "alice", "The prod DB host is db-prod-42. Please check its disk.", "Disk ok.",
                     timestamp="2026-11-20T10:15:00+00:00")
    await store_turn(store, mm, a, "alice", "Always answer in Chinese.", "好的。")
    await mm.wait_idle()
    b = (await store.create("alice")).session_id
    ctx, _ = await store_turn(store, mm, b, "alice", "ssh into the prod database host please", "ok")
    block = memory_block(ctx)
    assert block is not None
    assert f"- The prod DB host is db-prod-42. (session {a}, 2026-11-20 10:15 UTC)" in block
    assert "Always answer in Chinese." in block                       # preferences always come
    items = {i.text: i.id for i in await mm.user_memory.list("alice")}
    assert set(ctx.metadata["memory_items"]) == {items["The prod DB host is db-prod-42."],
                                                  items["Always answer in Chinese."]}
    assert ctx.metadata["memory_dropped"] == 0
    # an unrelated question gets the preference only; the session itself never gets its own items
    ctx, _ = await store_turn(store, mm, b, "alice", "list nginx workers", "ok")
    assert "db-prod-42" not in (memory_block(ctx) or "")
    ctx, _ = await store_turn(store, mm, a, "alice", "ssh into the prod database host please", "ok")
    assert memory_block(ctx) is None
    await mm.aclose()


async def test_no_item_leaks_across_users(store, tmp_path):
    mm = manager(store, tmp_path)
    users = [f"user{n}" for n in range(6)]
    for n, u in enumerate(users):
        sid = (await store.create(u)).session_id
        await store_turn(store, mm, sid, u, f"The prod DB host is private-host-{n}. Answer in French.", "noted")
    await mm.wait_idle()
    probes = leaks = 0
    for n, u in enumerate(users):
        sid = (await store.create(u)).session_id
        ctx, _ = await store_turn(store, mm, sid, u, "which prod DB host do we use? private host", "ok")
        text = str(ctx.messages)
        for m, _ in enumerate(users):
            probes += 1
            leaks += (f"private-host-{m}" in text) != (m == n)
        probes += 1
        leaks += not {i.id for i in await mm.user_memory.list(u)} >= set(ctx.metadata["memory_items"])
    assert probes == 42 and leaks == 0
    await mm.aclose()


async def test_turned_off_by_config(store, tmp_path):
    mm = manager(store, tmp_path, enabled=False)
    assert mm.user_memory is None
    a = (await store.create("alice")).session_id
    await store_turn(store, mm, a, "alice", "The prod DB host is db-prod-42.", "ok")
    await mm.wait_idle()
    b = (await store.create("alice")).session_id
    ctx, _ = await store_turn(store, mm, b, "alice", "prod DB host?", "ok")
    assert memory_block(ctx) is None and ctx.metadata["memory_items"] == []
    assert not (tmp_path / "um").exists()
    await mm.aclose()


async def test_budget_is_its_own_and_lowest_ranked_items_go_first(store, tmp_path):
    mm = manager(store, tmp_path, token_budget=40)
    a = (await store.create("alice")).session_id
    for n in range(6):
        await store_turn(store, mm, a, "alice", f"The backup host of cluster {n} is bk-{n}-prod.", "ok")
    await mm.wait_idle()
    b = (await store.create("alice")).session_id
    ctx, _ = await store_turn(store, mm, b, "alice", "backup host of the cluster?", "ok")
    assert mm.counter.count(memory_block(ctx).split("\n", 1)[1]) <= 40
    assert 1 <= len(ctx.metadata["memory_items"]) < 6
    await mm.aclose()


async def test_clear_forgets_what_the_session_taught(store, tmp_path):
    mm = manager(store, tmp_path)
    a = (await store.create("alice")).session_id
    await store_turn(store, mm, a, "alice", "The vault host is vault-7.", "noted")
    await mm.wait_idle()
    assert [i.text for i in await mm.user_memory.list("alice")] == ["The vault host is vault-7."]
    await store.clear(a)
    mm.forget_session(a, "alice", cleared=True)
    b = (await store.create("alice")).session_id
    ctx, _ = await store_turn(store, mm, b, "alice", "what is the vault host?", "unknown")   # at once: hidden
    assert "vault-7" not in str(ctx.messages)
    await mm.wait_idle()
    assert await mm.user_memory.list("alice") == []
    files = list((tmp_path / "um").iterdir())
    assert all("vault-7" not in f.read_text() for f in files)
    await mm.aclose()


async def test_the_summary_model_distills_when_configured(store, tmp_path):
    agent = ScriptedSummarizer(['[{"kind": "preference", "text": "Answers in Chinese"}]'])
    cfg = MemoryConfig.from_dict({"summarization": {"enabled": False, "model": "small"}})
    mm = MemoryManager(cfg, store, agent, None, "SYS", user_store=JsonUserMemoryStore(tmp_path / "um"))
    a = (await store.create("alice")).session_id
    await store_turn(store, mm, a, "alice", "please, from now on, 中文", "好")
    await mm.wait_idle()
    items = await mm.user_memory.list("alice")
    assert [(i.kind, i.text, i.source) for i in items] == [("preference", "Answers in Chinese", "model")]
    assert agent.calls[0][1] == "small" and "please, from now on, 中文" in str(agent.calls[0][0])
    await mm.aclose()


async def test_a_failing_distiller_is_logged_and_the_rules_answer(caplog):
    agent = ScriptedSummarizer([RuntimeError("model endpoint down")])
    with caplog.at_level(logging.WARNING, logger="nplt.memory"):
        found = await distill_with_model(agent, "small", "my prod database host is db-prod-42")
    assert found == distill_rules("my prod database host is db-prod-42") and found
    assert any("RuntimeError: model endpoint down" in r.getMessage() for r in caplog.records)
