"""Structure-aware, CJK-aware chunking with overlap and locations, and the citation format."""
from __future__ import annotations

from hypothesis import given, strategies as st

from server.knowledge.blocks import Block
from server.knowledge.chunker import chunk_blocks, citation, sentences


def test_headings_start_chunks_and_form_the_path():
    blocks = [Block("Guide", 1, None, 1, 1), Block("intro", 0, None, 3, 3), Block("Linux", 2, None, 5, 5),
              Block("apt install x", 0, None, 7, 8), Block("Usage", 1, None, 10, 10), Block("run x", 0, None, 12, 12)]
    chunks = chunk_blocks(blocks, 200, 40)
    assert [(c.heading, c.text, c.line_start, c.line_end) for c in chunks] == [
        (("Guide",), "intro", 3, 3), (("Guide", "Linux"), "apt install x", 7, 8), (("Usage",), "run x", 12, 12)]


def test_paragraphs_are_packed_up_to_the_target():
    blocks = [Block(f"para {i} " + "x" * 40, 0, None, i * 2 + 1, i * 2 + 1) for i in range(10)]
    chunks = chunk_blocks(blocks, 150, 0)
    assert all(len(c.text) <= 150 for c in chunks) and len(chunks) == 4
    assert "\n".join(c.text for c in chunks) == "\n".join(b.text for b in blocks)
    assert (chunks[0].line_start, chunks[0].line_end) == (1, 5)


def test_cjk_sentences_split_at_full_stops_with_overlap():
    para = "".join(f"第{i}句话说明一个事实。" for i in range(40))
    chunks = chunk_blocks([Block(para, 0, 3, None, None)], 100, 30)
    assert len(chunks) > 4 and all(len(c.text) <= 100 for c in chunks)
    assert all(c.text.endswith("。") for c in chunks)                 # cut at sentence ends only
    for a, b in zip(chunks, chunks[1:]):                              # the overlap repeats whole sentences
        tail = a.text.split("。")[-2] + "。"
        repeated = b.text[:b.text.index(tail) + len(tail)]
        assert a.text.endswith(repeated) and 0 < len(repeated) <= 30
    assert {c.page for c in chunks} == {3}
    assert sentences("你好！真的吗？是的。OK. Fine", 100) == ["你好！", "真的吗？", "是的。", "OK.", "Fine"]


def test_one_word_repeated_and_one_huge_sentence_are_cut():
    word = "backup " * 5000
    chunks = chunk_blocks([Block(word.strip(), 0, None, 1, 1)], 300, 50)
    assert all(0 < len(c.text) <= 300 for c in chunks)
    cjk = "字" * 1000
    chunks = chunk_blocks([Block(cjk, 0, None, 1, 1)], 300, 0)
    assert "".join(c.text for c in chunks) == cjk


def test_citation_format():
    assert citation("ops.md", {"heading": ["Backup", "Nightly"], "lines": [10, 24]}) == "[ops.md §Backup > Nightly, lines 10-24]"
    assert citation("m.pdf", {"page": 3}) == "[m.pdf §p. 3]"
    assert citation("a.txt", {"lines": [5, 5]}) == "[a.txt §line 5]"
    assert citation("a.txt", {}) == "[a.txt §start]"


@given(st.lists(st.tuples(st.integers(0, 3), st.text(min_size=1, max_size=400)), max_size=30),
       st.integers(60, 500))
def test_chunks_respect_the_target_and_lose_no_text(items, target):
    blocks = [Block(t, lvl, None, i + 1, i + 1) for i, (lvl, t) in enumerate(items)]
    chunks = chunk_blocks(blocks, target, target // 4)
    body = "".join("".join(b.text.split()) for b in blocks if not b.level)
    joined = "".join("".join(c.text.split()) for c in chunks)
    assert all(len(c.text) <= target for c in chunks)
    for b in blocks:                                   # every body character shows up in some chunk
        if not b.level:
            for ch in set("".join(b.text.split())):
                assert ch in joined
    assert len(joined) >= len(body) or not body


def test_the_overlap_never_pushes_a_chunk_over_the_target():
    text = "A" * 69 + ". " + "B" * 19 + ". " + "C" * 89 + "."
    chunks = chunk_blocks([Block(text, 0, None, 1, 1)], 100, 30)
    assert [c.text for c in chunks] == ["A" * 69 + ". " + "B" * 19 + ".", "C" * 89 + "."]
    chunks = chunk_blocks([Block("x" * 40 + ". " + "y" * 20 + ".", 0, None, 1, 1), Block("z" * 90, 0, None, 3, 3)],
                          100, 30)
    assert all(len(c.text) <= 100 for c in chunks) and chunks[-1].text == "z" * 90
