"""An item the rules learned after an unusable model answer is labelled source "rules", not "model"."""
from __future__ import annotations

from memory_testlib import ScriptedSummarizer, store_turn
from server.memory import MemoryConfig, MemoryManager
from server.memory.user_files import JsonUserMemoryStore


async def test_an_item_the_rules_learned_after_an_unusable_model_answer_says_rules(store, tmp_path):
    agent = ScriptedSummarizer(["not json at all"])
    cfg = MemoryConfig.from_dict({"summarization": {"enabled": False, "model": "summ-x"}})
    mm = MemoryManager(cfg, store, agent, None, "SYS", user_store=JsonUserMemoryStore(tmp_path / "um"))
    a = (await store.create("alice")).session_id
    await store_turn(store, mm, a, "alice", "Our backup host is bk-3.", "ok")
    await mm.wait_idle()
    assert agent.calls and agent.calls[0][1] == "summ-x"              # the model was asked
    items = await mm.user_memory.list("alice")
    assert [(i.kind, i.text, i.source) for i in items] == [("fact", "Our backup host is bk-3.", "rules")]
    await mm.aclose()
