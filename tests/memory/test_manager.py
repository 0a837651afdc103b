"""MemoryManager with the real HistoryStore: background rolling summaries, failures and fallback,
context assembly from storage, clears, and shutdown."""
from __future__ import annotations

import asyncio
import random
from dataclasses import replace

from memory_testlib import (Notifications, OfflineStub, ScriptedSummarizer, check_tool_pairing, rand_text,
                            store_turn)
from protocol import ErrorCode
from server.agent.base import AgentError
from server.memory import MemoryConfig, MemoryManager
from storage.models import SummaryRecord, ToolCall

USER = "alice"


def mem_config(**summ) -> MemoryConfig:
    s = {"trigger": {"type": "messages", "value": 8}, "keep": {"type": "messages", "value": 4}}
    s.update(summ)
    return MemoryConfig.from_dict({"summarization": s, "context": {"recent_turns": 3}})


async def all_messages(store, sid):
    return [m.to_dict() for m in await store.messages(sid)]


async def test_background_summary_never_delays_the_turn(store):
    gate = asyncio.Event()
    agent = ScriptedSummarizer(["rolling summary v1"], gate=gate)
    notes = Notifications()
    mm = MemoryManager(mem_config(), store, agent, notes, "SYS")
    sid = (await store.create(USER)).session_id
    for i in range(3):
        await store_turn(store, mm, sid, USER, f"check disk {i}", f"disk ok {i}")
    order: list[str] = []
    await store.append(sid, "user", "check cpu")
    await store.append(sid, "assistant", "cpu ok")
    await mm.after_turn(sid, USER)                   # 8 messages: the trigger fires
    order.append("after_turn returned")
    await asyncio.wait_for(agent.started.wait(), 10)
    order.append("summarizer called")
    assert not gate.is_set() and (await store.get(sid)).summaries == []
    ctx = await mm.build_context(sid, USER, await store.append(sid, "user", "next question"), "m")
    order.append("next context built")             # the next turn is not held up either
    assert ctx.metadata["summary_used"] is None
    gate.set()
    await notes.wait("summary")
    order.append("summary stored")
    assert order == ["after_turn returned", "summarizer called", "next context built", "summary stored"]
    [(kind, nsid, payload)] = notes.events
    assert (kind, nsid) == ("summary", sid) and payload["summary"]["text"] == "rolling summary v1"
    await mm.aclose()


async def test_rolling_summary_folds_previous_and_history_stays_complete(store):
    agent = ScriptedSummarizer([lambda msgs: "S1: user checks disks", lambda msgs: "S2 folded"])
    notes = Notifications()
    mm = MemoryManager(mem_config(), store, agent, notes, "SYS")
    sid = (await store.create(USER)).session_id
    for i in range(4):
        await store_turn(store, mm, sid, USER, f"check disk {i}", f"disk ok {i}")
    await mm.wait_idle()
    rec = await store.get(sid)
    assert [s.text for s in rec.summaries] == ["S1: user checks disks"]
    first = rec.summaries[0]
    assert (first.covers_from_id, first.covers_to_id, first.model) == (1, 4, "chat-model")
    for i in range(4, 6):
        await store_turn(store, mm, sid, USER, f"check disk {i}", f"disk ok {i}")
    await mm.wait_idle()
    rec = await store.get(sid)
    assert [s.text for s in rec.summaries] == ["S1: user checks disks", "S2 folded"]
    assert (rec.summary.covers_from_id, rec.summary.covers_to_id) == (1, 8)
    second_request = agent.calls[1][0][1]["content"]
    assert "S1: user checks disks" in second_request            # the previous summary is folded in
    assert "check disk 2" in second_request and "check disk 1" not in second_request
    page = await store.page(sid, limit=100)
    assert [m.id for m in page.messages] == list(range(1, 13)) # paged history still shows every message
    assert notes.kinds() == ["summary", "summary"]

    ctx = await mm.build_context(sid, USER, await store.append(sid, "user", "and now?"), "m")
    assert ctx.messages[1] == {"role": "system", "content": "Summary of the earlier conversation "
                                                            "(messages 1-8):\nS2 folded"}
    texts = [m.get("content") for m in ctx.messages]
    assert "check disk 5" in texts and "check disk 3" not in texts   # only turns after the summary
    assert ctx.metadata["summary_used"] == 8 and ctx.metadata["turns_kept"] == 2
    await mm.aclose()


async def test_failing_summarizer_changes_nothing_then_falls_back_and_recovers(store):
    replies = [AgentError(ErrorCode.LLM_ERROR, "down"), "", RuntimeError("boom"),
               AgentError(ErrorCode.LLM_TIMEOUT, "slow"), "recovered summary"]
    agent = ScriptedSummarizer(replies)
    notes = Notifications()
    mm = MemoryManager(mem_config(), store, agent, notes, "SYS")
    sid = (await store.create(USER)).session_id
    for i in range(4):
        await store_turn(store, mm, sid, USER, f"q{i}", f"a{i}")
    await mm.wait_idle()
    assert mm.session_state(sid)["failures"] == 1
    before = (await all_messages(store, sid), (await store.get(sid)).summaries)
    assert before[1] == []
    for i in range(4, 6):
        await store_turn(store, mm, sid, USER, f"q{i}", f"a{i}")
        await mm.wait_idle()
    assert mm.session_state(sid) == {"failures": 3, "fallback": True, "running": False}
    assert (await store.get(sid)).summaries == []             # nothing stored on failure
    msgs = await all_messages(store, sid)
    assert msgs[: len(before[0])] == before[0]                 # history untouched
    assert notes.kinds() == ["warning"]
    assert notes.events[0][2]["code"] == "SUMMARY_FAILED" and notes.events[0][2]["level"] == "warning"
    ctx, _ = await store_turn(store, mm, sid, USER, "q6", "a6")
    assert ctx.metadata["summary_fallback"] is True and ctx.metadata["turns_kept"] == 3
    await mm.wait_idle()                                       # 4th failure: no second warning
    assert notes.kinds() == ["warning"]
    await store_turn(store, mm, sid, USER, "q7", "a7")         # keeps retrying: the 5th call succeeds
    await mm.wait_idle()
    assert [s.text for s in (await store.get(sid)).summaries] == ["recovered summary"]
    assert mm.session_state(sid)["fallback"] is False and notes.kinds() == ["warning", "summary"]
    await mm.aclose()


async def test_failing_summary_keeps_the_previous_summary(store):
    agent = ScriptedSummarizer(["first summary", RuntimeError("down")])
    mm = MemoryManager(mem_config(), store, agent, None, "SYS")
    sid = (await store.create(USER)).session_id
    for i in range(8):
        await store_turn(store, mm, sid, USER, f"q{i}", f"a{i}")
        await mm.wait_idle()
    rec = await store.get(sid)
    assert [s.text for s in rec.summaries] == ["first summary"] and len(agent.calls) >= 2
    ctx = await mm.build_context(sid, USER, await store.append(sid, "user", "x"), "m")
    assert "first summary" in ctx.messages[1]["content"]
    await mm.aclose()


async def test_offline_agent_stores_extractive_summaries_end_to_end(store):
    notes = Notifications()
    mm = MemoryManager(mem_config(), store, OfflineStub(), notes, "SYS")
    sid = (await store.create(USER)).session_id
    await store_turn(store, mm, sid, USER, "My favourite shell is fish. Check disk usage.", "Disk ok.",
                     (ToolCall("c1", "sys_monitor", {"metric": "disk"}, "/ 42% used"),))
    for i in range(4):
        await store_turn(store, mm, sid, USER, f"look at host{i}", "fine")
    await notes.wait("summary")
    s = (await store.get(sid)).summary
    assert s.model == "extractive" and "My favourite shell is fish." in s.text and "42% used" in s.text
    await mm.aclose()


async def test_prompts_from_storage_keep_tool_groups_and_budget(store):
    rng = random.Random(5)
    mm = MemoryManager(MemoryConfig.from_dict({"summarization": {"enabled": False},
                                               "context": {"recent_turns": 6, "max_input_tokens": 1200,
                                                           "reserve_output_tokens": 200}}),
                       store, None, None, "SYS")
    sid = (await store.create(USER)).session_id
    n_call = 0
    for i in range(25):
        calls = []
        for step in range(rng.randint(0, 3)):
            for _ in range(rng.randint(1, 2)):
                n_call += 1
                calls.append(ToolCall(f"c{n_call}", "sys_monitor", {"metric": "cpu"}, rand_text(rng, 1, 60),
                                      step=step))
        ctx, _ = await store_turn(store, mm, sid, USER, rand_text(rng, 1, 80), rand_text(rng, 0, 80), tuple(calls))
        check_tool_pairing(ctx.messages)
        assert mm.counter.count_messages(ctx.messages) <= 1000
    assert ctx.metadata["turns_dropped"] > 0                   # the small window forced drops
    await mm.aclose()


async def test_cleared_session_forgets_summary_and_recall(store):
    mm = MemoryManager(mem_config(), store, ScriptedSummarizer(["secret summary"]), None, "SYS")
    sid = (await store.create(USER)).session_id
    await store_turn(store, mm, sid, USER, "the vault code is 4711", "noted")
    for i in range(5):
        await store_turn(store, mm, sid, USER, f"filler {i}", "ok")
    await mm.wait_idle()
    assert (await store.get(sid)).summaries
    await store.clear(sid)
    ctx, _ = await store_turn(store, mm, sid, USER, "what is the vault code?", "unknown")
    flat = str(ctx.messages)
    assert "secret summary" not in flat and "4711" not in flat
    assert ctx.metadata["summary_used"] is None and ctx.metadata["recalled"] == []
    hits = await mm.search(USER, "vault code")
    assert [h["snippet"] for h in hits] == ["what is the vault code? / unknown"]
    await mm.aclose()


async def test_aclose_cancels_a_running_summary(store):
    agent = ScriptedSummarizer(["never"], gate=asyncio.Event())
    mm = MemoryManager(mem_config(), store, agent, None, "SYS")
    sid = (await store.create(USER)).session_id
    for i in range(4):
        await store_turn(store, mm, sid, USER, f"q{i}", f"a{i}")
    await asyncio.wait_for(agent.started.wait(), 10)
    assert not mm.summary_tasks_idle()
    await mm.aclose()
    assert mm.summary_tasks_idle() and (await store.get(sid)).summaries == []
    await mm.after_turn(sid, USER)                             # closed: schedules nothing
    assert mm.summary_tasks_idle()


async def test_custom_token_counter_is_used(store):
    class CharCounter:
        def count(self, text):
            return len(text)

        def count_messages(self, messages):
            return sum(len(m.get("content") or "") + 10 for m in messages)

    counter = CharCounter()
    mm = MemoryManager(MemoryConfig.from_dict({"summarization": {"enabled": False},
                                               "context": {"max_input_tokens": 1300}}),
                       store, None, None, "SYS", token_counter=counter)
    sid = (await store.create(USER)).session_id
    for i in range(5):
        ctx, _ = await store_turn(store, mm, sid, USER, "x" * 150, "y" * 150)
    assert counter.count_messages(ctx.messages) <= 1300 - 1024
    assert ctx.metadata["turns_dropped"] > 0
    await mm.aclose()


async def test_a_summary_under_way_when_messages_are_superseded_is_never_stored(store):
    gate = asyncio.Event()
    agent = ScriptedSummarizer(["S-OLD mentions disk 0", lambda msgs: "S-NEW " + str(msgs)], gate=gate)
    mm = MemoryManager(mem_config(), store, agent, None, "SYS")
    sid = (await store.create(USER)).session_id
    for i in range(4):
        await store_turn(store, mm, sid, USER, f"check disk {i}", f"disk ok {i}")   # 8 messages: triggers
    await asyncio.wait_for(agent.started.wait(), 10)
    # an edit of message 1 supersedes everything: the summary being written is cancelled
    msgs = await store.messages(sid)
    await mm.before_supersede(sid, USER, msgs)
    gate.set()
    await mm.wait_idle()
    assert (await store.get(sid)).summaries == [] and len(agent.calls) == 1
    await mm.before_supersede(sid, USER, msgs[4:])          # no summary covers them: nothing is written
    assert (await store.get(sid)).summaries == []
    await mm.aclose()


async def test_a_summary_is_dropped_when_what_it_covers_changed_while_it_was_written(store):
    """Another node's edit (no local hook runs) or its summary lands, or the session is cleared,
    while this one is written."""
    for change in ("superseded", "summary", "cleared"):
        gate = asyncio.Event()
        agent = ScriptedSummarizer(["STALE"], gate=gate)
        mm = MemoryManager(mem_config(), store, agent, None, "SYS")
        sid = (await store.create(USER)).session_id
        for i in range(4):
            await store_turn(store, mm, sid, USER, f"check disk {i}", f"disk ok {i}")
        await asyncio.wait_for(agent.started.wait(), 10)
        if change == "superseded":
            first = (await store.messages(sid))[0]
            await store.update(sid, replace(first, metadata={**first.metadata, "superseded": True}))
        elif change == "summary":
            await store.add_summary(sid, SummaryRecord("written elsewhere", 1, 2))
        else:
            await store.clear(sid)
            mm.forget_session(sid, USER, cleared=True)
        gate.set()
        await mm.wait_idle()
        assert "STALE" not in [s.text for s in (await store.get(sid)).summaries], change
        await mm.aclose()


async def test_after_an_edit_of_the_first_message_summaries_neither_fail_nor_hold_its_text(store):
    """Offline (extractive) summaries: a cut covering only superseded messages is skipped, not a
    failure, and the first summary with live messages leaves the superseded text out."""
    mm = MemoryManager(mem_config(), store, OfflineStub(), None, "SYS")
    sid = (await store.create(USER)).session_id
    for i in range(3):
        await store_turn(store, mm, sid, USER, f"my old server is old-{i}", f"noted old-{i}")
    msgs = await store.messages(sid)
    await mm.before_supersede(sid, USER, msgs)           # the user edits message 1
    for m in msgs:
        await store.update(sid, replace(m, metadata={**m.metadata, "superseded": True}))
    mm.forget_session(sid)
    for i in range(3):
        await store_turn(store, mm, sid, USER, f"my new server is new-{i}", f"noted new-{i}")
        await mm.wait_idle()
        assert mm.session_state(sid)["failures"] == 0
    [summary] = (await store.get(sid)).summaries
    assert summary.covers_to_id == 8 and "new-0" in summary.text and "old-" not in summary.text
    await mm.aclose()
