"""A long line without sentence ends is searched for them in bounded windows (before, one
``finditer`` call scanned a 25 MB line holding the GIL 1-2.4 s, stalling every client); the cuts are
exactly those ``finditer`` gave."""
from __future__ import annotations

import re
import sys

from hypothesis import given, strategies as st

from server.knowledge import chunker
from server.knowledge.blocks import Block
from server.knowledge.chunker import _SENTENCE_END, _sentence_ends, _spans, chunk_blocks


def reference_spans(text: str, target: int) -> list[tuple[int, int]]:
    """``_spans`` as it was, with one ``finditer`` over the whole text."""
    out: list[tuple[int, int]] = []
    bounds = [0]
    for m in _SENTENCE_END.finditer(text):
        bounds += [m.start(), m.end()]
    bounds.append(len(text))
    for i in range(0, len(bounds), 2):
        a, b = bounds[i], bounds[i + 1]
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        while b - a > target:
            cut = a + target
            k = cut
            while k > a + target // 2 and not text[k].isspace():
                k -= 1
            if text[k].isspace():
                cut = k
                while cut > a and text[cut - 1].isspace():
                    cut -= 1
            out.append((a, cut))
            a = cut
            while a < b and text[a].isspace():
                a += 1
        if a < b:
            out.append((a, b))
    return out


PIECES = ["a", "bc", " ", "   ", "\n", "\t", "\u3000", "。", "！", "？", "!", "?", "…", ".", ";", "；", "中文", "x.y",
          "e.g. ", "3.14", "。\n", ". ", "; ", "word "]
texts = st.lists(st.sampled_from(PIECES), max_size=60).map("".join)


@given(texts, st.integers(1, 12))
def test_the_windowed_search_finds_what_finditer_finds(text, window):
    assert _sentence_ends(text, window) == [m.span() for m in _SENTENCE_END.finditer(text)]


@given(texts, st.integers(2, 40))
def test_sentences_are_cut_as_before(text, target):
    assert _spans(text, target) == reference_spans(text, target)


def test_ordinary_text_is_chunked_as_before():
    para = ("备份任务每天凌晨两点运行。恢复超时为四十五分钟！请检查日志？ The backup runs at 02:00 UTC. "
            "Restore takes 45 minutes; escalate to oncall-db. " * 40)
    for target in (50, 200, 600):
        assert _spans(para, target) == reference_spans(para, target)
    blocks = [Block(para, 0, None, 1, 1), Block(para.replace(" ", "  "), 0, None, 2, 2)]
    chunks = chunk_blocks(blocks, 200, 40)
    assert chunks and all(len(c.text) <= 200 for c in chunks)
    assert "".join(c.text for c in chunks).count("四十五分钟") >= 80


class Recorder:
    """A compiled pattern that records the span of text each call may scan."""

    def __init__(self, pattern: re.Pattern) -> None:
        self.pattern, self.calls = pattern, []

    def _record(self, string: str, pos: int, endpos: int) -> None:
        self.calls.append(min(endpos, len(string)) - pos)

    def search(self, string: str, pos: int = 0, endpos: int = sys.maxsize):
        self._record(string, pos, endpos)
        return self.pattern.search(string, pos, endpos)

    def finditer(self, string: str, pos: int = 0, endpos: int = sys.maxsize):
        self._record(string, pos, endpos)
        return self.pattern.finditer(string, pos, endpos)


def test_a_long_line_without_sentence_ends_is_searched_in_bounded_windows(monkeypatch):
    target = 600
    line = "".join(f"word{i % 97} " for i in range(60_000)) + "end. " + "x" * 5000 + "。" + " " * 3000 + "tail"
    expected = reference_spans(line, target)
    ends, spaces = Recorder(_SENTENCE_END), Recorder(chunker._NOT_SPACE)
    monkeypatch.setattr(chunker, "_SENTENCE_END", ends)
    monkeypatch.setattr(chunker, "_NOT_SPACE", spaces)
    assert _spans(line, target) == expected
    window = chunker.SENTENCE_SEARCH_WINDOW_TARGETS * target
    assert ends.calls and max(ends.calls) <= window                  # before: one call over the whole line
    assert len(ends.calls) >= len(line) // window
    assert spaces.calls and max(spaces.calls) <= window              # the 3000 spaces after 。, window by window
    chunks = chunk_blocks([Block(line, 0, None, 1, 1)], target, 100)
    assert max(ends.calls) <= window and all(len(c.text) <= target for c in chunks)
    assert chunks[-1].text.endswith("tail")
