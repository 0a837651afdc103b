"""Summarization planning (triggers, cut at turn boundaries), transcript trimming, LLM and extractive runs."""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_testlib import OfflineStub, ScriptedSummarizer, rand_history
from protocol import ErrorCode
from server.agent.base import AgentError
from server.memory.config import ContextConfig, MemoryConfig, SummarizationConfig, Threshold
from server.memory.extractive import HEADER, extractive_summary
from server.memory.summarizer import (EXTRACTIVE_MODEL, NothingToSummarize, Plan, SummaryFailed, cut_index,
                                      message_costs, plan, summarize, transcript)
from server.memory.tokens import ApproxTokenCounter
from storage.models import ChatMessage, SummaryRecord, ToolCall

C = ApproxTokenCounter()
CTX = ContextConfig(max_input_tokens=8000)


def conv(n_turns: int, start: int = 1, words: int = 5) -> list[ChatMessage]:
    out = []
    for i in range(n_turns):
        out.append(ChatMessage(start + 2 * i, "user", f"question {i} " + "disk " * words))
        out.append(ChatMessage(start + 2 * i + 1, "assistant", f"answer {i}",
                               tool_calls=[ToolCall(f"c{i}", "sys_monitor", {"metric": "disk"}, "42% used")]))
    return out


def cfg(**kw) -> SummarizationConfig:
    base = {"trigger": {"type": "messages", "value": 10}, "keep": {"type": "messages", "value": 4}}
    base.update(kw)
    return MemoryConfig.from_dict({"summarization": base, "context": {"max_input_tokens": 8000}}).summarization


def test_triggers_are_ored_and_evaluated_on_uncovered_messages():
    msgs = conv(4)                                            # 8 messages
    assert plan(cfg(), CTX, None, msgs, C) is None            # messages trigger at 10
    assert plan(cfg(), CTX, None, conv(5), C) is not None
    both = cfg(trigger=[{"type": "messages", "value": 100}, {"type": "tokens", "value": 50}])
    assert plan(both, CTX, None, msgs, C) is not None         # the tokens rule fires alone
    frac = cfg(trigger={"type": "fraction", "value": 0.5})
    assert plan(frac, CTX, None, msgs, C) is None
    assert plan(frac, CTX, None, conv(200), C) is not None    # half of an 8000-token window
    assert plan(cfg(enabled=False), CTX, None, conv(50), C) is None


def test_cut_keeps_recent_messages_and_falls_on_a_user_boundary():
    msgs = conv(6)                                            # ids 1..12, users at odd ids
    p = plan(cfg(keep={"type": "messages", "value": 4}), CTX, None, msgs, C)
    assert [m.id for m in p.kept] == [9, 10, 11, 12] and p.covers_to_id == 8 and p.covers_from_id == 1
    p = plan(cfg(keep={"type": "messages", "value": 3}), CTX, None, msgs, C)
    assert p.kept[0].role == "user" and len(p.kept) == 4       # moved back to keep the turn whole
    p = plan(cfg(keep={"type": "messages", "value": 0}), CTX, None, msgs, C)
    assert p.kept == [] and p.covers_to_id == 12              # the end is a boundary: last turn finished
    costs = message_costs(msgs, C)
    i = cut_index(cfg(keep={"type": "tokens", "value": costs[-1] + costs[-2] + 1}), CTX, msgs, costs)
    assert i == 8                                             # two turns kept to hold that many tokens
    prev = SummaryRecord("old", 1, 0)
    assert plan(cfg(), CTX, prev, msgs, C).covers_from_id == 1


def test_no_cut_inside_a_single_long_turn():
    msgs = [ChatMessage(1, "user", "go")] + [ChatMessage(i, "assistant", "step", tool_calls=[
        ToolCall(f"c{i}", "clock", {}, "t")]) for i in range(2, 30)]
    assert plan(cfg(), CTX, None, msgs, C) is None            # only boundary is 0: nothing to cover


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.integers(0, 80), st.sampled_from(["messages", "tokens"]), st.integers(0, 30))
def test_property_cut_never_splits_a_turn(seed, n, keep_type, keep_value):
    msgs = rand_history(random.Random(seed), n)
    costs = message_costs(msgs, C)
    keep = Threshold(type=keep_type, value=keep_value * (1 if keep_type == "messages" else 40))
    c = SummarizationConfig(trigger=[Threshold(type="messages", value=1)], keep=keep)
    i = cut_index(c, CTX, msgs, costs)
    assert 0 <= i <= len(msgs)
    if 0 < i < len(msgs):
        assert msgs[i].role == "user"                         # every tool call stays with its turn
    if i == len(msgs) and i:
        assert msgs[-1].role != "user"
    if i and keep_type == "messages":
        assert len(msgs) - i >= keep_value
    if i and keep_type == "tokens":
        assert sum(costs[i:]) >= keep_value * 40
    # maximal: no later boundary would still keep enough
    for j in range(i + 1, len(msgs)):
        if msgs[j].role == "user" and keep_type == "messages":
            assert len(msgs) - j < keep_value


def test_transcript_is_trimmed_keeping_the_most_recent_part():
    msgs = conv(30, words=20)
    text = transcript(msgs, C, 120)
    assert C.count(text) <= 120
    assert "answer 29" in text and "question 0 " not in text
    full = transcript(msgs, C, None)
    assert "question 0 " in full and "[tool sys_monitor {'metric': 'disk'} -> success] 42% used" in full


async def test_llm_summary_folds_the_previous_summary():
    agent = ScriptedSummarizer(["NEW SUMMARY"])
    prev = SummaryRecord("user is Alice; prod db is pg-main", 1, 10)
    p = Plan(prev, conv(3, start=11), [])
    rec = await summarize(p, cfg(model="cheap"), C, agent, "cheap")
    assert (rec.text, rec.covers_from_id, rec.covers_to_id, rec.model) == ("NEW SUMMARY", 1, 16, "cheap")
    [(messages, model)] = agent.calls
    assert model == "cheap" and messages[0]["role"] == "system" and "Never invent" in messages[0]["content"]
    assert "user is Alice; prod db is pg-main" in messages[1]["content"]
    assert "question 2" in messages[1]["content"]


@pytest.mark.parametrize("offline", [False, True])
async def test_superseded_messages_are_covered_but_never_summarized(offline):
    msgs = conv(3)                                   # ids 1..6; the first turn was edited away
    msgs[0] = ChatMessage(1, "user", "My main server is web-OLD.", metadata={"superseded": True})
    msgs[1] = ChatMessage(2, "assistant", "noted web-OLD", metadata={"superseded": True})
    msgs.insert(2, ChatMessage(7, "user", "My main server is web-NEW."))
    agent = OfflineStub() if offline else ScriptedSummarizer([lambda m: "S " + m[1]["content"]])
    rec = await summarize(Plan(None, msgs, []), cfg(), C, agent, None)
    assert "web-NEW" in rec.text and "web-OLD" not in rec.text and "question 1" in rec.text
    assert (rec.covers_from_id, rec.covers_to_id) == (1, 6)


@pytest.mark.parametrize("offline", [False, True])
async def test_a_plan_of_superseded_messages_only_carries_the_previous_summary_or_is_no_failure(offline):
    gone = [ChatMessage(i, "user" if i % 2 else "assistant", f"old {i}", metadata={"superseded": True})
            for i in range(11, 15)]
    agent = OfflineStub() if offline else ScriptedSummarizer(["never asked"])
    prev = SummaryRecord("user is Alice", 1, 10, model="m")
    rec = await summarize(Plan(prev, gone, []), cfg(), C, agent, None)
    assert (rec.text, rec.covers_from_id, rec.covers_to_id, rec.model) == ("user is Alice", 1, 14, "m")
    with pytest.raises(NothingToSummarize):
        await summarize(Plan(None, gone, []), cfg(), C, agent, None)
    assert getattr(agent, "calls", []) == []                    # no model call either way


@pytest.mark.parametrize("reply", ["", "   ", AgentError(ErrorCode.LLM_ERROR, "boom"), RuntimeError("x")])
async def test_failed_or_empty_summary_raises_summary_failed(reply):
    p = Plan(None, conv(2), [])
    with pytest.raises(SummaryFailed):
        await summarize(p, cfg(), C, ScriptedSummarizer([reply]), None)


async def test_offline_agent_gets_an_extractive_summary():
    msgs = [ChatMessage(1, "user", "Hi. My name is Dana and my main server is web-7. Check disk usage please."),
            ChatMessage(2, "assistant", "Disk is fine.", tool_calls=[
                ToolCall("c1", "sys_monitor", {"metric": "disk"}, "/ 42% used\n/home 10% used")]),
            ChatMessage(3, "user", "我叫小王。记住我们的备份服务器在杭州机房。"),
            ChatMessage(4, "assistant", "好的"),
            ChatMessage(5, "user", "I prefer short answers. Show nginx logs")]
    for agent in (None, OfflineStub()):
        rec = await summarize(Plan(None, msgs, []), cfg(), C, agent, None)
        assert rec.model == EXTRACTIVE_MODEL and rec.text.startswith(HEADER)
        text = rec.text
        assert "My name is Dana and my main server is web-7." in text
        assert "我叫小王。" in text and "记住我们的备份服务器在杭州机房。" in text
        assert "I prefer short answers." in text
        assert "sys_monitor" in text and "42% used" in text
        assert "Check disk usage please." in text and "Show nginx logs" in text
        assert "nginx" in text.split("Recent topics:")[1]
    again = await summarize(Plan(None, msgs, []), cfg(), C, None, None)
    assert again.text == rec.text                             # deterministic


def test_extractive_rolls_over_the_previous_summary_and_stays_bounded():
    first = extractive_summary("", [ChatMessage(1, "user", "My favourite editor is vim.")])
    text = first
    for i in range(200):
        text = extractive_summary(text, [ChatMessage(i + 2, "user", f"check host{i} please"),
                                         ChatMessage(i + 3, "assistant", "ok", tool_calls=[
                                             ToolCall(f"c{i}", "clock", {}, f"t{i}")])])
    assert "My favourite editor is vim." in text                # the early fact never fell out
    assert "check host199 please" in text and "check host0 please" not in text
    assert len(text) < 4000
    llm = extractive_summary("An LLM wrote this summary.", [ChatMessage(5, "user", "thanks")])
    assert "An LLM wrote this summary." in llm
