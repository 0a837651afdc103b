"""S34 the prompt's window and summary when one part is very large.

* One oversize window text (a pasted log, a very long answer: more than ``WINDOW_TEXT_SHARE`` of the
  budget) is cut in the middle (head and tail kept, ``WINDOW_TEXT_CUT_NOTE`` between) before any whole
  turn is dropped: the other window turns, small older ones included, stay. Before, one such turn
  dropped every window turn and the model got only the system prompt and the question.
* A summary larger than ``SUMMARY_SHARE`` of the budget (stored before ``max_summary_tokens``
  existed) gives up its tail down to that share before any window turn is cut or dropped. Before,
  every window turn was dropped first (``turns_kept 0``) and the last turn's fact was lost.

The server tests run a real ``Server`` with the OpenAI agent against the scripted endpoint over
loopback and assert what the endpoint receives; the property test checks the invariants over
generated windows with oversize texts.
"""
from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest

from memory_testlib import check_tool_pairing, rand_history, rand_text
from protocol import MsgType as T
from server.app import Server
from server.memory.context import (NO_ANSWER, SUMMARY_SHARE, WINDOW_TEXT_MIN_TOKENS, Excerpt, Parts, assemble,
                                   build_turns, has_answer, oversize_tokens)
from server.memory.tokens import ApproxTokenCounter
from storage.models import ChatMessage, SummaryRecord, ToolCall
from testkit.scripted_llm import Recorded, Reply, ScriptedLLM
from testkit.server import V3Client, make_config, poll

MODEL = "scripted-a"
COUNTER = ApproxTokenCounter()
SYSTEM = "You are NPLT Assistant, a remote operations assistant."
TEXT_CUT_RE = re.compile(r"(?s)(.*)\n\[\.\.\. (\d+) characters cut here to fit the context budget \.\.\.\]\n(.*)")
TOOL_CUT_RE = re.compile(r"(?s)(?:(.*)\n)?\[\.\.\. cut to fit the context budget: (\d+) more characters\]")


def is_text_cut_of(sent: str, whole: str) -> bool:
    """``sent`` is ``whole`` with its middle cut: a head and a tail of it, the note between saying
    how many characters went."""
    m = TEXT_CUT_RE.fullmatch(sent)
    if m is None:
        return False
    head, n, tail = m.group(1), int(m.group(2)), m.group(3)
    return whole.startswith(head) and whole.endswith(tail) and len(head) + n + len(tail) == len(whole)


def _log(lines: int) -> str:
    """A pasted log like the reviewer's (~31,000 characters, CJK in it), its first ERROR in the middle."""
    out = []
    for i in range(lines):
        level = "[E] WAL archive full" if i == lines // 2 else "[W]"
        out.append(f"2026-11-27T10:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z {level} {{db-7}} 副本延迟={i}ms; 复制=落后;")
    return "\n".join(out) + "\n"


class ChatLLM(ScriptedLLM):
    """Streams the next of ``answers`` to each chat turn ("ok" once they run out)."""

    def __init__(self, answers: list[str]) -> None:
        super().__init__(model=MODEL)
        self.answers = list(answers)

    async def _respond(self, req: Recorded, writer: Any) -> bool:
        text = self.answers.pop(0) if self.answers else "ok"
        self.push(Reply.text(*[text[i:i + 4000] for i in range(0, len(text), 4000)]))
        return await super()._respond(req, writer)


def _config(tmp_path: Path, llm: ScriptedLLM, **sections: Any) -> Any:
    return make_config(tmp_path, sections={
        "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": MODEL, "retries": 0},
        "user_memory": {"enabled": False}, "summarization": {"enabled": False}, **sections})


async def _turn(c: V3Client, text: str) -> dict[str, Any]:
    reply = await c.call(T.CHAT_TEXT, text=text)
    events = await c.turn_events(reply["turn_id"], timeout=30)
    assert events[-1].type == T.TURN_END, events[-1].body
    return events[-1].body


# -- 6. one oversize turn no longer empties the window ---------------------------------------------------

LOG = _log(570)
RUNBOOK = "".join(f"Step {i}: check the replica lag and the WAL archive, then restart.\n" for i in range(1, 1000))


@pytest.mark.parametrize("case", ["pasted log", "long answer"])
async def test_one_oversize_turn_keeps_the_earlier_small_turn_and_is_cut_in_the_middle(tmp_path, case):
    """The default window (max_input_tokens 16000, the tool schemas reserved): turn 1 names the
    ticket, turn 2 holds ~31,000 pasted characters (or a ~67,000-character answer), turn 3 asks."""
    assert len(LOG) > 30_000 and len(RUNBOOK) > 60_000
    first = "We are working on incident INC-4711 about replica lag."
    ack = "Noted: the incident ticket is INC-4711."
    if case == "pasted log":
        second, answer = "Here is the log, what is wrong?\n" + LOG, "The first ERROR is at 10:17 (WAL archive full)."
    else:
        second, answer = "Write the full runbook for replica lag, every step.", RUNBOOK
    async with ChatLLM([ack, answer, "ok"]) as llm:
        srv = Server(_config(tmp_path, llm))
        addr = await srv.start()
        try:
            c = await V3Client.connect(addr)
            await _turn(c, first)
            await _turn(c, second)
            end = await _turn(c, "When did the first ERROR happen, and what is our ticket number?")
            await c.close()
        finally:
            await srv.stop()
    ctx = end["message"]["metadata"]["context"]
    sent = llm.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert (sent[1]["content"], sent[2]["content"]) == (first, ack)          # the small turn, whole
    big = 3 if case == "pasted log" else 4
    whole = second if case == "pasted log" else answer
    assert is_text_cut_of(sent[big]["content"], whole), sent[big]["content"][:200]
    assert sent[7 - big]["content"] == (answer if case == "pasted log" else second)   # the other text: whole
    assert (ctx["turns_kept"], ctx["turns_dropped"]) == (2, 0)
    assert ctx["window_texts_cut"] == {"count": 1, "turns": 1}
    assert ctx["prompt_tokens_estimate"] <= ctx["budget_tokens"]
    # the cut keeps the text's start and end, and uses the room: well over half of the budget
    assert COUNTER.count(sent[big]["content"]) > ctx["budget_tokens"] // 2


def _turn_msgs(first_id: int, user: str, answer: str, calls: tuple[ToolCall, ...] = ()) -> list[ChatMessage]:
    return [ChatMessage(first_id, "user", user), ChatMessage(first_id + 1, "assistant", answer, tool_calls=list(calls))]


def test_the_oversize_text_is_cut_and_smaller_turns_stay_whole_wherever_they_are():
    budget = 4000
    big = "paste " + "x" * 4 * 6000                        # ~6,000 tokens: over the whole budget
    for where in range(3):                                  # the big turn oldest, in the middle, newest
        history: list[ChatMessage] = []
        for i in range(3):
            user = big if i == where else f"small question {i} about db-{i}"
            history += _turn_msgs(2 * i + 1, user, f"answer {i}")
        turns = build_turns(history, COUNTER)
        ctx = assemble(Parts(SYSTEM, "and now?", turns=turns), COUNTER, budget)
        meta, msgs = ctx.metadata, ctx.messages
        assert (meta["turns_kept"], meta["turns_dropped"]) == (3, 0), where
        assert meta["window_texts_cut"] == {"count": 1, "turns": 1}
        assert COUNTER.count_messages(msgs) <= budget
        body = msgs[1:-1]
        for i in range(3):
            user, answer = body[2 * i]["content"], body[2 * i + 1]["content"]
            assert answer == f"answer {i}"
            assert is_text_cut_of(user, big) if i == where else user == f"small question {i} about db-{i}"


def test_texts_within_their_share_are_never_cut_the_oldest_turn_goes_as_before():
    budget = 4000
    text = "word " * int(oversize_tokens(budget) * 0.9)      # long, but not oversize
    history = _turn_msgs(1, "first " + text, "a1") + _turn_msgs(3, "second " + text, "a2") \
        + _turn_msgs(5, "third " + text, "a3")
    turns = build_turns(history, COUNTER)
    ctx = assemble(Parts(SYSTEM, "and now?", turns=turns), COUNTER, budget)
    assert (ctx.metadata["turns_kept"], ctx.metadata["turns_dropped"]) == (2, 1)
    assert "window_texts_cut" not in ctx.metadata
    assert ctx.messages[1:-1] == turns[1].messages + turns[2].messages


def test_an_oversize_text_is_cut_no_further_than_the_floor_then_the_oldest_turn_goes():
    budget = 1200
    big = "y " * 2000                                        # oversize (over 600 tokens)
    history = _turn_msgs(1, "small first", "a1") + _turn_msgs(3, "paste " + big, "a2 " + big)
    turns = build_turns(history, COUNTER)
    ctx = assemble(Parts(SYSTEM, "and now? " * 150, turns=turns), COUNTER, budget)   # a long new message
    meta, msgs = ctx.metadata, ctx.messages
    assert COUNTER.count_messages(msgs) <= budget
    for m in msgs[1:-1]:
        if TEXT_CUT_RE.fullmatch(m["content"]):
            assert COUNTER.count(m["content"]) >= WINDOW_TEXT_MIN_TOKENS - 8    # (the cut's rounding)
    assert meta["turns_kept"] + meta["turns_dropped"] == 2


# -- 3. a summary larger than its share of the budget ----------------------------------------------------

def test_a_summary_over_its_share_is_trimmed_before_any_window_turn_goes():
    turns = build_turns(_turn_msgs(1, "the backup host is bk-1", "noted")
                        + _turn_msgs(3, "the backup host is bk-3 now", "noted, bk-3"), COUNTER)
    summary = SummaryRecord("Summary: " + "The user talked about nginx and the backup job. " * 1500, 1, 10)
    budget = 4000
    ctx = assemble(Parts(SYSTEM, "what was the last backup host?", summary, turns=turns), COUNTER, budget)
    meta, msgs = ctx.metadata, ctx.messages
    assert (meta["turns_kept"], meta["turns_dropped"]) == (2, 0) and meta["summary_trimmed"]
    assert meta["summary_used"] == 10
    assert msgs[1]["content"].startswith("Summary of the earlier conversation (messages 1-10):\nSummary: The user")
    assert msgs[1]["content"].endswith("[summary truncated to fit the context window]")
    assert budget - 5 <= COUNTER.count_messages(msgs) <= budget       # cut only as far as the budget asks
    assert msgs[-3]["content"] == "the backup host is bk-3 now"
    # with larger turns it goes down to its share, and no further before a turn goes
    share = int(budget * SUMMARY_SHARE)
    large = build_turns(_turn_msgs(1, "the backup host is bk-1 " + "a " * 1500, "noted")
                        + _turn_msgs(3, "the backup host is bk-3 now " + "b " * 1500, "noted, bk-3"), COUNTER)
    ctx = assemble(Parts(SYSTEM, "what was the last backup host?", summary, turns=large), COUNTER, budget)
    meta, msgs = ctx.metadata, ctx.messages
    assert (meta["turns_kept"], meta["turns_dropped"]) == (1, 1) and meta["summary_trimmed"]
    assert share - 5 <= COUNTER.count_message(msgs[1]) <= share
    assert msgs[-3]["content"] == large[1].messages[0]["content"] and COUNTER.count_messages(msgs) <= budget
    # a summary within its share stays whole while the turns fit
    small = SummaryRecord("The user talked about nginx.", 1, 10)
    ctx = assemble(Parts(SYSTEM, "what was the last backup host?", small, turns=turns), COUNTER, budget)
    assert not ctx.metadata["summary_trimmed"] and small.text in ctx.messages[1]["content"]
    # a summary over its share but a prompt within the budget: nothing is cut
    ctx = assemble(Parts(SYSTEM, "q", summary, turns=turns), COUNTER, 100_000)
    assert not ctx.metadata["summary_trimmed"] and ctx.messages[1]["content"].endswith(summary.text)


async def test_a_stored_summary_over_its_share_leaves_the_window_turns_on_the_wire(tmp_path):
    """The reviewer's t13: a summary of ~70,000 characters (stored before max_summary_tokens; here by
    setting it high), the default context: the summary gives up its tail as far as the budget asks
    (not below its share), the window turns stay."""
    long = ("Summary: " + "The user talked about nginx and the backup job. " * 1500).strip()

    class LLM(ScriptedLLM):
        async def _respond(self, req: Recorded, writer: Any) -> bool:
            self.push(Reply.text("ok" if req.body.get("stream") else long))
            return await super()._respond(req, writer)

    async with LLM(model=MODEL) as llm:
        srv = Server(_config(tmp_path, llm, summarization={
            "trigger": {"type": "messages", "value": 6}, "keep": {"type": "messages", "value": 4},
            "max_summary_tokens": 1_000_000}))
        addr = await srv.start()
        try:
            c = await V3Client.connect(addr)
            sid = ""
            for i in range(4):
                sid = (await _turn(c, f"turn {i}: the backup host is bk-{i}"))["session_id"]

            async def stored() -> bool:
                rec = await srv.store.get(sid)
                return rec.summary is not None and rec.summary.text == long
            await poll(stored, timeout=15, what="the long summary")
            await srv.services.memory.wait_idle()
            end = await _turn(c, "what was the last backup host I mentioned?")
            await c.close()
        finally:
            await srv.stop()
    ctx = end["message"]["metadata"]["context"]
    sent = [r for r in llm.requests if r.body.get("stream")][-1].body["messages"]
    assert ctx["turns_kept"] >= 2 and ctx["turns_dropped"] == 0 and ctx["summary_trimmed"]
    users = [m["content"] for m in sent if m["role"] == "user"]
    assert "turn 3: the backup host is bk-3" in users
    summary = next(m for m in sent if m["role"] == "system" and m["content"].startswith("Summary of"))
    assert summary["content"].endswith("[summary truncated to fit the context window]")
    assert COUNTER.count(long) > ctx["budget_tokens"] >= ctx["prompt_tokens_estimate"] >= ctx["budget_tokens"] - 5


# -- the invariants over generated windows with oversize texts --------------------------------------------

def test_property_windows_with_oversize_texts_keep_every_invariant():
    rng = random.Random(34_2026)
    cut_seen = dropped_seen = 0
    for _ in range(400):
        history = rand_history(rng, rng.randint(1, 30))
        for m in history:                                     # some pasted logs and very long answers
            if m.role in ("user", "assistant") and rng.random() < 0.15:
                m.content = rand_text(rng, 200, 3000)
        snapshot = [m.to_dict() for m in history]
        window = build_turns(history, COUNTER)[-rng.randint(1, 6):]
        budget = rng.choice((256, 800, 2000, 6000))
        summary = SummaryRecord(rand_text(rng, 1, 2000), 1, 1) if rng.random() < 0.3 else None
        excerpts = [Excerpt([1], "[Recalled] " + rand_text(rng, 1, 40))] if rng.random() < 0.3 else []
        ctx = assemble(Parts(SYSTEM, rand_text(rng, 1, 40), summary, excerpts, window), COUNTER, budget)
        meta, msgs = ctx.metadata, ctx.messages
        assert [m.to_dict() for m in history] == snapshot
        check_tool_pairing(msgs)
        assert COUNTER.count_messages(msgs) <= budget
        assert meta["turns_kept"] + meta["turns_dropped"] == len(window)
        kept = window[len(window) - meta["turns_kept"]:]          # the oldest turns go, the newest stay
        body = [m for t in kept for m in (t.messages if has_answer(t.messages)
                                          else [*t.messages, {"role": "assistant", "content": NO_ANSWER}])]
        sent = msgs[len(msgs) - 1 - len(body):-1]
        assert len(sent) == len(body)
        texts = 0
        for s, b in zip(sent, body):
            if s == b:
                continue
            if b["role"] == "tool":
                assert TOOL_CUT_RE.fullmatch(s["content"] or ""), s
            else:                                             # only oversize texts are cut, head and tail kept
                assert COUNTER.count(b["content"]) > oversize_tokens(budget)
                assert is_text_cut_of(s["content"], b["content"]) and {**s, "content": ""} == {**b, "content": ""}
                texts += 1
        assert texts == (meta.get("window_texts_cut") or {}).get("count", 0)
        cut_seen += texts > 0
        dropped_seen += meta["turns_dropped"] > 0
    assert cut_seen > 20 and dropped_seen > 20
