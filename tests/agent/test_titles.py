"""Automatic session titles: the first message's text without Markdown, one line, cut with an ellipsis."""
from __future__ import annotations

import pytest

from server.agent.titles import PARSE_CHARS, markdown_text, title_from_message


@pytest.mark.parametrize("message, title", [
    ("## Why is **nginx** returning `502`?", "Why is nginx returning 502?"),
    ("Check [the logs](https://example.com/logs) and ![chart](x.png)", "Check the logs and chart"),
    ("> quoted *emphasis* and __strong__ ~~gone~~", "quoted emphasis and strong gone"),
    ("- first item\n- second item", "first item second item"),
    ("1. restart nginx\n2. check the port", "restart nginx check the port"),
    ("```sh\nsystemctl status nginx\n```", "systemctl status nginx"),
    ("| host | port |\n|---|---|\n| a | 22 |", "host port a 22"),
    ("plain text, a_b_c and 2 * 3 * 4", "plain text, a_b_c and 2 * 3 * 4"),
    ("检查一下 **磁盘** 空间", "检查一下 磁盘 空间"),
    ("---", "---"),                                  # no text at all: the raw words
    ("  hello\n\n  world  ", "hello world"),
])
def test_markdown_is_stripped(message, title):
    assert title_from_message(message) == title


def test_long_titles_are_cut_at_a_word_with_an_ellipsis():
    title = title_from_message("# " + "please check the disk usage on every mounted filesystem of this server now")
    assert title == "please check the disk usage on every mounted filesystem of…"
    assert len(title) <= 61


def test_a_huge_message_is_parsed_only_at_its_start():
    text = "**start** " + "word " * 400_000
    title = title_from_message(text)
    assert title.startswith("start word") and title.endswith("…")
    assert markdown_text(text[:PARSE_CHARS]).startswith("start ")
