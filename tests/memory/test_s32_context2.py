"""The window turns' tool results are capped to a share of the message budget (s32, follow-up).

Cutting the window turns' tool results before dropping a turn (test_s32_context.py) keeps a
follow-up's context; but cut only as far as needed, the prompt could fill the whole message budget
(12213 of 12215 tokens on the reviewer's repro), and a follow-up that calls a tool had no room for
its first result: the agent's tool loop ended with finish reason ``context_budget`` at once.
Now the earlier results together get at most ``WINDOW_RESULTS_SHARE`` of the message budget (the
oldest cut first); then, over budget, they are cut only as far as needed, as before.

The server test runs a real ``Server`` against the scripted endpoint over loopback and asserts what
was sent on the wire.
"""
from __future__ import annotations

import json
import random

from memory_testlib import check_tool_pairing, rand_history, rand_text
from server.app import Server
from server.memory.context import WINDOW_RESULTS_SHARE, Parts, assemble, build_turns, recent_turns
from server.memory.tokens import ApproxTokenCounter
from storage.models import ChatMessage
from test_s32_context import (CUT_SLACK, SYSTEM, _config, _results, _tool_turn, _turn, check_share,
                              check_window_body)
from testkit.scripted_llm import Reply, StreamedOnlyLLM, ToolCallSpec
from testkit.server import V3Client

COUNTER = ApproxTokenCounter()


def test_earlier_results_far_above_their_share_leave_half_the_budget_free():
    history = _tool_turn(1, 3, 1500) + _tool_turn(3, 3, 1500)
    turns = build_turns(history, COUNTER)
    budget = 12_000
    whole = _results([m for t in turns for m in t.messages])
    assert whole > 2 * budget                                     # four times their share and more
    ctx = assemble(Parts(SYSTEM, "and now?", turns=turns), COUNTER, budget)
    meta, msgs = ctx.metadata, ctx.messages
    cap = int(budget * WINDOW_RESULTS_SHARE)
    assert meta["turns_dropped"] == 0 and meta["turns_kept"] == 2       # no turn lost
    assert check_window_body(msgs, turns, meta) == meta["window_results_cut"]["count"] > 0
    held = _results(msgs)
    assert cap - CUT_SLACK <= held <= cap                          # cut to the share, not further
    total = COUNTER.count_messages(msgs)
    assert total == meta["prompt_tokens_estimate"]
    rest = total - held                                            # the parts that are not results
    assert budget - total >= budget // 2 - rest                    # at least half the budget minus them free
    check_tool_pairing(msgs)
    assert turns == build_turns(history, COUNTER)                  # the window turns given are unchanged


def test_results_within_their_share_are_not_cut_when_the_prompt_fits():
    history = _tool_turn(1, 2, 200) + _tool_turn(3, 2, 200)
    turns = build_turns(history, COUNTER)
    results = _results([m for t in turns for m in t.messages])
    budget = 2 * results + 100                                     # their share holds them all
    ctx = assemble(Parts(SYSTEM, "and now?", turns=turns), COUNTER, budget)
    assert "window_results_cut" not in ctx.metadata
    assert ctx.messages[1:-1] == [m for t in turns for m in t.messages]


def test_random_histories_keep_every_invariant_with_the_share():
    rng = random.Random(3219)
    capped = free = 0
    for _ in range(300):
        history: list[ChatMessage] = []
        for _k in range(rng.randint(1, 5)):
            history += _tool_turn(len(history) + 1, rng.randint(0, 4), rng.choice((5, 200, 1500)), rng.randint(1, 50))
        if rng.random() < 0.3:
            history += rand_history(rng, rng.randint(1, 10))
            for i, m in enumerate(history):
                m.id = i + 1
        snapshot = [m.to_dict() for m in history]
        window, _ = recent_turns(history, rng.randint(1, 6), COUNTER)
        budget = rng.choice((256, 800, 2000, 6000, 20_000))
        ctx = assemble(Parts(SYSTEM, rand_text(rng, 1, 60), turns=window), COUNTER, budget)
        meta, msgs = ctx.metadata, ctx.messages
        assert [m.to_dict() for m in history] == snapshot             # the raw history never shortened
        total = COUNTER.count_messages(msgs)
        assert total == meta["prompt_tokens_estimate"] <= budget      # within budget
        check_tool_pairing(msgs)                                       # no orphaned result, no call without one
        check_window_body(msgs, window, meta)                          # whole turns, results cut and marked
        check_share(msgs, budget, meta)                                # the share, then only as far as needed
        held = _results(msgs)
        if meta.get("window_results_cut"):
            capped += 1
            if held <= int(budget * WINDOW_RESULTS_SHARE):             # room for the next turn's results
                free += budget - total >= budget // 2 - (total - held)
    assert capped > 100 and free > 50


async def test_a_follow_up_that_calls_a_tool_has_room_for_its_result(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    big = files / "big.log"
    big.write_text("".join(f"{i:05d} worker{i} handled request{i} in {i % 97} ms status ok\n" for i in range(3000)))
    calls = [ToolCallSpec(f"r{i}", "read_file", json.dumps({"path": str(big), "offset": 1 + 300 * i, "lines": 500}))
             for i in range(6)]
    again = ToolCallSpec("again", "read_file", json.dumps({"path": str(big), "offset": 2901, "lines": 60}))
    async with StreamedOnlyLLM() as llm:
        srv = Server(_config(tmp_path, llm, tools={"file_roots": [str(files)]}))   # the default window
        addr = await srv.start()
        try:
            c = await V3Client.connect(addr)
            llm.push(Reply.tools(*calls), Reply.text("the log shows 3000 requests, all ok"))
            first = await _turn(c, "read the big log")
            llm.push(Reply.tools(again), Reply.text("the slowest took 96 ms"))
            n = len(llm.requests)
            second = await _turn(c, "and the slowest one? read the end again")
            await c.close()
        finally:
            await srv.stop()
    assert first["message"]["content"] == "the log shows 3000 requests, all ok"
    assert second["finish_reason"] == "stop" and second["message"]["content"] == "the slowest took 96 ms"
    ctx = second["context"]
    assert ctx["turns_dropped"] == 0 and ctx["turns_kept"] == 1 and ctx["window_results_cut"]["count"] > 0
    assert "ended" not in (ctx.get("tool_exchange") or {})
    budget = ctx["budget_tokens"]
    opening, follow = llm.requests[n].body["messages"], llm.requests[n + 1].body["messages"]
    assert _results(opening) <= int(budget * WINDOW_RESULTS_SHARE)
    # the follow-up request: the built prompt, then this turn's call and its result, whole
    result = second["message"]["tool_calls"][0]["result"]
    assert len(result) > 1000
    assert follow[:len(opening)] == opening
    assert [m["role"] for m in follow[len(opening):]] == ["assistant", "tool"]
    assert follow[-1] == {"role": "tool", "tool_call_id": "again", "content": result}
    assert COUNTER.count_messages(follow) <= budget
    assert (second["context"]["tool_exchange"] or {}).get("cut") == []
