"""File names that display as another name or forge a citation are refused (INVALID_MESSAGE):
invisible and format characters (Unicode Cf: zero-width spaces and joiners, U+FEFF, the soft
hyphen, tag characters, bidirectional controls), private-use characters (Co), surrogates (Cs), line
separators, in the base name (joiners that are writing, in Persian, Indic or emoji names, are kept:
test_parser_edge_cases.py); and "[", "]" or a space before "§", which would let a name close its citation
``[name §location]`` early or pass as another document's. Before, only control, bidirectional and
line-separator characters were refused: ``run\\u200bbook.md`` was stored and showed as ``runbook.md``.
"""
from __future__ import annotations

import pytest

from kb_wire.kbwire import connect, kb_server, md5
from protocol import MsgType
from server.errors import HandlerError
from server.knowledge.names import clean_name
from testkit.server import ReplyError

HIDDEN = [
    ("run\u200bbook.md", "U+200B"),            # zero-width space
    ("run\u200dbook.md", "U+200D"),            # zero-width joiner
    ("\ufeffrunbook.md", "U+FEFF"),            # zero-width no-break space / BOM
    ("run\u00adbook.md", "U+00AD"),            # soft hyphen
    ("run\u2060book.md", "U+2060"),            # word joiner
    ("runbook\U000e0041\U000e007f.md", "U+E0041, U+E007F"),   # tag characters
    ("run\ue000book.md", "U+E000"),            # private use
    ("run\ud800book.md", "U+D800"),            # a lone surrogate
    ("a\u202etxt.exe", "U+202E"),              # bidirectional override (refused before too)
    ("x\u2029y.txt", "U+2029"),                # paragraph separator (refused before too)
]
FORGED = [
    "runbook.md §Backup, lines 1-2] [admin.md §p. 1.txt",
    "x] [runbook.md",
    "notes [draft].md",
    "runbook.md §Backup.txt",
    "runbook.md\u00a0§Backup.txt",             # a no-break space before the §
    "runbook.md\u3000§Backup.txt",             # an ideographic space before the §
]
KEPT = ["runbook.md", "运维手册 v2.md", "naïve café.txt", "§5 Kündigung.txt", "报告（一）.md", "e\u0301t\u00e9.txt",
        "dir/[old]/plan.md"]


@pytest.mark.parametrize("name, codes", HIDDEN)
def test_invisible_and_format_characters_are_refused(name, codes):
    with pytest.raises(HandlerError) as exc:
        clean_name(name)
    assert exc.value.code == "INVALID_MESSAGE" and codes in exc.value.message


@pytest.mark.parametrize("name", FORGED)
def test_names_that_would_forge_a_citation_are_refused(name):
    with pytest.raises(HandlerError) as exc:
        clean_name(name)
    assert exc.value.code == "INVALID_MESSAGE" and "citation" in exc.value.message


@pytest.mark.parametrize("name", KEPT)
def test_ordinary_names_are_kept(name):
    assert clean_name(name) == name.rsplit("/", 1)[-1]


async def test_refused_at_upload_begin_over_tcp(tmp_path):
    data = b"restart the proxy with systemctl\n"
    async with kb_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        for name, expect in (("run\u200bbook.md", "U+200B"), ("x] [runbook.md", "citation"),
                             ("runbook\U000e0041.md", "U+E0041")):
            with pytest.raises(ReplyError) as exc:
                await c.call(MsgType.KB_UPLOAD_BEGIN, name=name, size=len(data), md5=md5(data))
            assert exc.value.code == "INVALID_MESSAGE" and expect in exc.value.body["message"]
        assert (await c.call(MsgType.KB_LIST))["documents"] == []
        await c.call(MsgType.PING)                       # the connection is still fine
        await c.close()
