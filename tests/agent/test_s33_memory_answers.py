"""The offline agent's answers from what the user stated (server.agent.memory_answers), session 33:

* the rules run on the event loop every offline turn: a message of the window is distilled once
  (memoized, bounded), a message counts with its first 8 statements, as the memory layer learns
  them (one over 4,000 characters is skipped), and a window whose messages are not memoized yet
  (after a restart) is distilled in a worker thread;
* the items are ranked by how exactly they answer: "what is the host of service billing?" is answered
  by "The host of service billing is ..." first, not by a sibling fact stated later.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import pytest

from protocol import MsgType
from server.agent import memory_answers
from server.memory.context import MEMORY_HEADER
from server.memory.distill import distill_rules as real_distill_rules

from kb_wire.kbwire import chat, connect, wired_server


@pytest.fixture
def distilled(monkeypatch) -> dict[str, list[int]]:
    """An empty memo, and memory_answers' distill calls recorded: message text -> the threads that
    distilled it."""
    monkeypatch.setattr(memory_answers, "_memo", OrderedDict())
    monkeypatch.setattr(memory_answers, "_memo_chars", 0)
    calls: dict[str, list[int]] = {}

    def counting(text: str) -> list[tuple[str, str]]:
        calls.setdefault(text, []).append(threading.get_ident())
        return real_distill_rules(text)
    monkeypatch.setattr(memory_answers, "distill_rules", counting)
    return calls


def window(*said: str, block: list[str] | None = None) -> list[dict[str, Any]]:
    """A turn's context: the system prompt, the memory block's lines, the user's messages (each
    acknowledged), the last one being the message answered."""
    out: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    if block:
        out.append({"role": "system", "content": MEMORY_HEADER + "\n" + "\n".join(f"- {line}" for line in block)})
    for text in said[:-1]:
        out += [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted."}]
    return out + [{"role": "user", "content": said[-1]}]


HERE = " (earlier in this conversation)"


def statements(tag: str, n: int) -> str:
    return " ".join(f"The host of service {tag}{i} is node-{i}.internal." for i in range(1, n + 1))


# -- 1. the loop: the sentence bound, the memo, the worker thread --------------------------------------------
def test_a_message_of_more_than_8_sentences_counts_with_its_first_8_statements(distilled):
    nine, eight = statements("alpha", 9), statements("beta", 8)
    assert len(nine) < 4000                             # (short: the 4,000-character bound does not skip it)
    question = "what is the host of service alpha5?"     # 9 sentences: its first 8 statements count, as the
    assert memory_answers.answer(question, window(nine, question), zh=False).splitlines()[:2] == \
        ["From what you told me earlier:", f"- The host of service alpha5 is node-5.internal.{HERE}"]
    question = "what is the host of service alpha9?"     # ... memory layer learns them (distill_rules): not the 9th
    assert "node-9.internal" not in memory_answers.answer(question, window(nine, question), zh=False)
    assert len(distilled[nine]) == 1                     # distilled once (the memo)
    question = "what is the host of service beta5?"
    assert memory_answers.answer(question, window(eight, question), zh=False).splitlines()[:2] == \
        ["From what you told me earlier:", f"- The host of service beta5 is node-5.internal.{HERE}"]
    assert len(distilled[eight]) == 1


def test_each_message_of_the_window_is_distilled_once_across_turns(distilled):
    said = [statements(f"s{n}x", 8) for n in range(6)]
    first = "what is the host of service s2x3?"
    assert "- The host of service s2x3 is node-3.internal." in memory_answers.answer(first, window(*said, first), False)
    second = "what is the host of service s5x1?"           # the next turn: the window grew by one exchange
    assert "- The host of service s5x1 is node-1.internal." in \
        memory_answers.answer(second, window(*said, first, second), False)
    assert {text: len(threads) for text, threads in distilled.items()} == {text: 1 for text in [*said, first, second]}


def test_the_memo_keeps_at_most_memo_chars_characters_of_messages(distilled, monkeypatch):
    monkeypatch.setattr(memory_answers, "MEMO_CHARS", 1000)
    said = [statements(f"m{n}x", 4) for n in range(10)]     # ~170 characters each
    question = "what is the host of service m9x2?"
    assert memory_answers.answer(question, window(*said, question), False) is not None
    assert memory_answers._memo_chars == sum(map(len, memory_answers._memo)) <= 1000
    # the window is read newest first: its newest messages were used least recently, and dropped
    assert said[9] not in memory_answers._memo and said[0] in memory_answers._memo
    assert memory_answers.answer(question, window(*said, question), False) is not None     # still answers


async def test_a_window_not_memoized_yet_is_distilled_in_a_worker_thread(distilled):
    loop_thread = threading.get_ident()
    said = [statements(f"w{n}x", 8) for n in range(12)]      # ~4,600 characters not memoized (a restart)
    assert sum(map(len, said)) > memory_answers.INLINE_DISTILL_CHARS
    question = "what is the host of service w4x4?"
    got = await memory_answers.answer_async(question, window(*said, question), False)
    assert "- The host of service w4x4 is node-4.internal." in got
    assert all(loop_thread not in distilled[text] for text in said)      # off the loop
    follow = "what is the host of service w1x1?"                           # one new short message: on the loop
    got = await memory_answers.answer_async(follow, window(*said, question, follow), False)
    assert "- The host of service w1x1 is node-1.internal." in got
    assert distilled[follow] == [loop_thread] and all(len(distilled[text]) == 1 for text in said)


async def test_a_window_the_memo_cannot_hold_is_answered_in_a_worker_thread_every_turn(distilled, monkeypatch):
    monkeypatch.setattr(memory_answers, "MEMO_CHARS", 1000)
    loop_thread = threading.get_ident()
    said = [statements(f"v{n}x", 8) for n in range(16)]     # ~6,100 characters: the memo holds 2 of them
    for n in (3, 7):                                   # two turns: dropped from the memo, read again off the loop
        question = f"what is the host of service v{n}x{n}?"
        got = await memory_answers.answer_async(question, window(*said, question), False)
        assert got.splitlines()[1] == f"- The host of service v{n}x{n} is node-{n}.internal.{HERE}"
    assert all(len(distilled[text]) == 2 and loop_thread not in distilled[text] for text in said[4:])


# -- 2. the ranking: the exact item first, newest first among equals ------------------------------------------
BILLING, SEARCH = "The host of service billing is node-1.internal.", "The host of service search is node-2.internal."


@pytest.mark.parametrize("order", [(BILLING, SEARCH), (SEARCH, BILLING)])
def test_the_item_that_holds_every_term_of_the_question_comes_before_a_sibling(distilled, order):
    question = "what is the host of service billing?"
    said = memory_answers.answer(question, window(*order, question), False)
    assert said.splitlines()[1] == f"- {BILLING}{HERE}"
    question = "what is the host of service search?"
    said = memory_answers.answer(question, window(*order, question), False)
    assert said.splitlines()[1] == f"- {SEARCH}{HERE}"


def test_a_chinese_question_is_answered_by_its_own_item_first(distilled):
    billing, search = "计费服务的主机是node-1.internal。", "搜索服务的主机是node-2.internal。"
    for question in ("计费服务的主机是什么？", "计费服务的主机是哪个？"):
        said = memory_answers.answer(question, window(billing, search, question), True)
        assert said.splitlines()[:2] == ["根据你之前告诉我的：", f"- {billing}（本次对话中）"]


def test_the_item_that_states_the_value_asked_comes_first_in_either_language(distilled):
    # "生产数据库的主机是什么？" asks the subject the English item states (no term in common), while the
    # Chinese item about the host's port, stated later, holds 12 of the question's 17 terms
    english, port = "The prod DB host is db-prod-43 now.", "生产数据库主机的端口是5432。"
    question = "生产数据库的主机是什么？"
    said = memory_answers.answer(question, window(english, port, question), True)
    assert said.splitlines()[1:] == [f"- {english}（本次对话中）", f"- {port}（本次对话中）"]


def test_items_that_answer_equally_are_quoted_newest_first_this_conversation_first(distilled):
    older, newer = "The staging server is stage-7.internal.", "The staging server port is 8443."
    question = "what about the staging server?"
    line = "The staging server region is eu-west. (session s_a, 2026-11-21 09:00 UTC)"
    said = memory_answers.answer(question, window(older, newer, question, block=[line]), False)
    assert said.splitlines()[1:] == [f"- {newer}{HERE}", f"- {older}{HERE}", f"- {line}"]


def test_an_exact_memory_block_item_comes_before_a_sibling_stated_here(distilled):
    line = "The host of service billing is node-9.internal. (session s_a, 2026-11-21 09:00 UTC)"
    question = "what is the host of service billing?"
    said = memory_answers.answer(question, window(SEARCH, question, block=[line]), False)
    assert said.splitlines()[1:] == [f"- {line}", f"- {SEARCH}{HERE}"]


# -- over the wire: the reviewer's session ------------------------------------------------------------------
async def test_over_tcp_the_exact_fact_leads_and_earlier_messages_are_distilled_once(tmp_path, distilled):
    async with wired_server(tmp_path) as (srv, addr):
        alice = await connect(addr, "alice")
        for fact in (BILLING, SEARCH):
            end, _ = await chat(alice, fact)
            assert end["message"]["content"] == f"Noted:\n- {fact}"
        for _ in range(2):                                      # two turns: the statements distilled once
            end, _ = await chat(alice, "what is the host of service billing?")
            assert end["message"]["content"].splitlines()[:3] == \
                ["From what you told me earlier:", f"- {BILLING}{HERE}", f"- {SEARCH}{HERE}"]
            assert end["message"]["metadata"]["intents"] == ["memory"]
        assert len(distilled[BILLING]) == len(distilled[SEARCH]) == 1

        await alice.call(MsgType.SESSION_NEW)
        billing, search = "计费服务的主机是node-1.internal。", "搜索服务的主机是node-2.internal。"
        for fact in (billing, search):
            await chat(alice, fact)
        end, _ = await chat(alice, "计费服务的主机是什么？")
        assert end["message"]["content"].splitlines()[1] == f"- {billing}（本次对话中）"
        await alice.close()
