"""Parsers under hostile input: decompression bombs, expansion, deep nesting, cancellation; and the
odd but valid files that used to be refused (truncated UTF-8, Shift-JIS, Latin-1, HTML without
``</head>``)."""
from __future__ import annotations

import time

import pytest

from bomb_testlib import shared_stream_pdf, text_lines
from kb_testlib import make_docx, make_pdf
from server.errors import HandlerError
from server.knowledge.config import KnowledgeConfig
from server.knowledge.parsers import parse

CFG = KnowledgeConfig()
ROOMY = dict(pdf_max_content_bytes=1 << 34, pdf_max_page_chars=1 << 30)   # limits out of the way


def refusal(name: str, data: bytes, cfg: KnowledgeConfig = CFG, **kw) -> HandlerError:
    with pytest.raises(HandlerError) as e:
        parse(name, data, cfg, **kw)
    return e.value


def refused(name: str, data: bytes, cfg: KnowledgeConfig = CFG) -> str:
    err = refusal(name, data, cfg)
    assert err.code == "UNSUPPORTED_MEDIA", (err.code, err.message)
    return err.message


@pytest.fixture
def pages_extracted(monkeypatch):
    """Counts the pdf pages whose text pypdf extracts."""
    from pypdf import PageObject
    calls = []
    real = PageObject.extract_text

    def spy(self, *a, **kw):
        calls.append(1)
        return real(self, *a, **kw)
    monkeypatch.setattr(PageObject, "extract_text", spy)
    return calls


# -- PDF: bombs and running totals -----------------------------------------------------------------
def test_pdf_bomb_sharing_one_stream_is_refused_at_once(pages_extracted):
    bomb = shared_stream_pdf(40, text_lines(1, 4 << 20))         # 40 pages x one 4 MiB string: 160 M chars
    assert len(bomb) < 32 << 10
    t0 = time.monotonic()
    message = refused("bomb.pdf", bomb)
    assert "pdf_max_content_bytes" in message and time.monotonic() - t0 < 5
    assert pages_extracted == []                                  # refused before any page is interpreted


def test_pdf_running_total_stops_at_max_extracted_chars(pages_extracted):
    pdf = shared_stream_pdf(50, text_lines(100, 100))             # 10,000 characters a page
    message = refused("t.pdf", pdf, KnowledgeConfig(max_extracted_chars=25_000, **ROOMY))
    assert "max_extracted_chars" in message and "25000" in message
    assert len(pages_extracted) == 3                              # not 50


def test_pdf_page_text_cap():
    pdf = shared_stream_pdf(2, text_lines(300, 100))              # 30,000 characters a page
    message = refused("t.pdf", pdf, KnowledgeConfig(pdf_max_page_chars=20_000))
    assert "page 1" in message and "pdf_max_page_chars" in message
    assert len(parse("t.pdf", pdf, KnowledgeConfig(pdf_max_page_chars=40_000))) == 2


def test_pdf_stream_decompression_cap():
    pdf = shared_stream_pdf(1, text_lines(20_000))               # one stream of ~640 KB decompressed
    message = refused("t.pdf", pdf, KnowledgeConfig(pdf_max_stream_bytes=1 << 16, **{
        "pdf_max_content_bytes": 1 << 30}))
    assert "pdf_max_stream_bytes" in message
    assert parse("t.pdf", pdf, KnowledgeConfig())[0].page == 1


def test_pdf_cancelled_between_pages(pages_extracted):
    pdf = shared_stream_pdf(200, text_lines(200))
    err = refusal("slow.pdf", pdf, KnowledgeConfig(**ROOMY), cancelled=lambda: len(pages_extracted) >= 3)
    assert err.code == "SHUTTING_DOWN" and "cancelled" in err.message
    assert len(pages_extracted) == 3


# -- expansion in the other formats ----------------------------------------------------------------
def test_one_line_json_expanding_when_pretty_printed_stops_at_the_limit():
    deep = "[" * 400 + "1" + "]" * 400                            # 801 bytes -> ~160,000 chars pretty-printed
    data = ("[" + ",".join([deep] * 300) + "]").encode()          # 240 KB -> ~48 M chars
    t0 = time.monotonic()
    message = refused("d.json", data, KnowledgeConfig(max_extracted_chars=1_000_000))
    assert "max_extracted_chars" in message and time.monotonic() - t0 < 3


def test_docx_running_total_stops_reading_paragraphs(monkeypatch):
    from docx.text.paragraph import Paragraph
    read = []
    real = Paragraph.text.fget
    monkeypatch.setattr(Paragraph, "text", property(lambda self: read.append(1) or real(self)))
    data = make_docx([("word " * 2000, 0)] * 60)                  # 60 paragraphs of 10,000 characters
    message = refused("big.docx", data, KnowledgeConfig(max_extracted_chars=30_000))
    assert "max_extracted_chars" in message and len(read) <= 5


@pytest.mark.parametrize("name, data", [
    ("a.txt", b"hello\n\nworld\n"), ("a.md", b"# T\n\ntext\n"), ("a.csv", b"a,b\n1,2\n"),
    ("a.json", b'{"a": 1}'), ("a.yaml", b"a: 1\n"), ("a.html", b"<p>x</p>"),
    ("a.pdf", make_pdf(["page"])), ("a.docx", make_docx([("para", 0)])),
], ids=lambda v: v if isinstance(v, str) else "data")   # ids by name: a docx carries its build time
def test_every_parser_honours_cancellation(name, data):
    assert parse(name, data, CFG)                                          # parses when not cancelled
    err = refusal(name, data, cancelled=lambda: True)
    assert err.code == "SHUTTING_DOWN"


# -- deep nesting: a refusal, not a crash ----------------------------------------------------------
@pytest.mark.parametrize("name, data", [
    ("deep.json", b"[" * 100_000),
    ("deep.json", b"[" * 100_000 + b"]" * 100_000),
    ("deep.yaml", b"[" * 20_000 + b"]" * 20_000),
    ("deep.yml", b"".join(b"  " * i + b"- \n" for i in range(3000)) + b"  " * 3000 + b"x\n"),
])
def test_deeply_nested_json_and_yaml_are_refused_cleanly(name, data):
    message = refused(name, data)
    assert "nested too deeply" in message or "malformed" in message


# -- encodings -------------------------------------------------------------------------------------
LOG = "2026-11-01 10:00:00 INFO 订单服务 处理请求 编号=1 状态=成功\n" * 40


def test_utf8_cut_mid_character_is_read():
    data = LOG.encode() + "订单".encode()[:4]                     # the last character cut after 1 of 3 bytes
    text = "".join(b.text for b in parse("cut.log", data, CFG))
    assert text.startswith("2026-11-01") and text.endswith("订") and "\ufffd" not in text


def test_utf8_with_a_few_invalid_bytes_keeps_the_text():
    data = LOG.encode() + b"caf\xe9 cr\xe8me\n" + LOG.encode()
    text = "\n".join(b.text for b in parse("mixed.txt", data, CFG))
    assert "订单服务" in text and "caf\ufffd cr\ufffdme" in text


def test_shift_jis_is_read_as_japanese():
    text = "サーバーを再起動する前に、データベースをバックアップしてください。"
    assert parse("jp.txt", text.encode("shift_jis"), CFG)[0].text == text


@pytest.mark.parametrize("text", ["Café résumé naïve façade über straße", "naïve",
                                  "Falsches Üben von Xylophonmusik quält jeden größeren Zwerg."])
def test_latin1_is_preferred_among_equal_guesses(text):
    assert parse("l.txt", text.encode("latin-1"), CFG)[0].text == text
    for text, enc in [("Příliš žluťoučký kůň úpěl ďábelské ódy. Zítra ráno půjdeme do města.", "cp1250"),
                      ("Съешь же ещё этих мягких французских булок, да выпей чаю.", "cp1251")]:
        assert parse("x.txt", text.encode(enc), CFG)[0].text == text


# -- HTML ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("html, expected", [
    ("<head><meta><title>T<body><h1>H<p>text", [(1, "H"), (0, "text")]),
    ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Ops</title>\n<h1>Failover</h1>"
     "<p>Run the script.</p></html>", [(1, "Failover"), (0, "Run the script.")]),
    ("<html><head><title>x</title><style>p{}</style>Loose text<p>para", [(0, "Loose text"), (0, "para")]),
    ("<html><head><title>x</title></head><body><p>a</p><head><p>b</p></body>", [(0, "a"), (0, "b")]),
])
def test_html_head_ends_without_its_end_tag(html, expected):
    assert [(b.level, b.text) for b in parse("p.html", html.encode(), CFG)] == expected
