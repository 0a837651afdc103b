"""The prompt of a turn after failed turns and after turns with large tool results (s32).

* A turn that ended without an answer (the endpoint failed, the turn was cancelled or interrupted)
  is replayed with a short placeholder answer, a partial answer with "[answer cut off]": later
  requests never carry two user messages in a row (strict chat templates reject them with 400
  "Conversation roles must alternate", and every later turn of the session failed).
* The window turns' tool results beyond their share of the budget (``WINDOW_RESULTS_SHARE``) are
  cut, oldest first, even when the prompt would fit; then, over budget, they are cut (call ids and
  pairs kept, marked) only as far as needed, before a whole turn is dropped: the follow-up to a
  turn with large tool results still has that turn's question and answer, and room for its own.

The server tests run a real ``Server`` against the scripted endpoint over loopback and assert what
was sent on the wire.
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from memory_testlib import check_tool_pairing, rand_history, rand_text
from protocol import MsgType as T
from server.app import Server
from server.memory.context import (CUT_OFF_NOTE, NO_ANSWER, NO_ANSWER_FAILED, NO_ANSWER_TEXTS, WINDOW_CUT_NOTE,
                                   WINDOW_RESULTS_SHARE, Parts, assemble, build_turns, expand_message, has_answer,
                                   recent_turns)
from server.memory.tokens import ApproxTokenCounter
from storage.models import ChatMessage, ToolCall
from testkit.scripted_llm import Reply, ScriptedLLM, StreamedOnlyLLM, ToolCallSpec
from testkit.server import V3Client, make_config

COUNTER = ApproxTokenCounter()
SYSTEM = "You are NPLT Assistant, a remote operations assistant."
CUT_RE = re.compile(r"(?s)(?:(.*)\n)?\[\.\.\. cut to fit the context budget: (\d+) more characters\]")
CUT_SLACK = 3      # a cut takes what is asked and at most this many tokens more (the marker's estimate)



def _config(tmp_path: Path, llm: ScriptedLLM, **sections: Any) -> Any:
    return make_config(tmp_path, sections={
        "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": llm.model, "retries": 0},
        "summarization": {"enabled": False}, **sections})


async def _turn(c: V3Client, text: str) -> dict[str, Any]:
    """One chat turn; its TURN_END or TURN_ERROR body."""
    reply = await c.call(T.CHAT_TEXT, text=text)
    events = await c.turn_events(reply["turn_id"], timeout=30)
    return events[-1].body


def _is_cut_of(sent: dict[str, Any], whole: dict[str, Any]) -> bool:
    """``sent`` is the tool result ``whole`` cut to fit: same id, its head kept, the cut marked."""
    m = CUT_RE.fullmatch(sent.get("content") or "")
    if m is None or sent.keys() != whole.keys() or sent["tool_call_id"] != whole["tool_call_id"]:
        return False
    head = m.group(1) or ""
    return whole["content"].startswith(head) and int(m.group(2)) == len(whole["content"]) - len(head)


def check_window_body(msgs: list[dict[str, Any]], window: list[Any], meta: dict[str, Any]) -> int:
    """What is sent before the new message is the newest ``turns_kept`` turns of ``window``, each with
    the ``NO_ANSWER`` placeholder when it had no answer, tool results possibly cut; the cuts counted
    agree with the metadata. Returns the number of results cut."""
    assert meta["turns_kept"] + meta["turns_dropped"] == len(window)
    kept = window[len(window) - meta["turns_kept"]:]
    body = [m for t in kept for m in (t.messages if has_answer(t.messages)
                                      else [*t.messages, {"role": "assistant", "content": NO_ANSWER}])]
    sent = msgs[len(msgs) - 1 - len(body):-1]
    assert len(sent) == len(body)
    cut = 0
    for s, b in zip(sent, body):
        if s != b:
            assert b["role"] == "tool" and _is_cut_of(s, b), (s, b)
            cut += 1
    assert cut == (meta.get("window_results_cut") or {}).get("count", 0)
    return cut


# -- 1. turns that ended early ---------------------------------------------------------------------
def _asst(content: str, meta: dict[str, Any], calls: list[ToolCall] | None = None, id: int = 2) -> ChatMessage:
    return ChatMessage(id, "assistant", content, tool_calls=calls or [], metadata=meta)


def test_an_answer_that_ended_early_is_replayed_as_a_placeholder_or_marked_as_cut_off():
    failed = {"finish_reason": "error", "error": "LLM_ERROR", "partial": False}
    assert expand_message(_asst("", failed)) == [{"role": "assistant", "content": NO_ANSWER_TEXTS["error"]}]
    assert expand_message(_asst("", {**failed, "error": "LLM_TIMEOUT"}))[-1]["content"] == NO_ANSWER_TEXTS["error"]
    assert expand_message(_asst("", {**failed, "error": "INTERNAL"})) == [
        {"role": "assistant", "content": NO_ANSWER_FAILED}]
    assert expand_message(_asst("partial words", {**failed, "partial": True})) == [
        {"role": "assistant", "content": "partial words" + CUT_OFF_NOTE}]
    cancelled = {"finish_reason": "cancelled", "partial": True}
    assert expand_message(_asst("", cancelled)) == [{"role": "assistant", "content": NO_ANSWER_TEXTS["cancelled"]}]
    assert expand_message(_asst("half an", cancelled)) == [{"role": "assistant", "content": "half an" + CUT_OFF_NOTE}]
    interrupted = {"finish_reason": "interrupted", "interrupted": True, "partial": True}
    assert expand_message(_asst("", interrupted)) == [
        {"role": "assistant", "content": NO_ANSWER_TEXTS["interrupted"]}]
    # tool steps that ran before the failure stay, the placeholder comes after their results
    calls = [ToolCall("c1", "clock", {}, "12:00", step=0)]
    got = expand_message(_asst("", {**failed, "partial": True}, calls))
    assert [m["role"] for m in got] == ["assistant", "tool", "assistant"]
    assert got[1]["tool_call_id"] == "c1" and got[-1]["content"] == NO_ANSWER_TEXTS["error"]
    # finished answers and superseded ones are as before
    assert expand_message(_asst("fine", {"finish_reason": "stop"})) == [{"role": "assistant", "content": "fine"}]
    assert expand_message(_asst("old", {"superseded": True, "finish_reason": "error", "error": "LLM_ERROR"})) == []


def test_every_window_turn_ends_with_an_answer_so_roles_alternate():
    history = [ChatMessage(1, "user", "q1"), _asst("a1", {"finish_reason": "stop"}, id=2),
               ChatMessage(3, "user", "q2"), _asst("", {"finish_reason": "error", "error": "LLM_ERROR"}, id=4),
               ChatMessage(5, "user", "q3"),                                  # no answer stored at all
               ChatMessage(6, "user", "q4"), _asst("cut", {"finish_reason": "error", "error": "LLM_ERROR",
                                                          "partial": True}, id=7)]
    window, older = recent_turns(history, 10, COUNTER)
    assert older == 0 and window == build_turns(history, COUNTER)
    assert all(t.tokens == sum(COUNTER.count_message(m) for m in t.messages) for t in window)
    msgs = assemble(Parts(SYSTEM, "q5", turns=window), COUNTER, 10_000).messages
    assert [(m["role"], m["content"]) for m in msgs] == [
        ("system", SYSTEM), ("user", "q1"), ("assistant", "a1"),
        ("user", "q2"), ("assistant", NO_ANSWER_TEXTS["error"]),
        ("user", "q3"), ("assistant", NO_ANSWER),
        ("user", "q4"), ("assistant", "cut" + CUT_OFF_NOTE),
        ("user", "q5")]


def test_random_histories_never_send_two_user_messages_in_a_row():
    rng = random.Random(3217)
    for _ in range(300):
        history = rand_history(rng, rng.randint(0, 30))
        for m in history:                          # some answers ended early, with or without text
            if m.role == "assistant" and rng.random() < 0.3:
                m.metadata.update(rng.choice(({"finish_reason": "error", "error": "LLM_ERROR"},
                                              {"finish_reason": "cancelled", "partial": True},
                                              {"finish_reason": "interrupted", "interrupted": True})))
        window, _ = recent_turns(history, rng.randint(0, 8), COUNTER)
        ctx = assemble(Parts(SYSTEM, "now?", turns=window), COUNTER, rng.choice((300, 2000, 100_000)))
        roles = [m["role"] for m in ctx.messages]
        assert not any(a == b == "user" for a, b in zip(roles, roles[1:])), roles
        check_tool_pairing(ctx.messages)
        check_window_body(ctx.messages, window, ctx.metadata)


async def test_after_failed_turns_the_endpoint_gets_alternating_roles(tmp_path):
    async with StreamedOnlyLLM() as llm:
        srv = Server(_config(tmp_path, llm))
        addr = await srv.start()
        try:
            c = await V3Client.connect(addr)
            llm.push(Reply.text("first ok"))
            assert (await _turn(c, "q1"))["message"]["content"] == "first ok"
            llm.push(Reply.fail(503, "overloaded"))
            assert (await _turn(c, "q2 (fails)"))["code"] == "LLM_ERROR"
            llm.push(Reply.cut_stream("partial words", abrupt=True))
            failed = await _turn(c, "q3 (cut)")
            assert failed["code"] == "LLM_ERROR" and failed["partial_message"]["content"] == "partial words"
            llm.push(Reply.text("ok4"))
            end = await _turn(c, "q4")
            sid = end["session_id"]
            await c.close()
            stored = await srv.services.store.messages(sid)
        finally:
            await srv.stop()
    assert end["message"]["content"] == "ok4"
    sent = llm.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user", "assistant", "user", "assistant",
                                         "user"]
    assert [m["content"] for m in sent[1:4]] == ["q1", "first ok", "q2 (fails)"]
    # (the reason and the cut are named once server.memory.view expands with expand_message)
    assert sent[4]["content"] in (NO_ANSWER_TEXTS["error"], NO_ANSWER)
    assert sent[5]["content"] == "q3 (cut)" and sent[6]["content"] in ("partial words" + CUT_OFF_NOTE, "partial words")
    assert sent[7]["content"] == "q4"
    # the same stored messages read back from storage: the endpoint failure and the cut are named
    assert [m.content for m in stored[-2:]] == ["q4", "ok4"]
    window, _ = recent_turns(stored[:-2], 5, COUNTER)
    replayed = [(m["role"], m["content"]) for t in window for m in t.messages]
    assert replayed == [("user", "q1"), ("assistant", "first ok"),
                        ("user", "q2 (fails)"), ("assistant", "[no answer: the model endpoint failed]"),
                        ("user", "q3 (cut)"), ("assistant", "partial words\n[answer cut off]")]


# -- 2. large tool results in the window -----------------------------------------------------------
def _tool_turn(first_id: int, n: int, size: int, words: int = 20) -> list[ChatMessage]:
    calls = [ToolCall(f"t{first_id}_{i}", "read_file", {"path": f"/var/log/{i}.log"},
                      " ".join(f"line{first_id}x{i}x{j}" for j in range(size)), step=0) for i in range(n)]
    return [ChatMessage(first_id, "user", f"question {first_id} " + "disk " * words),
            ChatMessage(first_id + 1, "assistant", f"answer {first_id} " + "ok " * words, tool_calls=calls)]


def _fully_cut(turn: Any) -> list[dict[str, Any]]:
    """``turn``'s messages with every tool result cut down to the marker (where that is shorter)."""
    out = []
    for m in turn.messages:
        if m["role"] == "tool" and m["content"]:
            note = {**m, "content": f"[... cut to fit the context budget: {len(m['content'])} more characters]"}
            m = note if COUNTER.count_message(note) < COUNTER.count_message(m) else m
        out.append(m)
    return out


def _prompt_tokens(turns: list[Any], new: str = "and now?", cut: bool = False) -> int:
    body = [m for t in turns for m in (_fully_cut(t) if cut else t.messages)]
    return COUNTER.count_messages([{"role": "system", "content": SYSTEM}, *body, {"role": "user", "content": new}])


def _results(messages: list[dict[str, Any]]) -> int:
    """The tokens of the tool results among ``messages``."""
    return sum(COUNTER.count_message(m) for m in messages if m["role"] == "tool")


def check_share(msgs: list[dict[str, Any]], budget: int, meta: dict[str, Any]) -> None:
    """The rule for the window turns' results: beyond their share of the budget they are cut (unless
    every one is down to its marker or cannot be made shorter); a cut goes no further than the share
    or the budget asks (give or take ``CUT_SLACK``)."""
    cap, held = int(budget * WINDOW_RESULTS_SHARE), _results(msgs)
    if held > cap:                          # nothing left to cut: each result is a marker or shorter
        for m in (m for m in msgs if m["role"] == "tool"):
            got = CUT_RE.fullmatch(m["content"] or "")
            marker = {**m, "content": WINDOW_CUT_NOTE.format(n=len(m["content"] or ""))}
            assert (got is not None and got.group(1) is None) or \
                COUNTER.count_message(marker) >= COUNTER.count_message(m), (held, cap, m)
    if meta.get("window_results_cut"):
        assert min(cap - held, budget - COUNTER.count_messages(msgs)) <= CUT_SLACK, (held, cap, budget)


def _states(msgs: list[dict[str, Any]], whole: list[dict[str, Any]]) -> list[str]:
    """Per tool result (in order): "whole", "head" (cut, its head kept) or "marker" (cut to the marker)."""
    sent = [m for m in msgs if m["role"] == "tool"]
    full = [m for m in whole if m["role"] == "tool"]
    assert len(sent) == len(full)
    return ["whole" if s == w else "marker" if CUT_RE.fullmatch(s["content"]).group(1) is None else "head"
            for s, w in zip(sent, full)]


def test_tool_results_beyond_their_share_are_cut_oldest_turn_first_even_when_the_prompt_fits():
    history = _tool_turn(1, 3, 400, words=200) + _tool_turn(3, 3, 400, words=200)
    turns = build_turns(history, COUNTER)
    whole = [m for t in turns for m in t.messages]
    full, results = _prompt_tokens(turns), _results(whole)
    rest = full - results                                               # what is not a tool result

    budget = full + 10                                                  # it would all fit
    cap = int(budget * WINDOW_RESULTS_SHARE)
    ctx = assemble(Parts(SYSTEM, "and now?", turns=turns), COUNTER, budget)
    meta, msgs = ctx.metadata, ctx.messages
    assert meta["turns_dropped"] == 0 and meta["turns_kept"] == 2
    assert meta["prompt_tokens_estimate"] == COUNTER.count_messages(msgs) <= budget
    cut = check_window_body(msgs, turns, meta)
    assert cap - CUT_SLACK <= _results(msgs) <= cap                     # cut to the share, no further
    # oldest first: results down to the marker, then one with its head kept, the rest whole
    assert _states(msgs, whole) == ["marker"] * (cut - 1) + ["head"] + ["whole"] * (6 - cut)
    assert meta["window_results_cut"] == {"count": cut, "turns": 1 if cut <= 3 else 2}
    assert msgs[-1 - len(turns[1].messages):-1] == turns[1].messages     # here: the newest turn whole
    assert turns == build_turns(history, COUNTER)                       # the window turns given are not changed

    # over budget even with the results at their share: then cut further, only as far as needed (the
    # result cut partly for the share is cut further before the next one is touched)
    budget = 2 * rest - 200
    assert budget - rest < int(budget * WINDOW_RESULTS_SHARE) and _prompt_tokens(turns, cut=True) < budget
    ctx = assemble(Parts(SYSTEM, "and now?", turns=turns), COUNTER, budget)
    meta, msgs = ctx.metadata, ctx.messages
    assert meta["turns_dropped"] == 0 and check_window_body(msgs, turns, meta) == meta["window_results_cut"]["count"]
    assert budget - CUT_SLACK <= COUNTER.count_messages(msgs) <= budget
    states = _states(msgs, whole)
    cut = 6 - states.count("whole")
    assert states[:cut - 1] == ["marker"] * (cut - 1) and states[cut:] == ["whole"] * (6 - cut)

    # the newest turn's results go last
    ctx = assemble(Parts(SYSTEM, "and now?", turns=turns), COUNTER, rest + 200)
    assert ctx.metadata["turns_dropped"] == 0 and check_window_body(ctx.messages, turns, ctx.metadata) == 6
    assert ctx.metadata["window_results_cut"] == {"count": 6, "turns": 2}

    # a whole turn goes only when the prompt cannot fit even with every result cut; then the
    # results of the turns that stay are cut (to their share, then as far as needed), not those of
    # the dropped one
    least = _prompt_tokens(turns, cut=True)
    ctx = assemble(Parts(SYSTEM, "and now?", turns=turns), COUNTER, least - 1)
    assert (ctx.metadata["turns_dropped"], ctx.metadata["turns_kept"]) == (1, 1)
    assert check_window_body(ctx.messages, turns, ctx.metadata) == 3
    assert ctx.metadata["window_results_cut"] == {"count": 3, "turns": 1}
    check_share(ctx.messages, least - 1, ctx.metadata)
    check_tool_pairing(ctx.messages)


def test_a_turn_that_must_go_anyway_goes_before_the_results_of_the_next_are_cut():
    # the newer turn's results are within their share: they stay whole
    history = _tool_turn(1, 1, 5, words=3000) + _tool_turn(3, 3, 400, words=2000)   # long answers, long results
    turns = build_turns(history, COUNTER)
    budget = _prompt_tokens(turns[1:]) + 10
    assert _results(turns[1].messages) <= int(budget * WINDOW_RESULTS_SHARE)
    ctx = assemble(Parts(SYSTEM, "and now?", turns=turns), COUNTER, budget)
    assert (ctx.metadata["turns_dropped"], ctx.metadata["turns_kept"]) == (1, 1)
    assert "window_results_cut" not in ctx.metadata
    assert ctx.messages[1:-1] == turns[1].messages                      # the newer turn whole

    # beyond their share: the older turn's texts are oversize now (over WINDOW_TEXT_SHARE of the
    # smaller budget): their middle is cut (s34) instead of the whole turn going; the newer one's
    # results are cut to their share only (the prompt fits then), its question, call and answer whole
    history = _tool_turn(1, 1, 5, words=3000) + _tool_turn(3, 3, 400)
    turns = build_turns(history, COUNTER)
    budget = _prompt_tokens(turns[1:]) + 10
    cap = int(budget * WINDOW_RESULTS_SHARE)
    ctx = assemble(Parts(SYSTEM, "and now?", turns=turns), COUNTER, budget)
    meta, msgs = ctx.metadata, ctx.messages
    assert (meta["turns_dropped"], meta["turns_kept"]) == (0, 2)
    assert meta["window_texts_cut"] == {"count": 2, "turns": 1}
    assert meta["window_results_cut"]["turns"] == 1
    assert COUNTER.count_messages(msgs) <= budget
    assert cap - CUT_SLACK <= _results(msgs) <= cap
    newer = [m for m in turns[1].messages if m["role"] != "tool"]
    assert [m for m in msgs[1:-1] if m["role"] != "tool"][-len(newer):] == newer
    assert [m["content"] for m in msgs[1:-1] if m["role"] == "tool"][0] == turns[0].messages[2]["content"]


def test_random_histories_with_large_results_keep_every_invariant():
    rng = random.Random(3218)
    cuts = drops = 0
    for n in range(300):
        history: list[ChatMessage] = []
        for k in range(rng.randint(1, 5)):
            history += _tool_turn(len(history) + 1, rng.randint(0, 4), rng.choice((5, 200, 1500)), rng.randint(1, 50))
        if rng.random() < 0.3:
            history += rand_history(rng, rng.randint(1, 10))
            for i, m in enumerate(history):
                m.id = i + 1
        snapshot = [m.to_dict() for m in history]
        window, _ = recent_turns(history, rng.randint(1, 6), COUNTER)
        budget = rng.choice((256, 800, 2000, 6000, 20_000))
        new = rand_text(rng, 1, 60)
        ctx = assemble(Parts(SYSTEM, new, turns=window), COUNTER, budget)
        meta = ctx.metadata
        assert [m.to_dict() for m in history] == snapshot
        assert COUNTER.count_messages(ctx.messages) == meta["prompt_tokens_estimate"] <= budget
        check_tool_pairing(ctx.messages)
        cuts += check_window_body(ctx.messages, window, meta)
        check_share(ctx.messages, budget, meta)     # beyond their share cut, then only as far as needed
        if meta["turns_dropped"] and not meta["message_truncated"]:   # the fewest turns dropped
            keep = [t if has_answer(t.messages) else type(t)([*t.messages, {"role": "assistant", "content": NO_ANSWER}],
                                                              t.ids, 0)
                    for t in window[meta["turns_dropped"] - 1:]]
            assert _prompt_tokens(keep, new, cut=True) > budget
            drops += 1
    assert cuts > 100 and drops > 10


async def test_the_follow_up_to_a_turn_with_large_tool_results_keeps_that_turn(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    big = files / "big.log"
    big.write_text("".join(f"{i:05d} worker{i} handled request{i} in {i % 97} ms status ok\n" for i in range(3000)))
    calls = [ToolCallSpec(f"r{i}", "read_file", json.dumps({"path": str(big), "offset": 1 + 300 * i, "lines": 500}))
             for i in range(6)]
    async with StreamedOnlyLLM() as llm:
        srv = Server(_config(tmp_path, llm, tools={"file_roots": [str(files)]}))   # the default window
        addr = await srv.start()
        try:
            c = await V3Client.connect(addr)
            llm.push(Reply.tools(*calls), Reply.text("the log shows 3000 requests, all ok"))
            first = await _turn(c, "read the big log")
            llm.push(Reply.text("ok"))
            n = len(llm.requests)
            second = await _turn(c, "and the slowest one?")
            await c.close()
        finally:
            await srv.stop()
    assert first["message"]["content"] == "the log shows 3000 requests, all ok"
    stored = first["message"]["tool_calls"]
    assert len(stored) == 6 and all(len(c["result"]) > 10_000 for c in stored)     # large results
    ctx = second["context"]
    assert ctx["turns_dropped"] == 0 and ctx["turns_kept"] == 1
    sent = llm.requests[n].body["messages"]
    roles = [m["role"] for m in sent]
    assert roles == ["system", "user", "assistant"] + ["tool"] * 6 + ["assistant", "user"]
    assert sent[1]["content"] == "read the big log" and sent[-2]["content"] == "the log shows 3000 requests, all ok"
    assert [c["id"] for c in sent[2]["tool_calls"]] == [m["tool_call_id"] for m in sent[3:9]] == [
        f"r{i}" for i in range(6)]
    whole = {c["id"]: c["result"] for c in stored}
    cut = [m for m in sent[3:9] if m["content"] != whole[m["tool_call_id"]]]
    assert cut and all(_is_cut_of(m, {**m, "content": whole[m["tool_call_id"]]}) for m in cut)
    assert ctx["window_results_cut"] == {"count": len(cut), "turns": 1}
    assert COUNTER.count_messages(sent) <= ctx["budget_tokens"]
    check_share(sent, ctx["budget_tokens"], ctx)          # the results hold at most their share
