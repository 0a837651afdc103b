"""Citations of structured text formats name lines of the uploaded file: every chunk's cited lines
hold its source there, also where the indexed text is not the file's layout (a minified json is
indexed pretty-printed; a csv record with a quoted multi-line cell spans several lines; a yaml block
scalar). Before, a one-line json was cited by the lines of its pretty-printed text (`lines 210-234`
of a 1-line file) and a csv by its row numbers (a row on line 31 cited as `lines 2-27`)."""
from __future__ import annotations

import csv
import hashlib
import io
import json
import re

from hypothesis import given, settings, strategies as st

from server.knowledge.chunker import chunk_blocks
from server.knowledge.config import KnowledgeConfig
from server.knowledge.parsers import parse

TOKEN = re.compile(r"\bw\d+x\d+\b")            # every value in these files holds unique tokens like w12x3


def chunks_of(name: str, data: bytes, target: int = 200, overlap: int = 40):
    return chunk_blocks(parse(name, data, KnowledgeConfig()), target, overlap)


def cited(lines: list[str], c) -> str:
    """The cited lines of the file (1-based, inclusive), after checking they exist."""
    assert c.line_start is not None and 1 <= c.line_start <= c.line_end <= len(lines), \
        (c.line_start, c.line_end, len(lines), c.text[:80])
    return "\n".join(lines[c.line_start - 1:c.line_end])


def assert_tokens_cited(data: bytes, chunks, tight: bool) -> None:
    """Each chunk's tokens stand on its cited lines of the file; ``tight`` (every line of the indexed
    text holds a token, as in these csv files): its first and last cited lines hold one of them."""
    lines = data.decode().split("\n")
    assert chunks
    where = {t: i for i, line in enumerate(lines, 1) for t in TOKEN.findall(line)}
    for c in chunks:
        tokens = TOKEN.findall(c.text)
        text = cited(lines, c)
        if not tokens:                     # e.g. the closing brackets of a pretty-printed json
            assert not re.search(r"\w", c.text) and set(c.text.split()) <= set(text), c.text
            continue
        missing = [t for t in tokens if not re.search(rf"\b{t}\b", text)]
        assert not missing, (c.line_start, c.line_end, missing, c.text[:120])
        if tight:
            assert (c.line_start, c.line_end) == (min(where[t] for t in tokens), max(where[t] for t in tokens))


def assert_lines_as_written(data: bytes, chunks) -> None:
    """Formats indexed as written: a chunk's lines are, in order, parts of its cited lines, its
    first on the first and its last on the last (blank lines between paragraphs may be left out)."""
    lines = data.decode().split("\n")
    for c in chunks:
        src = cited(lines, c).split("\n")
        parts = [p.strip() for p in c.text.split("\n")]
        assert parts[0] in src[0] and parts[-1] in src[-1], (c.line_start, c.line_end, c.text[:120])
        j = 0
        for p in parts:
            while p not in src[j]:
                j += 1
                assert j < len(src), (c.line_start, c.line_end, p)
            j += 1


# -- json ---------------------------------------------------------------------------------------

def services(n: int) -> dict:
    return {"services": [{"name": f"w{i}x0", "owner": f"w{i}x1", "ports": [f"w{i}x{p}" for p in range(2, 8)],
                          "notes": f"w{i}x8 runs behind the gateway w{i}x9"} for i in range(n)]}


def test_a_minified_json_file_is_cited_on_its_one_line():
    data = json.dumps(services(40), separators=(",", ":")).encode()
    assert b"\n" not in data
    chunks = chunks_of("services.json", data)
    assert len(chunks) > 20 and '\n      "owner": "w17x1"' in "".join(c.text for c in chunks)   # pretty-printed
    assert {(c.line_start, c.line_end) for c in chunks} == {(1, 1)}
    assert_tokens_cited(data, chunks, tight=False)


def test_a_one_line_json_after_blank_lines_and_a_long_array_cite_the_line_it_is_on():
    data = b"\n\n" + json.dumps([f"w{i}x{i % 7}" for i in range(500)]).encode() + b"\n"
    chunks = chunks_of("ids.json", data)
    assert len(chunks) > 10 and {(c.line_start, c.line_end) for c in chunks} == {(3, 3)}
    assert_tokens_cited(data, chunks, tight=False)


def test_a_multi_line_json_with_long_array_lines_is_cited_line_by_line():
    items = [json.dumps(s, separators=(",", ":")) for s in services(30)["services"]]
    data = ('{"generated": "w999x0",\n "services": [\n  ' + ",\n  ".join(items) + '\n ],\n'
            ' "ids": ' + json.dumps([f"w{i}x99" for i in range(300)]) + "\n}\n").encode()
    json.loads(data)
    chunks = chunks_of("services.json", data)
    assert len(chunks) > 20
    assert_tokens_cited(data, chunks, tight=False)
    assert_lines_as_written(data, chunks)


# -- csv ----------------------------------------------------------------------------------------

def tickets() -> bytes:
    """The reviewer's file: row 1 has a 5-line quoted cell, the last row (quokka) is on line 31."""
    rows = ['T-1,ann,"line one of note\nline two\nline three\nline four\nline five"']
    rows += [f"T-{i},user{i},ordinary note {i}" for i in range(2, 26)] + ["T-99,zebulon,quokka migration finished"]
    return ("ticket,owner,notes\n" + "\n".join(rows) + "\n").encode()


def test_a_csv_row_after_a_multi_line_cell_is_cited_on_its_own_line():
    data = tickets()
    assert data.decode().split("\n")[30].startswith("T-99,zebulon,quokka")
    chunks = chunks_of("tickets.csv", data, 600, 100)
    hit = [c for c in chunks if "quokka" in c.text]
    assert hit and all(c.line_end == 31 and c.line_start >= 20 for c in hit), [(c.line_start, c.line_end) for c in hit]
    first = next(c for c in chunks if "line five" in c.text)
    assert first.line_start == 2 and first.line_end >= 6


def table(rows: list[list[str]]) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode()


def test_csv_multi_line_cells_are_cited_by_the_lines_they_span():
    rows = [["id", "owner", "notes"]]
    for i in range(60):
        notes = "\n".join(f"w{i}x{k} step {k}" for k in range(2, 2 + i % 4)) if i % 3 else f"w{i}x2"
        rows.append([f"w{i}x0", f"w{i}x1", notes])
    data = table(rows)
    chunks = chunks_of("notes.csv", data)
    assert len(chunks) > 10
    assert_tokens_cited(data, chunks, tight=True)        # nothing dropped: each chunk cites its rows' lines
    # blank and empty rows skipped, a multi-line column name: cited by the block's lines, still holding them
    rows[0][2] = "notes\n(free text)"
    data = table(rows[:20]).replace(b"\nw7x0,", b"\n\n,,\nw7x0,")
    chunks = chunks_of("notes.csv", data)
    assert_tokens_cited(data, chunks, tight=False)
    header_only = table([["w0x0", "w0x1\nw0x2"]])
    chunks = chunks_of("h.csv", header_only)
    assert [(c.line_start, c.line_end) for c in chunks] == [(1, 2)]


cell = st.lists(st.sampled_from(["alpha", "beta gamma", "x;y", "", " "]), min_size=0, max_size=3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(cell, cell, st.booleans()), min_size=1, max_size=40), st.integers(60, 300))
def test_csv_citations_hold_the_rows_for_any_layout(spec, target):
    """Random cells of 0-3 lines (some empty), some followed by a blank line."""
    lines_out, n = ["a,b"], 0
    for one, two, blank in spec:
        def value(words, col):
            nonlocal n
            n += 1
            return "\n".join(f"{w} w{n}x{col}{k}" if w.strip() else w for k, w in enumerate(words))
        lines_out.append(table([[value(one, 1), value(two, 2)]]).decode().rstrip("\n"))
        if blank:
            lines_out.append("")
    data = ("\n".join(lines_out) + "\n").encode()
    try:
        chunks = chunks_of("r.csv", data, target, target // 4)
    except Exception as exc:              # a table of empty cells only holds no text
        assert "no text" in str(exc)
        return
    assert_tokens_cited(data, chunks, tight=False)


# -- yaml ---------------------------------------------------------------------------------------

def test_yaml_block_scalars_and_documents_are_cited_as_written():
    docs = []
    for d in range(3):
        body = "\n".join(f"    w{d}x{k} is a line of the literal block." for k in range(12))
        folded = "\n".join(f"    w{d}x{k} folded words" for k in range(20, 30))
        docs.append(f"name: w{d}x90\nscript: |\n{body}\n\n    w{d}x40 after a blank line\n"
                    f"summary: >\n{folded}\nlist:\n" + "".join(f"  - w{d}x{k}\n" for k in range(50, 60)))
    data = ("---\n".join(docs)).encode()
    chunks = chunks_of("ci.yaml", data)
    lines = data.decode().split("\n")
    assert len(chunks) > 5
    assert len({c.line_start for c in chunks}) == len(chunks) and max(c.line_end for c in chunks) == len(lines) - 1
    assert_tokens_cited(data, chunks, tight=False)
    assert_lines_as_written(data, chunks)


# -- through the knowledge base -----------------------------------------------------------------

async def test_search_hits_cite_the_lines_of_the_uploaded_json_and_csv(kb):
    services_json = json.dumps({"services": [{"name": f"svc{i}", "port": 8000 + i,
                                              "notes": "flamingo" if i == 11 else "x" * 40} for i in range(30)]})
    for name, data in [("services.json", services_json.encode()), ("tickets.csv", tickets())]:
        await kb.ingest("alice", [], None, name, data, md5=hashlib.md5(data).hexdigest())
    hit = (await kb.search("alice", [], "flamingo", 1))[0]
    assert hit.citation == "[services.json §line 1]" and "flamingo" in hit.text
    hit = (await kb.search("alice", [], "quokka", 1))[0]
    a, b = hit.location["lines"]
    assert "quokka" in hit.text and b == 31 and a > 6, hit.citation
