"""Prompt assembly over thousands of generated histories: tool calls never orphaned, budget kept,
raw history untouched, the window's tool results within their share of the budget (cut no further
than the share or the budget asks), whole oldest turns dropped first."""
from __future__ import annotations

import os
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_testlib import check_tool_pairing, rand_history, rand_text
from server.memory.context import (NO_ANSWER, SUMMARY_SHARE, TRUNCATION_NOTE, WINDOW_CUT_NOTE, Excerpt, Parts,
                                   assemble, build_turns, group_turns, has_answer, recent_turns, sanitize)
from server.memory.tokens import ApproxTokenCounter
from storage.models import ChatMessage, SummaryRecord, ToolCall
from test_s32_context import check_share

COUNTER = ApproxTokenCounter()
SWEEP = 8000 if os.environ.get("NPLT_FUZZ") else 1000
SYSTEM = "You are NPLT Assistant, a remote operations assistant."


def assemble_and_check(rng: random.Random, history: list[ChatMessage], budget: int, recent: int) -> dict:
    """Build a prompt from ``history`` with random extras and check every invariant; returns metadata."""
    snapshot = [m.to_dict() for m in history]
    turns = build_turns(history, COUNTER)
    window = turns[-recent:] if recent else []
    fast, older = recent_turns(history, recent, COUNTER)
    assert fast == window and 0 <= older <= len(group_turns(history)) - len(window)
    summary = None
    if rng.random() < 0.5 and history:
        summary = SummaryRecord(rand_text(rng, 1, rng.choice((20, 400, 3000))), 1, history[0].id)
    excerpts = [Excerpt([rng.randint(1, 99)], "[Recalled from 2026-01-01 10:00 UTC] User: " + rand_text(rng, 1, 80))
                for _ in range(rng.randint(0, 3))]
    if rng.random() < 0.5:                       # counted excerpts: the assembler adds their counts up
        for e in excerpts:
            e.tokens = COUNTER.count(e.text)
    memory = [Excerpt([f"m{i}"], f"- {rand_text(rng, 1, 40)} (session s_1, 2026-01-01 10:00 UTC)")
              for i in range(rng.randint(0, 3))]         # long-term memory items
    new = rand_text(rng, 1, rng.choice((10, 100, 6000)))
    system = SYSTEM if rng.random() < 0.9 else SYSTEM * rng.choice((1, 200))
    ctx = assemble(Parts(system, new, summary, excerpts, window, {"summary_fallback": False}, memory), COUNTER,
                   budget)
    msgs, meta = ctx.messages, ctx.metadata

    assert [m.to_dict() for m in history] == snapshot, "the stored history must never be modified"
    check_tool_pairing(msgs)
    total = COUNTER.count_messages(msgs)
    assert total <= budget, f"prompt of {total} tokens exceeds the budget {budget}"
    assert meta["prompt_tokens_estimate"] == total
    assert msgs[-1]["role"] == "user"
    assert msgs[-1]["content"] == new or meta["message_truncated"]
    if meta["message_truncated"]:
        assert msgs[-1]["content"].endswith(TRUNCATION_NOTE.strip())
    # whole oldest turns dropped: what is sent is the newest turns_kept turns of the window, a turn
    # without an answer closed by the NO_ANSWER placeholder, tool results possibly cut (head + note)
    assert meta["turns_kept"] + meta["turns_dropped"] == len(window)
    kept = window[len(window) - meta["turns_kept"]:]
    body = [m for t in kept for m in (t.messages if has_answer(t.messages)
                                      else [*t.messages, {"role": "assistant", "content": NO_ANSWER}])]
    sent = msgs[len(msgs) - 1 - len(body):-1]
    assert len(sent) == len(body)
    cut = [(s, b) for s, b in zip(sent, body) if s != b]
    assert all(b["role"] == "tool" and is_cut_of(s, b) for s, b in cut), cut
    assert len(cut) == (meta.get("window_results_cut") or {}).get("count", 0)
    # results beyond WINDOW_RESULTS_SHARE of the budget are cut (oldest first); then only as far as needed
    check_share(msgs, budget, meta)
    # lower-priority parts go first: the summary beyond SUMMARY_SHARE of the budget goes before
    # anything else; a summary cut further, or a truncated message, means no turn or excerpt is left
    below = summary_below_share(msgs, budget, meta)
    if below or meta["message_truncated"]:
        assert meta["turns_kept"] == 0 and meta["recalled"] == []
    if meta["recall_dropped"]:
        assert meta["turns_kept"] == 0
    # memory items go after recalled excerpts, before the summary; the best ranked stay longest
    assert meta["memory_items"] == [e.ids[0] for e in memory[:len(memory) - meta["memory_dropped"]]]
    if meta["memory_dropped"]:
        assert meta["turns_kept"] == 0 and meta["recalled"] == []
    if below or meta["message_truncated"]:
        assert meta["memory_items"] == []
    return meta


def summary_below_share(msgs: list[dict], budget: int, meta: dict) -> bool:
    """True when the summary was cut below its share of the budget (``SUMMARY_SHARE``): only once
    every turn, excerpt and memory item is gone. A summary cut to its share keeps at least that."""
    if not meta["summary_trimmed"]:
        return False
    sent = next((m for m in msgs if m["role"] == "system" and m["content"].startswith("Summary of")), None)
    return sent is None or COUNTER.count_message(sent) < int(budget * SUMMARY_SHARE)


def is_cut_of(sent: dict, whole: dict) -> bool:
    """``sent`` is the tool result ``whole`` cut to fit the budget: same keys and call id, a head of
    its content, then the note with the number of characters cut."""
    if sent.keys() != whole.keys() or sent["tool_call_id"] != whole["tool_call_id"]:
        return False
    head, _, note = sent["content"].rpartition("\n")
    return whole["content"].startswith(head) and note == WINDOW_CUT_NOTE.format(n=len(whole["content"]) - len(head))


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.integers(0, 60), st.integers(256, 6000), st.integers(0, 8))
def test_property_prompt_invariants(seed, n_items, budget, recent):
    rng = random.Random(seed)          # a seed, not st.randoms(): histories need thousands of draws
    assemble_and_check(rng, rand_history(rng, n_items), budget, recent)


def test_property_thousands_of_random_histories():
    """A seeded sweep (deterministic) on top of the Hypothesis search above; longer under NPLT_FUZZ."""
    rng = random.Random(20261122)
    dropped = truncated = results_cut = 0
    for _ in range(SWEEP):
        history = rand_history(rng, rng.randint(0, 40))
        meta = assemble_and_check(rng, history, rng.choice((256, 400, 800, 2000, 8000)), rng.randint(0, 6))
        dropped += meta["turns_dropped"] > 0
        truncated += meta["message_truncated"]
        results_cut += bool(meta.get("window_results_cut"))
    assert dropped > 100 and truncated > 10 and results_cut > 5    # the sweep really exercised the reductions


def test_sanitize_drops_orphans_and_unanswered_calls():
    msgs = [
        {"role": "tool", "tool_call_id": "x", "content": "orphan at start"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "clock", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "clock", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "b", "content": "B"},
        {"role": "tool", "tool_call_id": "zz", "content": "answers nothing here"},
        {"role": "assistant", "content": "done"},
        {"role": "tool", "tool_call_id": "b", "content": "late duplicate"},
        {"role": "assistant", "content": "text kept", "tool_calls": [{"id": "c", "type": "function",
                                                                       "function": {"name": "clock"}}]},
    ]
    out = sanitize(msgs)
    assert out == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [msgs[2]["tool_calls"][1]]},
        {"role": "tool", "tool_call_id": "b", "content": "B"},
        {"role": "assistant", "content": "done"},
        {"role": "assistant", "content": "text kept"},
    ]
    check_tool_pairing(out)


def test_build_turns_expands_tool_calls_per_step_and_groups_by_user():
    calls = [ToolCall("c1", "sys_monitor", {"metric": "cpu"}, "cpu 3%", step=0),
             ToolCall("c2", "processes", {}, "nginx", step=1)]
    history = [ChatMessage(3, "assistant", "no user before me"),
               ChatMessage(4, "user", "check cpu"),
               ChatMessage(5, "assistant", "all fine", tool_calls=calls),
               ChatMessage(6, "tool", "stray", metadata={"tool_call_id": "c1"}),
               ChatMessage(7, "user", "thanks")]
    assert [[m.id for m in g] for g in group_turns(history)] == [[3], [4, 5, 6], [7]]
    turns = build_turns(history, COUNTER)
    assert [t.ids for t in turns] == [[3], [4, 5, 6], [7]]
    roles = [m["role"] for m in turns[1].messages]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [m.get("tool_call_id") for m in turns[1].messages if m["role"] == "tool"] == ["c1", "c2"]
    assert all(t.tokens == sum(COUNTER.count_message(m) for m in t.messages) for t in turns)


def _turns(n: int, words: int) -> list:
    history = []
    for i in range(n):
        history.append(ChatMessage(2 * i + 1, "user", f"question {i} " + "disk " * words))
        history.append(ChatMessage(2 * i + 2, "assistant", f"answer {i} " + "ok " * words,
                                   tool_calls=[ToolCall(f"c{i}", "clock", {}, "12:00")]))
    return build_turns(history, COUNTER)


def test_reduction_order_turns_then_recall_then_summary_then_message():
    turns = _turns(6, 60)
    summary = SummaryRecord("facts " * 40, 1, 10)       # within its share (SUMMARY_SHARE) until the last step
    excerpts = [Excerpt([1], "[Recalled from x] User: " + "old " * 100), Excerpt([3], "second " * 100)]
    parts = Parts(SYSTEM, "new question", summary, excerpts, turns)
    full = COUNTER.count_messages(assemble(parts, COUNTER, 100_000).messages)
    per_turn = turns[0].tokens

    meta = assemble(parts, COUNTER, full - per_turn // 2).metadata           # one turn must go
    assert (meta["turns_dropped"], meta["turns_kept"], meta["recall_dropped"]) == (1, 5, 0)

    meta = assemble(parts, COUNTER, full - 6 * per_turn - 50).metadata       # then excerpts, last first
    assert meta["turns_kept"] == 0 and meta["recall_dropped"] == 1 and meta["recalled"] == [1]
    assert not meta["summary_trimmed"]

    ctx = assemble(parts, COUNTER, 300)                                      # then the summary's tail
    assert ctx.metadata["summary_trimmed"] and not ctx.metadata["message_truncated"]
    assert ctx.metadata["summary_used"] == 10
    assert "[summary truncated" in ctx.messages[1]["content"]
    assert ctx.messages[-1]["content"] == "new question"

    big = Parts(SYSTEM, "please read this: " + "log line " * 3000, summary, excerpts, turns)
    ctx = assemble(big, COUNTER, 400)                                        # last: the new message itself
    assert ctx.metadata["message_truncated"] and ctx.metadata["summary_used"] is None
    assert ctx.messages[-1]["content"].startswith("please read this: log line")
    assert COUNTER.count_messages(ctx.messages) <= 400


def test_layout_system_summary_recall_turns_new():
    turns = _turns(2, 3)
    ctx = assemble(Parts(SYSTEM, "now?", SummaryRecord("the user runs nginx", 1, 8),
                         [Excerpt([1], "[Recalled from 2026-01-01 10:00 UTC] User: a / Assistant: b")],
                         turns, {"summary_fallback": True}), COUNTER, 10_000)
    m = ctx.messages
    assert m[0] == {"role": "system", "content": SYSTEM}
    assert m[1]["role"] == "system" and "messages 1-8" in m[1]["content"] and "the user runs nginx" in m[1]["content"]
    assert m[2]["role"] == "system" and "[Recalled from 2026-01-01 10:00 UTC]" in m[2]["content"]
    assert m[3:-1] == turns[0].messages + turns[1].messages
    assert m[-1] == {"role": "user", "content": "now?"}
    assert ctx.metadata["summary_used"] == 8 and ctx.metadata["recalled"] == [1]
    assert ctx.metadata["summary_fallback"] is True and ctx.metadata["turns_kept"] == 2
