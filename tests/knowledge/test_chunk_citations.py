"""Citations point at what a chunk holds: the pieces of a long paragraph carry their own line range
(a 300-line log without blank lines is one paragraph), their lines come back as written, and a pdf
chunk never claims a page it does not wholly come from."""
from __future__ import annotations

import hashlib

from hypothesis import given, strategies as st

from kb_testlib import make_pdf
from server.knowledge.blocks import Block
from server.knowledge.chunker import chunk_blocks

LOG = [f"2024-05-01 10:{i // 60:02d}:{i % 60:02d} INFO worker-{i % 7} finished job {i} in {i * 3 % 97} ms"
       for i in range(1, 301)]
LOG[249] = "2024-05-01 10:04:10 ERROR worker-5 lost the lease on shard ocelot7731; retrying"
LOG[250] = "    at lease.renew(shard.py:88)"                       # an indented continuation line


def source(lines: list[str], a: int, b: int) -> str:
    return "\n".join(lines[a - 1:b]).strip()


def assert_within(c, lines: list[str], first: int) -> None:
    """The chunk's text is a verbatim run of its lines, starting on its first and ending on its last."""
    a, b = c.line_start - first + 1, c.line_end - first + 1
    assert 1 <= a <= b <= len(lines), (c.line_start, c.line_end)
    assert c.text in source(lines, a, b) and c.text.count("\n") == b - a, (c.line_start, c.line_end, c.text)


def test_a_long_paragraph_of_log_lines_cites_the_lines_of_each_chunk():
    chunks = chunk_blocks([Block("\n".join(LOG), 0, None, 1, 300)], 600, 100)
    assert len(chunks) > 30
    hit = next(c for c in chunks if "ocelot7731" in c.text)
    assert hit.line_start <= 250 <= hit.line_end and hit.line_end - hit.line_start < 12
    for c in chunks:                       # every chunk is exactly its lines, as written (no "\n ")
        assert c.text == source(LOG, c.line_start, c.line_end), (c.line_start, c.line_end)
    assert "\n    at lease.renew" in hit.text or hit.text.startswith("at lease.renew")


def test_sentences_inside_lines_keep_their_line_and_the_spacing():
    lines = [f"Step {i}.  Check the relay {i}; then restart it. Done!" for i in range(1, 41)]
    chunks = chunk_blocks([Block("\n".join(lines), 0, None, 11, 50)], 120, 30)
    assert len(chunks) > 10
    for c in chunks:                       # chunks may start or end inside a line (at a sentence end)
        assert_within(c, lines, 11)
    assert "\n " not in "".join(c.text for c in chunks)
    # text that is not line for line (html: whitespace collapsed, source lines 4-9): the block's range
    para = " ".join(f"Sentence {i} about the cache." for i in range(60))
    chunks = chunk_blocks([Block(para, 0, None, 4, 9)], 200, 0)
    assert len(chunks) > 3 and {(c.line_start, c.line_end) for c in chunks} == {(4, 9)}


def test_short_pdf_pages_are_not_merged_and_overlap_stays_on_its_page():
    pages = ["Page one: general introduction to the manual.",
             "Page two: the emergency shutdown code is ocelot7731.",
             "Page three: contact the on-call engineer."]
    chunks = chunk_blocks([Block(t, 0, n, None, None) for n, t in enumerate(pages, 1)], 600, 100)
    assert [(c.page, c.text) for c in chunks] == [(1, pages[0]), (2, pages[1]), (3, pages[2])]
    long_pages = [" ".join(f"Page {p} sentence {i}." for i in range(40)) for p in (1, 2)]
    chunks = chunk_blocks([Block(t, 0, n, None, None) for n, t in enumerate(long_pages, 1)], 200, 60)
    for c in chunks:
        assert c.text in long_pages[c.page - 1]


async def test_a_fact_on_page_two_is_cited_as_page_two(kb):
    data = make_pdf(["Page one: general introduction to the manual.",
                     "Page two: the emergency shutdown code is ocelot7731.",
                     "Page three: contact the on-call engineer."])
    await kb.ingest("alice", [], None, "manual.pdf", data, md5=hashlib.md5(data).hexdigest())
    hit = (await kb.search("alice", [], "emergency shutdown code", 1))[0]
    assert hit.citation == "[manual.pdf §p. 2]" and "ocelot7731" in hit.text


async def test_a_fact_on_line_250_of_a_log_is_cited_near_line_250(kb):
    data = "\n".join(LOG).encode()
    await kb.ingest("alice", [], None, "app.log", data, md5=hashlib.md5(data).hexdigest())
    hit = (await kb.search("alice", [], "lost the lease on shard ocelot7731", 1))[0]
    a, b = hit.location["lines"]
    assert a <= 250 <= b and b - a < 8 and hit.citation == f"[app.log §lines {a}-{b}]"


@given(st.lists(st.text(st.characters(blacklist_categories=["Cs"]), max_size=120), min_size=1, max_size=40),
       st.integers(60, 400), st.integers(0, 3))
def test_line_ranges_hold_exactly_the_chunk_text(lines, target, overlap_div):
    lines = [ln.replace("\n", " ").replace("\r", " ") for ln in lines]
    if not "".join(lines).strip():
        return
    text = "\n".join(lines)
    stripped = text.strip()
    first = 1 + text[:len(text) - len(text.lstrip())].count("\n")
    last = first + stripped.count("\n")
    chunks = chunk_blocks([Block(stripped, 0, None, first, last)], target, target // 4 * overlap_div // 3)
    assert chunks
    for c in chunks:
        assert_within(c, lines, 1)
        assert len(c.text) <= target
