"""File names that draw as another name, or forge a citation, in ways the Unicode categories miss
(review s32): Default_Ignorable code points that are marks or letters (the combining grapheme joiner
U+034F, variation selectors, Mongolian free variation selectors), characters that draw a blank but
are no space (the Hangul fillers U+3164, U+115F, U+FFA0, the blank braille pattern U+2800), odd
spaces (hair, thin ...), and full-width brackets (NFKC "［" is "["). Before, each was accepted:
``run\\u3164book.md`` was stored, and ``runbook.md\\u3164§Backup.txt`` cited as
``[runbook.mdㅤ§Backup.txt §line 1]``. Ordinary names in other scripts and with emoji stay accepted.
"""
from __future__ import annotations

import pytest

from server.errors import HandlerError
from server.knowledge.names import clean_name

REFUSED = [
    ("run\u034fbook.md", "U+034F"),             # combining grapheme joiner
    ("run\ufe00book.md", "U+FE00"),             # variation selector 1
    ("run\ufe0fbook.md", "U+FE0F"),             # the emoji selector after an ASCII letter
    ("run\u180bbook.md", "U+180B"),             # Mongolian free variation selector, not after Mongolian
    ("run\u17b4book.md", "U+17B4"),             # Khmer inherent vowel (ignorable)
    ("run\u3164book.md", "U+3164"),             # Hangul filler
    ("run\u115fbook.md", "U+115F"),             # Hangul choseong filler
    ("run\uffa0book.md", "U+FFA0"),             # half-width Hangul filler
    ("run\u2800book.md", "U+2800"),             # blank braille pattern
    ("run\u200abook.md", "U+200A"),             # hair space
    ("run\u2009book.md", "U+2009"),             # thin space
    ("run\u202fbook.md", "U+202F"),             # narrow no-break space
    ("葛\U000e0100.txt", "U+E0100"),            # ideographic variation selector
    ("runbook.md\u3164§Backup.txt", "U+3164"),  # a blank before § that posed as a citation
    ("a\u3164\u200dب.txt", "U+3164"),           # a joiner next to a blank is no writing
]
FORGED = [
    "x］ ［runbook.md",                          # full-width brackets
    "报告［草稿］.md",
    "runbook.md\u3000§Backup.txt",              # an ideographic space before the § (refused before too)
    "runbook.md\u00a0§Backup.txt",
]
KEPT = [
    "runbook.md", "运维手册 v2.md", "会議資料\u3000第2版.docx", "naïve café.txt", "re\u0301sume\u0301.txt",
    "报告（一）.md", "§5 Kündigung.txt", "تقرير.txt", "گزارش\u200cها.txt", "family-👨\u200d👩\u200d👧.txt",
    "❤\ufe0f notes.md", "1\ufe0f\u20e3 plan.md", "🏳\ufe0f\u200d🌈 pride.txt", "👍🏽 ok.md", "runbook\u0338.md",
    "ᠮᠣᠩ\u180bᠭᠣᠯ.txt", "run\u00a0book.md", "한국어 보고서.txt", "Ελληνικά.md", "長" * 251 + ".txt",
]


@pytest.mark.parametrize("name, code", REFUSED)
def test_invisible_and_blank_characters_are_refused(name, code):
    with pytest.raises(HandlerError) as exc:
        clean_name(name)
    assert exc.value.code == "INVALID_MESSAGE" and code in exc.value.message, exc.value.message


@pytest.mark.parametrize("name", FORGED)
def test_full_width_and_spaced_citation_forms_are_refused(name):
    with pytest.raises(HandlerError) as exc:
        clean_name(name)
    assert exc.value.code == "INVALID_MESSAGE" and "citation" in exc.value.message


@pytest.mark.parametrize("name", KEPT)
def test_ordinary_names_stay_accepted(name):
    assert clean_name(name) == name
