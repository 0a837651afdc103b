"""The offline agent's intent rules on a long pasted message: they look at its first and last
MAX_PARSE_CHARS / 2 characters only (a 32,000-character paste held the event loop for 100-600 ms
per turn), and still find the request at either end.
"""
from __future__ import annotations

import random

import pytest

from testkit import pastes
import server.agent.intents as intents
from server.agent.intents import MAX_PARSE_CHARS, parse

WORDS = ("request handled upstream latency worker queue flush retry accepted closed 请求 完成 上游 "
         "连接池 队列").split()


def paste(rng: random.Random, n: int) -> str:
    return pastes.paste(rng, n, WORDS)


@pytest.fixture
def seen(monkeypatch) -> list[int]:
    """The lengths of the texts the rules' costly steps get."""
    lengths: list[int] = []
    for name in ("_score", "_network_target", "paths_in", "history_topic", "_process_args"):
        fn = getattr(intents, name)

        def wrapper(text, *args, _fn=fn):
            lengths.append(len(text))
            return _fn(text, *args)
        monkeypatch.setattr(intents, name, wrapper)
    return lengths


def middle(rng: random.Random, words: str) -> str:
    return paste(rng, 15_000) + f" {words} " + paste(rng, 15_000)


def test_a_question_at_the_end_of_a_long_paste_is_found_from_its_ends(seen):
    rng = random.Random(1)
    text = "here is the log:\n" + middle(rng, "uptime load") + "\nis port 5432 open on 127.0.0.1?"
    found = parse(text)
    assert seen and max(seen) <= MAX_PARSE_CHARS + 1
    assert [(i.tool, i.arguments) for i in found] == [("network_check", {"host": "127.0.0.1", "port": 5432})]


def test_the_middle_of_a_long_paste_is_not_a_request(seen):
    rng = random.Random(2)
    text = "how much memory is free? context:\n" + middle(rng, "cpu uptime disk 负载") + "\nthanks"
    assert [(i.name, i.arguments) for i in parse(text)] == [("memory", {"metric": "memory"})]
    assert max(seen) <= MAX_PARSE_CHARS + 1


def test_a_chinese_question_after_a_long_paste(seen):
    rng = random.Random(3)
    text = paste(rng, 32_000) + "\n查看CPU使用率"
    assert [i.name for i in parse(text)] == ["cpu"]
    assert max(seen) <= MAX_PARSE_CHARS + 1


def test_a_short_message_is_parsed_whole():
    text = "show disk usage " + "x" * (MAX_PARSE_CHARS - 40) + " and the uptime"
    assert len(text) <= MAX_PARSE_CHARS
    assert {i.name for i in parse(text)} == {"disk", "uptime"}
