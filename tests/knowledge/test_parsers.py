"""Parsers of every supported format, encoding detection, and refusals (UNSUPPORTED_MEDIA)."""
from __future__ import annotations

import json

import pytest

from kb_testlib import make_docx, make_pdf, make_zip_bomb
from server.errors import HandlerError
from server.knowledge.config import KnowledgeConfig
from server.knowledge.parsers import parse

CFG = KnowledgeConfig()


def texts(blocks):
    return [(b.level, b.text) for b in blocks]


def refused(name: str, data: bytes, cfg: KnowledgeConfig = CFG) -> str:
    with pytest.raises(HandlerError) as e:
        parse(name, data, cfg)
    assert e.value.code == "UNSUPPORTED_MEDIA"
    return e.value.message


def test_text_and_log_paragraphs_keep_line_ranges():
    blocks = parse("app.log", b"line one\nline two\n\n\nthird para\n", CFG)
    assert texts(blocks) == [(0, "line one\nline two"), (0, "third para")]
    assert [(b.line_start, b.line_end) for b in blocks] == [(1, 2), (5, 5)]


@pytest.mark.parametrize("text", ["日志目录在/var/log/app下。", "配置：端口８０８０，超时３０秒！"])
def test_short_gbk_text_is_read_as_chinese(text):
    assert parse("a.txt", text.encode("gbk"), CFG)[0].text == text


def test_latin1_and_big5_still_detected():
    assert parse("a.txt", "Café crème brûlée, déjà vu à la façon.".encode("latin-1"), CFG)[0].text.startswith("Café")
    assert parse("a.txt", ("繁體中文的備份說明文件，請參閱。" * 5).encode("big5"), CFG)[0].text.startswith("繁體中文")


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "gbk", "gb18030", "utf-16"])
def test_text_encodings_are_detected(encoding):
    text = "备份任务每天凌晨两点运行，日志保存在服务器的数据目录中。\n\n主数据库位于杭州机房，从库位于上海。"
    blocks = parse("notes.txt", text.encode(encoding), CFG)
    assert "".join(b.text for b in blocks).replace("\n", "") == text.replace("\n", "")


def test_markdown_headings_and_fenced_code():
    md = "# Install\n\nRun it.\n\n## Linux\n\n```\n# not a heading\n```\n\ntext\n# Usage\nuse it\n"
    blocks = parse("r.md", md.encode(), CFG)
    assert texts(blocks) == [(1, "Install"), (0, "Run it."), (2, "Linux"), (0, "```\n# not a heading\n```"),
                             (0, "text"), (1, "Usage"), (0, "use it")]
    assert blocks[0].line_start == 1 and blocks[-1].line_start == 13


def test_csv_rows_become_column_value_lines():
    blocks = parse("hosts.csv", "host,ip\nweb1,10.0.0.1\ndb1,10.0.0.2\n".encode("gbk"), CFG)
    assert blocks[0].text == "host: web1; ip: 10.0.0.1\nhost: db1; ip: 10.0.0.2"
    assert (blocks[0].line_start, blocks[0].line_end) == (2, 3)


def test_json_and_yaml_are_validated():
    blocks = parse("c.json", json.dumps({"db": {"port": 5432}}).encode(), CFG)
    assert '"port": 5432' in blocks[0].text                     # pretty-printed
    assert "malformed json" in refused("c.json", b"{nope")
    assert parse("c.yaml", b"db:\n  port: 5432\n", CFG)[0].text == "db:\n  port: 5432"
    assert "malformed yaml" in refused("c.yml", b"a: [1, 2\n")
    assert "malformed yaml" in refused("c.yml", b"!!python/object/apply:os.system ['true']\n")


def test_html_visible_text_and_headings():
    html = ("<html><head><title>x</title><style>p{}</style></head><body><h1>Guide</h1>"
            "<p>First &amp; <b>bold</b>.</p><script>alert(1)</script><ul><li>item</li></ul></body></html>")
    assert texts(parse("g.html", html.encode(), CFG)) == [(1, "Guide"), (0, "First & bold."), (0, "item")]


def test_pdf_pages_are_located():
    blocks = parse("m.pdf", make_pdf(["Backups run nightly", "Restore with the restore tool"]), CFG)
    assert [(b.page, b.text) for b in blocks] == [(1, "Backups run nightly"), (2, "Restore with the restore tool")]
    assert all(b.line_start is None for b in blocks)


def test_docx_headings_paragraphs_and_tables():
    data = make_docx([("Runbook", 1), ("Restart the service.", 0), ("Details", 2), ("Check logs.", 0)],
                     table=[["host", "role"], ["db1", "primary"]])
    assert texts(parse("r.docx", data, CFG)) == [(1, "Runbook"), (0, "Restart the service."), (2, "Details"),
                                                 (0, "Check logs."), (0, "host | role"), (0, "db1 | primary")]


def test_refusals_name_the_reason():
    assert "unsupported file type '.exe'" in refused("a.exe", b"MZ\x90\x00")
    assert "(none)" in refused("Makefile", b"all:\n")
    assert "empty" in refused("a.txt", b"")
    assert "binary" in refused("a.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 10)
    assert "binary" in refused("a.log", b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4)
    assert "no text" in refused("a.md", b"\n\n   \n")
    assert "corrupt pdf" in refused("a.pdf", b"%PDF-1.4\n garbage")
    assert "corrupt pdf" in refused("a.pdf", make_pdf(["x"])[:60])
    assert "corrupt docx" in refused("a.docx", b"PK\x03\x04 not a zip")
    assert "corrupt docx" in refused("a.docx", make_zip_bomb(0))          # a zip, but no document in it


def test_docx_zip_bomb_refused_before_decompression():
    cfg = KnowledgeConfig(docx_max_uncompressed_bytes=4 << 20)
    bomb = make_zip_bomb(8 << 20)                                        # 8 MiB of zeros in ~8 KiB
    assert len(bomb) < 64 << 10
    assert "zip bomb" in refused("b.docx", bomb, cfg)                    # ratio limit (~1000x > 200x)
    assert "zip bomb" in refused("b.docx", bomb, KnowledgeConfig(docx_max_ratio=10_000,
                                                                 docx_max_uncompressed_bytes=4 << 20))  # total
