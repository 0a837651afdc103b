"""Text the index can match and quote (session 32).

1. Justified Chinese PDFs place each glyph on its own: pypdf extracts "恢 复 超 时 时 间 为 …", and the
   analyzer builds CJK bigrams only inside gap-free runs, so such a page had unigrams only and a decoy
   sharing its words outranked it. Spaced-out CJK lines are now joined (``join_spaced_cjk``).
2. A table's chunks after the first had no header row: with columns 主负责人 / 备份负责人 a quoted
   passage could not say which name was which. Every chunk begun among a table's rows now starts
   with its header row (markdown, html, docx), counted in the chunk target; the cited lines stay the
   rows'.
3. A csv using semicolons (or tabs, pipes) was read as one column: its delimiter is now sniffed.
"""
from __future__ import annotations

import pytest

from kb_testlib import make_docx, pdf_of
from server.knowledge.chunker import TABLE_HEADER_MAX_SHARE, chunk_blocks
from server.knowledge.config import KnowledgeConfig
from server.knowledge.parsers import join_spaced_cjk, parse, sniff_delimiter

CFG = KnowledgeConfig()


# 1. Spaced-out CJK ---------------------------------------------------------------------------------

def _stream(data: bytes) -> bytes:
    return b"<< /Length %d >>\nstream\n" % len(data) + data + b"\nendstream"


def justified_pdf(lines: list[str]) -> bytes:
    """A one-page pdf whose CJK ``lines`` are set glyph by glyph with a gap between glyphs (a TJ
    array with a kerning of -250 after each glyph, as justified text is), through a Type0 font whose
    ToUnicode map sends each glyph id to the code point it is."""
    chars = sorted(set("".join(lines)))
    cmap = ("/CIDInit /ProcSet findresource begin\n12 dict begin\nbegincmap\n"
            "/CIDSystemInfo << /Registry (Adobe) /Ordering (UCS) /Supplement 0 >> def\n"
            "/CMapName /Adobe-Identity-UCS def\n/CMapType 2 def\n1 begincodespacerange\n<0000> <FFFF>\n"
            f"endcodespacerange\n{len(chars)} beginbfchar\n"
            + "\n".join(f"<{ord(c):04X}> <{ord(c):04X}>" for c in chars)
            + "\nendbfchar\nendcmap\nCMapName currentdict /CMap defineresource pop\nend\nend").encode()
    body = b"BT /F1 12 Tf 72 700 Td 14 TL "
    for line in lines:
        body += b"[" + b" ".join(b"<%04X> -250" % ord(c) for c in line) + b"] TJ T* "
    body += b"ET"
    return pdf_of([
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [7 0 R] /Count 1 >>",
        b"<< /Type /Font /Subtype /Type0 /BaseFont /STSong-Light /Encoding /Identity-H "
        b"/DescendantFonts [4 0 R] /ToUnicode 5 0 R >>",
        b"<< /Type /Font /Subtype /CIDFontType2 /BaseFont /STSong-Light /CIDSystemInfo << /Registry (Adobe) "
        b"/Ordering (Identity) /Supplement 0 >> /FontDescriptor 6 0 R /DW 1000 >>",
        _stream(cmap),
        b"<< /Type /FontDescriptor /FontName /STSong-Light /Flags 4 /FontBBox [0 0 1000 1000] /ItalicAngle 0 "
        b"/Ascent 880 /Descent -120 /CapHeight 880 /StemV 80 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
        b"/Contents 8 0 R >>",
        _stream(body)])


ANSWER = "第二页：恢复超时时间为四十五分钟，备份主机是机房甲。"
DECOY = "其他文档：恢复流程很重要，超时请重试，主机名见附录。"


def test_justified_chinese_pdf_is_extracted_without_the_spaces_between_glyphs() -> None:
    from pypdf import PdfReader
    import io
    data = justified_pdf(["目录", ANSWER, "值班电话见附录。"])
    raw = PdfReader(io.BytesIO(data)).pages[0].extract_text()
    assert "恢 复 超 时" in raw                     # what pypdf gives: a space between every glyph
    [block] = parse("justified_zh.pdf", data, CFG)
    assert block.text == f"目录\n{ANSWER}\n值班电话见附录。" and block.page == 1


@pytest.mark.parametrize("text, want", [
    ("恢 复 超 时 时 间 为 四 十 五 分 钟 ， 备 份 主 机 是 bk-09 。",
     "恢复超时时间为四十五分钟，备份主机是 bk-09 。"),          # a space by a latin word stays
    ("恢  复  超  时", "恢复超时"),                                 # runs of spaces too
    ("运维手册 第三章", "运维手册 第三章"),                          # words separated in prose: kept
    ("使用 Docker 部署 服务，然后 重启 服务器", "使用 Docker 部署 服务，然后 重启 服务器"),
    ("北京 上海 广州 深圳", "北京 上海 广州 深圳"),
    ("张 三", "张 三"),                                             # too short to tell on its own
    ("目 录\n恢 复 超 时 时 间 为 四 十 五 分 钟", "目录\n恢复超时时间为四十五分钟"),   # ... unless its page is spaced-out
    ("目 录\n恢复超时时间为四十五分钟，备份主机是机房甲", "目 录\n恢复超时时间为四十五分钟，备份主机是机房甲"),
    ("안 녕 하 세 요 여 러 분", "안 녕 하 세 요 여 러 분"),          # Hangul: Korean separates words by spaces
    ("名\t称\t值\t单\t位", "名\t称\t值\t单\t位"),                    # tabs are separators
    ("no cjk at all", "no cjk at all"),
])
def test_join_spaced_cjk(text: str, want: str) -> None:
    assert join_spaced_cjk(text) == want


def test_spaced_out_plain_text_is_joined_and_markdown_code_is_left_as_written() -> None:
    txt = "运维手册 第三章\n\n恢 复 超 时 时 间 为 四 十 五 分 钟 ， 备 份 主 机 是 bk-09 。\n"
    assert [(b.text, b.line_start) for b in parse("spaced.txt", txt.encode(), CFG)] == [
        ("运维手册 第三章", 1), ("恢复超时时间为四十五分钟，备份主机是 bk-09 。", 3)]
    md = "# 手册\n\n恢 复 超 时 时 间 为 四 十 五 分 钟\n\n```\n恢 复 超 时 时 间 为 四 十 五 分 钟\n```\n"
    assert [b.text for b in parse("m.md", md.encode(), CFG)] == [
        "手册", "恢复超时时间为四十五分钟", "```\n恢 复 超 时 时 间 为 四 十 五 分 钟\n```"]
    # json / yaml / csv are indexed as written
    assert parse("c.yaml", "k: 恢 复 超 时 时 间\n".encode(), CFG)[0].text == "k: 恢 复 超 时 时 间"


async def test_the_justified_pdf_outranks_a_decoy_sharing_its_words(kb) -> None:
    pdf = await kb.ingest("alice", [], None, "justified_zh.pdf", justified_pdf([ANSWER]))
    await kb.ingest("alice", [], None, "decoy.txt", DECOY.encode())
    hits = await kb.search("alice", [], "恢复超时时间是多少", 5)
    assert hits[0].doc_id == pdf.doc_id and hits[0].text == ANSWER
    assert hits[0].citation == "[justified_zh.pdf §p. 1]"


# 2. Table header rows --------------------------------------------------------------------------------

NAMES = ["张三", "李四", "王五", "赵六", "钱七", "孙八"]
HEADER = "| 主机 | 主负责人 | 备份负责人 |\n|---|---|---|"


def owners_md(rows: int = 150) -> str:
    """A heading, then a table of ``rows`` hosts (line 5 is app-000): primary and backup differ."""
    lines = ["# 值班负责人", "", "| 主机 | 主负责人 | 备份负责人 |", "|---|---|---|"]
    for i in range(rows):
        primary, backup = NAMES[i % 6], NAMES[(i + 1 + (i // 6) % 5) % 6]
        lines.append(f"| app-{i:03d} | {primary} | {backup} |")
    return "\n".join(lines) + "\n"


def test_every_chunk_of_a_markdown_table_starts_with_its_header_and_cites_its_rows() -> None:
    text = owners_md()
    source = text.split("\n")
    chunks = chunk_blocks(parse("owners.md", text.encode(), CFG), 600, 100)
    assert len(chunks) >= 5
    for n, c in enumerate(chunks):
        assert c.heading == ("值班负责人",) and len(c.text) <= 600
        rows = "\n".join(source[c.line_start - 1:c.line_end])        # the lines cited, verbatim
        assert c.text == (rows if n == 0 else f"{HEADER}\n{rows}"), n
        assert c.text.startswith(HEADER + "\n| app-")
    assert chunks[0].line_start == 3 and chunks[-1].line_end == 154


async def test_a_row_s_chunk_ranks_first_and_names_its_columns(kb) -> None:
    info = await kb.ingest("alice", [], None, "owners.md", owners_md().encode())
    await kb.ingest("alice", [], None, "notes.md", "# 值班\n\n备份负责人每周轮换，主负责人见值班表。\n".encode())
    hits = await kb.search("alice", [], "app-123 的备份负责人是谁", 5)
    top = hits[0]
    row = "| app-123 | 赵六 | 钱七 |"                  # i = 123: primary NAMES[3], backup NAMES[(123+1+0)%6]
    assert owners_md().split("\n")[127] == row
    assert top.doc_id == info.doc_id and top.text.startswith(HEADER + "\n") and row in top.text.split("\n")
    a, b = top.location["lines"]
    assert a <= 128 <= b and top.citation == f"[owners.md §值班负责人, lines {a}-{b}]"


def test_html_and_docx_tables_repeat_their_first_row_in_every_chunk() -> None:
    rows = [["host", "primary", "backup"]] + [[f"db-{i:02d}", NAMES[i % 6], NAMES[(i + 2) % 6]] for i in range(60)]
    html = ("<h1>Owners</h1><table>" + "".join(
        "<tr>" + "".join(f"<{'th' if r == 0 else 'td'}>{c}</{'th' if r == 0 else 'td'}>" for c in row) + "</tr>\n"
        for r, row in enumerate(rows)) + "</table>").encode()
    docx = make_docx([("Owners", 1)], table=rows)
    for name, data in (("o.html", html), ("o.docx", docx)):
        chunks = chunk_blocks(parse(name, data, CFG), 200, 40)
        assert len(chunks) >= 5, name
        for c in chunks:
            assert c.text.startswith("host | primary | backup\n") and len(c.text) <= 200, (name, c.text)
        assert sum(c.text.count("db-59 |") for c in chunks) >= 1


def test_a_header_over_its_share_of_the_target_is_not_repeated() -> None:
    wide = "| " + " | ".join(f"column number {i}" for i in range(8)) + " |"
    delim = "|" + "---|" * 8
    body = "\n".join("| " + " | ".join(f"r{r}c{i}" for i in range(8)) + " |" for r in range(40))
    text = f"{wide}\n{delim}\n{body}\n"
    target = 300
    assert len(wide) + len(delim) + 2 > target * TABLE_HEADER_MAX_SHARE
    chunks = chunk_blocks(parse("wide.md", text.encode(), CFG), target, 50)
    assert chunks[0].text.startswith(wide) and not any(c.text.startswith(wide) for c in chunks[1:])
    assert all(len(c.text) <= target for c in chunks)


def test_markdown_table_detection() -> None:
    md = ("intro line\n| a | b |\n|:-|-:|\n| 1 | 2 |\n| 3 | 4 |\nafter\n\n"
          "```\n| x | y |\n|---|---|\n| 5 | 6 |\n```\n\n"
          "| not | a table |\n|---|\n")
    blocks = parse("t.md", md.encode(), CFG)
    assert [(b.text, b.line_start, b.line_end, b.header) for b in blocks] == [
        ("intro line", 1, 1, None),
        ("| a | b |\n|:-|-:|", 2, 3, None),
        ("| 1 | 2 |\n| 3 | 4 |", 4, 5, "| a | b |\n|:-|-:|"),
        ("after", 6, 6, None),
        ("```\n| x | y |\n|---|---|\n| 5 | 6 |\n```", 8, 12, None),        # fenced: as written
        ("| not | a table |\n|---|", 14, 15, None)]                         # cell counts differ


# 3. csv delimiters ------------------------------------------------------------------------------------

@pytest.mark.parametrize("data, want", [
    (b"host;ip;role\nweb-03;10.1.0.7;web\n", "host: web-03; ip: 10.1.0.7; role: web"),
    (b"host\tip\trole\nweb-03\t10.1.0.7\tweb\n", "host: web-03; ip: 10.1.0.7; role: web"),
    (b"host|ip|role\nweb-03|10.1.0.7|web\n", "host: web-03; ip: 10.1.0.7; role: web"),
    (b"host,notes\nweb-03,a;b;c\n", "host: web-03; notes: a;b;c"),              # ";" in cells only
    (b'host;notes\nweb-03;"a,b,c"\ndb-01;"x, y"\n', "host: web-03; notes: a,b,c\nhost: db-01; notes: x, y"),
    (b"host\nweb-03\n", "host: web-03"),                                           # one column
])
def test_csv_delimiter_is_sniffed(data: bytes, want: str) -> None:
    [block] = parse("hosts.csv", data, CFG)
    assert block.text == want


def test_sniff_delimiter_defaults_to_comma_and_prefers_the_consistent_one() -> None:
    assert sniff_delimiter("") == "," and sniff_delimiter("just text\nmore") == ","
    assert sniff_delimiter("a;b,c;d\n1;2;3;4\n5;6;7;8\n") == ";"      # ";" in every line as often
    assert sniff_delimiter("a,b;c,d\n1,2,3,4\n") == ","
