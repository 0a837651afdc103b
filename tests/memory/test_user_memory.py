"""Long-term user memory: rules (English and Chinese), the crash-safe JSON store, injection into the
prompts of other sessions with its own budget and source, isolation between users, config off,
forgetting on clear, and the summary model as distiller."""
from __future__ import annotations

import json
import logging
import os

import pytest

from memory_testlib import OfflineStub, ScriptedSummarizer, store_turn
from server.memory import MemoryConfig, MemoryManager
from server.memory.context import MEMORY_HEADER
from server.memory.distill import distill_rules, subject_key
from server.memory.distill_model import distill_with_model, parse_model_answer
from server.memory.user_memory import item_subject
from server.memory.user_files import JsonUserMemoryStore, UserFiles
from server.memory.user_store import MemoryItem


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
    ("My ssh passphrase is correct-horse-battery", []),
    ("我们的服务器密钥是 sk-live-abc123", []),
    ("My deploy id is AKIAABCDEFGHIJKLMNOP", []),
    ("I don't think the cache port is 6380.", []),     # nor what the user does not state as true
    ("Bob said the db host is db-9", []),
    ("Redis port: 6380", [("fact", "Redis port: 6380")]),
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
    assert parse_model_answer('[{"kind": "fact", "text": "My ssh passphrase is correct-horse-battery"}, '
                              '{"kind": "fact", "text": "The deploy id is AKIAABCDEFGHIJKLMNOP"}, '
                              '{"kind": "fact", "text": "The prod DB host is db-prod-42"}]') == \
        [("fact", "The prod DB host is db-prod-42")]           # secrets are dropped from the model's items too


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
    assert [p for p in os.listdir(root) if p.startswith(path.name + ".corrupt.")]   # set aside, never overwritten
    assert await fresh.forget("alice", "nope") is False


async def test_an_update_that_lost_a_race_is_done_again_on_the_stored_document(tmp_path):
    root = tmp_path / "um"
    s, other = JsonUserMemoryStore(root, max_items=2), JsonUserMemoryStore(root)   # two writers of one file
    fact = lambda n, session="s1": MemoryItem(f"m{n}", "fact", f"fact {n}", session, n, "x")  # noqa: E731
    await s.add("alice", [fact(1)])
    await other.add("alice", [fact(2), fact(9, "s9")])
    await other.mark_forgetting("alice", "s9")              # and it stops before finishing the clear
    save, saves = s.backend.save, []

    async def first_loses(user_id, doc, version):            # s's cached document is stale: its save loses
        saves.append(version)
        return len(saves) > 1 and await save(user_id, doc, version)
    s.backend.save = first_loses
    assert [i.id for i in await s.add("alice", [fact(3)])] == ["m3"]
    assert len(saves) == 2                                   # the lost one, then the update's own
    doc, _ = await UserFiles(root).load("alice")
    assert [i.id for i in doc.items] == ["m2", "m3"]        # other's item kept, max_items held
    assert doc.pending == []                                 # the stopped clear is done, as at a load
    assert [i.id for i in await s.list("alice")] == ["m2", "m3"]   # the cache holds what was stored


async def test_a_fact_from_one_session_reaches_the_prompt_of_another(store, tmp_path):
    mm = manager(store, tmp_path)
    a = (await store.create("alice", title="Prod DB")).session_id
    await store_turn(store, mm, a, "alice", "The prod DB host is db-prod-42. Please check its disk.", "Disk ok.",
                     timestamp="2026-11-20T10:15:00+00:00")
    await store_turn(store, mm, a, "alice", "Always answer in Chinese.", "好的。")
    await mm.wait_idle()
    b = (await store.create("alice")).session_id
    ctx, _ = await store_turn(store, mm, b, "alice", "ssh into the prod database host please", "ok")
    block = memory_block(ctx)
    assert block is not None
    assert '- The prod DB host is db-prod-42. (session "Prod DB", 2026-11-20 10:15 UTC)' in block   # by title
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


@pytest.mark.parametrize("kind, text, key", [
    ("fact", "The prod DB host is db-prod-42.", "fact:prod db host"),
    ("fact", "the prod  db host is db-prod-41", "fact:prod db host"),
    ("fact", "The prod DB host is db-prod-43 now.", "fact:prod db host"),
    ("fact", "port: 5432", "fact:port"),
    ("fact", "The DB port = 5432", "fact:db port"),
    ("fact", "My name is Alice.", "fact:name"),
    ("fact", "Call me Bob.", "fact:call me"),
    ("fact", "我叫小王。", "fact:call me"),
    ("fact", "我们的数据库在杭州。", "fact:数据库在"),
    ("fact", "我的名字是张三", "fact:名字是"),
    ("preference", "Please answer in Chinese.", "preference:answer language"),
    ("preference", "以后请用英文回答。", "preference:answer language"),
    # statements that stand beside others: no key
    ("fact", "My son is a doctor.", None),
    ("fact", "Our team is small and agile.", None),
    ("fact", "I use vim", None),
    ("preference", "I prefer short answers with the commands first.", None),
])
def test_what_a_statement_is_about(kind, text, key):
    assert subject_key(kind, text) == key


async def test_a_correction_replaces_the_older_statement(store, tmp_path):
    mm = manager(store, tmp_path)
    a = (await store.create("alice")).session_id
    b = (await store.create("alice")).session_id
    await store_turn(store, mm, a, "alice", "The vault host is vault-7. Please answer in Chinese. "
                     "I prefer short answers.", "noted")
    await mm.wait_idle()
    await store_turn(store, mm, b, "alice", "The vault host is vault-8 now. My son is a doctor.", "noted")
    await store_turn(store, mm, b, "alice", "the vault host is vault-9. Answer in English from now on.", "noted")
    await mm.wait_idle()
    items = await mm.user_memory.list("alice")
    assert [(i.kind, i.text) for i in items] == [
        ("preference", "I prefer short answers."), ("fact", "My son is a doctor."),
        ("fact", "the vault host is vault-9."), ("preference", "Answer in English from now on.")]
    [doc] = [json.loads(f.read_text()) for f in (tmp_path / "um").iterdir()]
    assert all(old not in json.dumps(doc["items"]) for old in ("vault-7", "vault-8", "Chinese"))
    # (kept as replaced only while their sessions say them: a withdrawn correction brings them back)
    assert {r["item"]["text"] for r in doc["replaced"]} == {
        "The vault host is vault-7.", "The vault host is vault-8 now.", "Please answer in Chinese."}
    c = (await store.create("alice")).session_id
    ctx, _ = await store_turn(store, mm, c, "alice", "which vault host?", "…")
    block = memory_block(ctx)
    assert "vault-9" in block and "vault-7" not in block and "Chinese" not in block
    await mm.aclose()


async def test_natural_corrections_replace_and_unstated_or_secret_sentences_are_not_learned(store, tmp_path):
    mm = manager(store, tmp_path)
    a = (await store.create("carol")).session_id
    b = (await store.create("carol")).session_id
    await store_turn(store, mm, a, "carol", "我们的生产数据库在杭州。The prod DB host is db-prod-41. "
                     "Our CI runner host is ci-1.", "noted")
    await mm.wait_idle()
    for text in ("生产数据库改成上海了。", "We moved the prod DB host to db-prod-44 yesterday.",
                 "Correction: the CI runner host is ci-2 now.",
                 "I'm not sure the prod DB host is db-prod-99, can you check", "Maybe the region is eu-west-1",
                 "My ssh passphrase is correct-horse-battery", "FYI the build host: ci-build-3"):
        await store_turn(store, mm, b, "carol", text, "noted")
    await mm.wait_idle()
    assert [i.text for i in await mm.user_memory.list("carol")] == [
        "生产数据库改成上海了。", "We moved the prod DB host to db-prod-44 yesterday.",
        "The CI runner host is ci-2 now.", "The build host: ci-build-3"]
    [doc] = [json.loads(f.read_text()) for f in (tmp_path / "um").iterdir()]
    stored = json.dumps(doc, ensure_ascii=False)
    assert all(never not in stored for never in ("db-prod-99", "eu-west-1", "correct-horse"))
    items = json.dumps(doc["items"], ensure_ascii=False)       # (the replaced ones are kept as replaced only)
    assert all(gone not in items for gone in ("杭州", "db-prod-41", "ci-1."))
    await mm.aclose()


async def test_one_message_correcting_itself_keeps_the_last_statement(tmp_path):
    store = JsonUserMemoryStore(tmp_path / "um")
    items = [MemoryItem(f"m{n}", "fact", f"The DB host is db-{n}.", "s1", 3, "2026-11-27T00:00:00+00:00")
             for n in (1, 2, 3)]
    added = await store.add("alice", items, learned=("s1", 3), key=item_subject)
    assert [i.text for i in added] == ["The DB host is db-3."]
    assert [i.text for i in await store.list("alice")] == ["The DB host is db-3."]
    await store.close()


async def test_edited_away_messages_are_forgotten_and_never_learned_again(tmp_path):
    store = JsonUserMemoryStore(tmp_path / "um")

    def item(mid: int, text: str) -> MemoryItem:
        return MemoryItem(f"m{mid}", "fact", text, "s1", mid, "2026-11-27T00:00:00+00:00")
    await store.add("alice", [item(1, "The DB host is db-1."), item(3, "Our region is eu-2.")], learned=("s1", 3))
    # an edit supersedes messages 3 and 5; 5 is still being learned (above the learned position)
    assert await store.forget_messages("alice", "s1", [3, 5]) == 1
    assert [i.text for i in await store.list("alice")] == ["The DB host is db-1."]
    # the learning of message 5 that was under way ends now: nothing of it is added
    assert await store.add("alice", [item(5, "Our bucket is bk-5.")], learned=("s1", 5)) == []
    # a message after the edit is learned as usual
    assert [i.text for i in await store.add("alice", [item(7, "Our bucket is bk-7.")], learned=("s1", 7))] == \
        ["Our bucket is bk-7."]
    text = next((tmp_path / "um").iterdir()).read_text()
    assert "eu-2" not in text and "bk-5" not in text
    assert await store.forget_messages("alice", "s1", [3, 5]) == 0       # again: nothing to do, no write
    await store.close()


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


async def test_a_learning_that_ends_while_its_session_is_being_forgotten_adds_nothing(tmp_path):
    store = JsonUserMemoryStore(tmp_path / "um")

    def item(sid: str, mid: int, text: str) -> MemoryItem:
        return MemoryItem(f"m{sid}{mid}", "fact", text, sid, mid, "2026-11-27T00:00:00+00:00")
    await store.mark_forgetting("alice", "s1")            # a clear of s1 began; a slow distiller is still at work
    assert await store.add("alice", [item("s1", 3, "The DB host is db-q41."), item("s2", 4, "Our region is eu-2.")],
                           learned=("s1", 3)) == [item("s2", 4, "Our region is eu-2.")]    # only the other session's
    assert [i.text for i in await store.list("alice")] == ["Our region is eu-2."]
    assert await store.forget_session("alice", "s1") == 0
    # the clear is over: what the session says from now on is learned as usual
    assert [i.text for i in await store.add("alice", [item("s1", 9, "Our bucket is bk-9.")], learned=("s1", 9))] == \
        ["Our bucket is bk-9."]
    assert "db-q41" not in next((tmp_path / "um").iterdir()).read_text()
    await store.close()


async def test_items_of_a_session_being_forgotten_are_not_listed(store, tmp_path):
    mm = manager(store, tmp_path)
    a = (await store.create("alice")).session_id
    await store_turn(store, mm, a, "alice", "The vault host is vault-7.", "noted")
    await mm.wait_idle()
    assert [i.text for i in await mm.user_memory.list("alice")] == ["The vault host is vault-7."]
    await mm.begin_forget(a, "alice")                   # a clear began: MEMORY_LIST and the tool no longer show it
    assert await mm.user_memory.list("alice") == []
    await store.clear(a)
    mm.forget_session(a, "alice", cleared=True)
    await mm.wait_idle()
    assert await mm.user_memory.list("alice") == []
    await mm.aclose()
