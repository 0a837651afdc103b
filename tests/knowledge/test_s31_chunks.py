"""A csv record is one passage unit: chunks and their overlap start and end at record boundaries
(before, a chunk of inventory.csv began "ip: 10.1.0.9; role: web; datacenter: fra", the row's
hostname left in the chunk before: the "; " between cells was taken for a sentence end), unless
a record alone is longer than a chunk."""
from __future__ import annotations

from server.knowledge.chunker import chunk_blocks
from server.knowledge.config import KnowledgeConfig
from server.knowledge.parsers import parse


def inventory(rows: int, note: str = "") -> bytes:
    lines = ["hostname,ip,role,datacenter,note"]
    lines += [f"web-{i:02d},10.1.{i // 10}.{i},web,{'fra' if i % 2 else 'ams'},{note}" for i in range(1, rows + 1)]
    return ("\n".join(lines) + "\n").encode()


def records(text: str) -> set[str]:
    """The csv's records as the parser writes them (one ``column: value; ...`` line each)."""
    return {line for b in parse("inventory.csv", text.encode(), KnowledgeConfig()) for line in b.text.split("\n")}


def test_csv_chunks_and_their_overlap_hold_whole_records() -> None:
    cfg = KnowledgeConfig()
    for note in ("", "moved to rack 4. Disk replaced; rebooted! OK?"):     # sentence ends inside a cell
        data = inventory(60, note)
        rows = records(data.decode())
        chunks = chunk_blocks(parse("inventory.csv", data, cfg), cfg.chunk_target_chars, cfg.chunk_overlap_chars)
        assert len(chunks) > 3
        for c in chunks:
            assert len(c.text) <= cfg.chunk_target_chars
            for line in c.text.split("\n"):
                assert line in rows, (line, c.text[:200])                 # never a piece of a record
            assert c.line_end - c.line_start + 1 == c.text.count("\n") + 1   # cited: the records' own lines
        if len(max(rows, key=len)) <= cfg.chunk_overlap_chars:              # the overlap: the last whole record
            assert all(b.text.split("\n")[0] == a.text.split("\n")[-1] for a, b in zip(chunks, chunks[1:]))


def test_a_record_longer_than_a_chunk_is_still_cut() -> None:
    data = inventory(3, "word " * 200)
    chunks = chunk_blocks(parse("inventory.csv", data, KnowledgeConfig()), 300, 50)
    assert all(len(c.text) <= 300 for c in chunks) and len(chunks) > 3
    assert chunks[0].text.startswith("hostname: web-01; ip: 10.1.0.1;")
    assert sum(c.text.count("word") for c in chunks) >= 600                # every word of the 3 records kept
