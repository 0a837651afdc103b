"""Document names: what a knowledge-base document may be called (``clean_name``) and what two names
are compared by (``name_key``, Unicode NFC).

A name is metadata only, never a path: the folders of an uploaded file's name are dropped. It must
display as what it is and cannot pose as a citation ``[name §location]``: control, format,
invisible and blank-drawing characters, odd spaces and line separators are refused (joiners and
variation selectors only where the writing needs them), and so are brackets and " §", also in
their full-width forms (docs/knowledge.md, the INVALID_MESSAGE row).
"""
from __future__ import annotations

import re
import unicodedata

from protocol import ErrorCode
from server.errors import HandlerError

MAX_NAME_CHARS = 255


#: Unicode categories a name may not hold: format characters (Cf: bidirectional controls, so
#: "a\u202etxt.exe" shows as "aexe.txt"; zero-width U+200B-U+200D, U+2060, U+FEFF; the soft hyphen
#: U+00AD; tag characters U+E0000-U+E007F: "run\u200bbook.md" shows as "runbook.md"), private use (Co),
#: surrogates (Cs), and the line and paragraph separators U+2028, U+2029 (Zl, Zp); except joiners
#: where they are part of the writing (``_joins``)
_HIDDEN = frozenset(("Cf", "Co", "Cs", "Zl", "Zp"))
_JOINERS = "\u200c\u200d"          # zero-width non-joiner (Persian "گزارش‌ها"), joiner (Indic, emoji)

#: Unicode's Default_Ignorable_Code_Point ranges (DerivedCoreProperties.txt, Unicode 15; Python's
#: unicodedata does not expose the property): characters a renderer draws as nothing. Many are Cf
#: (refused by category); the others are marks and letters: the combining grapheme joiner U+034F,
#: the Hangul fillers U+115F, U+1160, U+3164, U+FFA0, Khmer U+17B4/U+17B5, the Mongolian free
#: variation selectors U+180B-U+180F, the variation selectors U+FE00-U+FE0F and U+E0100-U+E01EF,
#: and code points reserved as ignorable ("run\u034fbook.md" showed as "runbook.md")
_IGNORABLE = ((0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
              (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
              (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
              (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF))
#: characters that draw a blank but are no space (the Hangul fillers are ignorable too, above; the
#: blank braille pattern U+2800), and the spaces other than U+0020, the no-break space U+00A0 and the
#: ideographic space U+3000 (which show as the spaces they are): the en, em, thin, hair, narrow and
#: math spaces U+2000-U+200A, U+202F, U+205F and U+1680 are narrow or odd enough to pass unseen
#: ("run\u200abook.md" shows as "runbook.md")
_BLANK = frozenset("\u115f\u1160\u3164\uffa0\u2800")
_SPACES_KEPT = frozenset(" \u00a0\u3000")
_TEXT_VS = "\ufe0e\ufe0f"           # text / emoji presentation selectors (VS15, VS16)
_KEYCAP = "\u20e3"                  # "1\ufe0f\u20e3" is the keycap emoji 1️⃣


def _ignorable(c: str) -> bool:
    o = ord(c)
    return any(lo <= o <= hi for lo, hi in _IGNORABLE)


def _blank(c: str) -> bool:
    """A character that draws nothing but space (see ``_BLANK``), not one of ``_SPACES_KEPT``."""
    return c in _BLANK or (unicodedata.category(c) == "Zs" and c not in _SPACES_KEPT)


def _selects(name: str, i: int) -> bool:
    """Whether the variation selector at ``name[i]`` is writing: VS15 / VS16 right after an emoji or
    symbol (So, Sk: "❤\ufe0f"), or in a keycap ("1\ufe0f\u20e3"); a Mongolian free variation selector
    right after a Mongolian letter. Anywhere else it changes nothing that shows."""
    c = name[i]
    if i == 0:
        return False
    before = name[i - 1]
    if c in _TEXT_VS:
        if unicodedata.category(before) in ("So", "Sk") and not _blank(before):
            return True
        return (before in "0123456789#*") and name[i + 1:i + 2] == _KEYCAP
    if c in "\u180b\u180c\u180d\u180f":
        return "\u1820" <= before <= "\u18aa"
    return False


def _hidden(name: str, i: int) -> bool:
    """Whether ``name[i]`` is invisible, a format character or a blank that poses as nothing."""
    c = name[i]
    if _joins(name, i) or _selects(name, i):
        return False
    return unicodedata.category(c) in _HIDDEN or _ignorable(c) or _blank(c)


def _joinable(c: str) -> bool:
    """A character a joiner may stand next to: a letter, a mark (a virama, U+FE0F) or a symbol (an
    emoji; an emoji modifier is Sk)."""
    cat = unicodedata.category(c)
    return (cat[0] in "LM" or cat in ("So", "Sk")) and not _blank(c) and not (cat[0] == "M" and _ignorable(c)
                                                                              and c not in _TEXT_VS)


def _joins(name: str, i: int) -> bool:
    """Whether the joiner at ``name[i]`` is writing, not a disguise: between two letters, marks or
    emoji, at least one of them outside ASCII (between ASCII letters a joiner changes nothing that
    shows: "run\u200dbook.md" would pass as "runbook.md")."""
    if name[i] not in _JOINERS or not 0 < i < len(name) - 1:
        return False
    before, after = name[i - 1], name[i + 1]
    return _joinable(before) and _joinable(after) and not (before.isascii() and after.isascii())


#: what would let a name end or forge a citation "[name §location]" ("x] [runbook.md" or
#: "runbook.md §Backup.txt" cite as if from runbook.md): brackets, and "§" after a space; looked for
#: in the name's NFKC form (full-width "［" is "["), blanks counted as spaces
_CITATION_FORGERY = re.compile(r"[\[\]]|\s§")


def _as_displayed(name: str) -> str:
    """``name`` as a reader may take it: NFKC (full-width brackets and spaces as ASCII ones), every
    blank-drawing character a space."""
    return "".join(" " if _blank(c) or c in _SPACES_KEPT else c for c in unicodedata.normalize("NFKC", name))


def name_key(name: str) -> str:
    """What two document names are compared by: Unicode NFC (a macOS client gives names in NFD;
    names are stored as given)."""
    return unicodedata.normalize("NFC", name)


def last_part(name: str) -> str:
    """The part of ``name`` after its last "/" or "\\" (the whole name without one), unnormalised:
    empty for "dir/" or "x.md//", "." for "a/."."""
    return name.replace("\\", "/").rsplit("/", 1)[-1]


def clean_name(name: str) -> str:
    """The base name of an uploaded file, or INVALID_MESSAGE for a hostile one (NUL, control
    characters anywhere; in the base name, invisible or format characters, Default_Ignorable code
    points, blank-drawing characters and odd spaces, line separators (U+200C / U+200D only where
    ``_joins`` allows them, variation selectors where ``_selects`` does), "[", "]" or " §" (also
    full-width, or after a blank) that would make its citations ambiguous, a last part that is
    empty, '.' or '..', over MAX_NAME_CHARS). The name is metadata only: never a path."""
    if not isinstance(name, str) or any(unicodedata.category(c) == "Cc" for c in name):
        raise HandlerError(ErrorCode.INVALID_MESSAGE, "file name holds control characters: rename the file")
    # the last part as sent, not normalised: PurePosixPath("x.md/").name is "x.md" and
    # PurePosixPath("a/.").name is "a", so "x.md/", "dir/" or "a/." passed as another name
    base = last_part(name)      # (the folders are dropped: only this is kept)
    hidden = sorted({f"U+{ord(c):04X}" for i, c in enumerate(base) if _hidden(base, i)})
    if hidden:
        raise HandlerError(ErrorCode.INVALID_MESSAGE, "file name holds invisible, blank, format (such as "
                           f"bidirectional control) or line separator characters ({', '.join(hidden[:8])}): "
                           "rename the file")
    base = base.strip()
    if not base or base in (".", ".."):
        raise HandlerError(ErrorCode.INVALID_MESSAGE, f"invalid file name {name[:80]!r}: its last part is "
                           "empty, '.' or '..'")
    if len(base) > MAX_NAME_CHARS:
        raise HandlerError(ErrorCode.INVALID_MESSAGE, f"file name over {MAX_NAME_CHARS} characters")
    if _CITATION_FORGERY.search(_as_displayed(base)):
        raise HandlerError(ErrorCode.INVALID_MESSAGE, "file name holds '[', ']' or ' §' (or a full-width form), "
                           "which would make its citations [name §location] ambiguous: rename the file")
    return base
