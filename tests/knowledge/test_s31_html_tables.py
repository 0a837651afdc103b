"""html tables keep their rows: each <tr> is one ``a | b | c`` line, as a docx table's rows are
(before, every cell was a block of its own: "service / port / grafana / 3000 / ...", a value no
longer next to its column or its row's other cells)."""
from __future__ import annotations

from server.knowledge.chunker import chunk_blocks
from server.knowledge.config import KnowledgeConfig
from server.knowledge.parsers import parse

CFG = KnowledgeConfig()
TABLE = (b"<html><body><h1>Ports</h1>\n"
         b"<table><tr><th>service</th><th>port</th></tr><tr><td>grafana</td><td>3000</td></tr>"
         b"<tr><td>prometheus</td><td>9090</td></tr></table>\n"
         b"<h2>Notes</h2><p>Line one<br>Line two: the alertmanager listens on 9093</p>\n</body></html>")


def texts(name: str, data: bytes) -> list[tuple[int, str]]:
    return [(b.level, b.text) for b in parse(name, data, CFG)]


def test_html_table_rows_are_lines_of_cells() -> None:
    assert texts("t.html", TABLE) == [
        (1, "Ports"), (0, "service | port"), (0, "grafana | 3000"), (0, "prometheus | 9090"),
        (2, "Notes"), (0, "Line one"), (0, "Line two: the alertmanager listens on 9093")]
    [table, _notes] = chunk_blocks(parse("t.html", TABLE, CFG), 600, 100)
    assert table.text == "service | port\ngrafana | 3000\nprometheus | 9090" and table.heading == ("Ports",)
    assert (table.line_start, table.line_end) == (2, 2)


def test_html_cells_rows_and_nested_tables_as_in_docx() -> None:
    html = (b"<table><caption>Hosts</caption><thead><tr><th>host</th><th>role<br>and notes</th><th>ip</th></tr>"
            b"</thead><tbody>\n<tr><td>db-01</td><td></td><td>10.0.0.1</td></tr>\n"
            b"<tr><td>web<p>front</p></td><td>x<table><tr><td>n1</td><td>n2</td></tr></table>y</td>"   # rows left open
            b"<tr><td>last</td></table><p>after</p><table><tr><td>open at the end")
    assert texts("n.html", html) == [
        (0, "Hosts"), (0, "host | role and notes | ip"), (0, "db-01 |  | 10.0.0.1"),
        (0, "web front | x\nn1 | n2\ny"), (0, "last"), (0, "after"), (0, "open at the end")]
    assert texts("c.html", b"<p>a</p><td>cell without a table</td><p>b</p>") == [
        (0, "a"), (0, "cell without a table"), (0, "b")]


def test_text_copied_into_each_level_of_nested_tables_counts_toward_the_budget() -> None:
    """A nested table's rows join the enclosing cell, copied again at every level: 120,000 levels
    around 16 MB of text held an ingest thread 210 s within html_max_tags and max_extracted_chars.
    Every copy now counts, so the budget stops it."""
    import pytest
    from server.errors import HandlerError
    depth, inner = 400, "y " * 2_500                          # 5,000 characters copied 400 times: 2 M
    html = "<table><tr><td>x</td><td>" * depth + inner + "</td></tr></table>" * depth
    cfg = KnowledgeConfig(max_extracted_chars=1_000_000)
    with pytest.raises(HandlerError) as err:
        parse("nested.html", html.encode(), cfg)
    assert err.value.code == "UNSUPPORTED_MEDIA" and "max_extracted_chars" in err.value.message
    shallow = "<table><tr><td>x</td><td>" * 3 + inner + "</td></tr></table>" * 3
    assert "y y" in parse("shallow.html", shallow.encode(), cfg)[0].text
