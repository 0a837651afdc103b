"""The text encoding of an uploaded text file, detected: bytes in, ``str`` out (``decode_text``).

BOM / UTF-8 first (a cut last character and a handful of invalid bytes tolerated), then Shift-JIS
when it reads as Japanese, then GB18030 when it reads as Chinese, else charset-normalizer's guess
(Latin-1's cp1252 preferred among equally clean guesses); UTF-16 without a BOM is recognised by its
NUL bytes (every other byte 0). ANSI escape sequences (a coloured log's ``\x1b[32m``) are removed.
Binary content (NUL bytes, control characters) is refused with UNSUPPORTED_MEDIA. docs/knowledge.md
"Formats" gives the thresholds.
"""
from __future__ import annotations

import re

from protocol import ErrorCode
from server.errors import HandlerError

_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
#: ANSI escape sequences, as terminals and coloured logs write them: CSI ("\x1b[32m", "\x1b[0K") and
#: OSC ("\x1b]0;title\x07", "\x1b]8;;url\x1b\\"), an OSC never across a line end (line numbers stay)
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b\n]*(?:\x07|\x1b\\)")
UTF16_SAMPLE_BYTES = 4096     # bytes examined for the NUL pattern of UTF-16 without a BOM
UTF16_NUL_RATIO = 4           # ... NUL bytes at one parity more than this many times those at the other


def unsupported(message: str) -> HandlerError:
    """The refusal of a file the knowledge base cannot read (UNSUPPORTED_MEDIA), for every parser."""
    return HandlerError(ErrorCode.UNSUPPORTED_MEDIA, message)


def _is_chinese(c: str) -> bool:
    return "\u4e00" <= c <= "\u9fff" or "\u3000" <= c <= "\u303f" or "\uff01" <= c <= "\uff5e"


def _as_gb18030(data: bytes) -> str | None:
    """``data`` as GB18030 (a superset of GBK and GB2312) when it decodes strictly and its non-ASCII
    characters are mostly common Chinese (CJK ideographs and CJK punctuation) whose second byte is
    not ASCII (as in GB2312; Latin-1 text read as GBK pairs an accent with the next letter), else
    None. Checked before charset-normalizer, whose guess on short Chinese text is often cp932/Big5.
    The proportions are taken on the first ``SAMPLE_CHARS`` characters."""
    try:
        text = data.decode("gb18030")
    except UnicodeDecodeError:
        return None
    wide = [c for c in text[:SAMPLE_CHARS] if ord(c) > 0x7F]
    chinese = sum(1 for c in wide if _is_chinese(c))
    ascii_trail = sum(1 for c in wide if (b := c.encode("gb18030")) and len(b) == 2 and b[1] < 0x80)
    return text if wide and chinese >= 0.9 * len(wide) and ascii_trail <= 0.2 * len(wide) else None


def _as_shift_jis(data: bytes) -> str | None:
    """``data`` as Shift-JIS (cp932) when it decodes strictly and at least a fifth of its non-ASCII
    characters are kana: Japanese prose always has kana (particles, endings), while GBK Chinese read
    as cp932 gives kanji and half-width katakana, almost never full-width kana. Checked before the
    GB18030 step, which would otherwise read Shift-JIS as rare ideographs."""
    try:
        text = data.decode("cp932")
    except UnicodeDecodeError:
        return None
    wide = [c for c in text[:SAMPLE_CHARS] if ord(c) > 0x7F]
    kana = sum(1 for c in wide if "\u3040" <= c <= "\u30ff")
    halfwidth = sum(1 for c in wide if "\uff61" <= c <= "\uff9f")
    return text if wide and kana >= 0.2 * len(wide) and halfwidth <= 0.05 * len(wide) else None


SAMPLE_CHARS = 65536      # characters examined by the encoding heuristics
UTF8_MAX_BAD = 8          # invalid sequences tolerated in otherwise valid UTF-8 (replaced by U+FFFD)


def _as_utf8(data: bytes) -> str | None:
    """``data`` as UTF-8 that is valid but for an incomplete last character (a file cut short: the
    tail is dropped) and at most ``UTF8_MAX_BAD`` invalid sequences (each replaced by U+FFFD) among
    at least four times as many valid non-ASCII characters; else None."""
    view = memoryview(data)
    if data.startswith(b"\xef\xbb\xbf"):
        view = view[3:]
    parts: list[str] = []
    bad = pos = 0
    while True:
        try:
            parts.append(str(view[pos:], "utf-8"))
            break
        except UnicodeDecodeError as exc:
            parts.append(str(view[pos:pos + exc.start], "utf-8"))
            if pos + exc.end == len(view) and exc.reason == "unexpected end of data":
                break                                  # the last character, cut short
            bad += 1
            if bad > UTF8_MAX_BAD:
                return None
            parts.append("\ufffd")
            pos += exc.end
    text = "".join(parts)
    if bad and sum(1 for c in text if ord(c) > 0x7F) - bad < 4 * bad:
        return None
    return text


_WESTERN = {"cp1252", "latin_1", "iso8859_15"}


def _guess(data: bytes) -> str | None:
    """charset-normalizer's best guess; but cp1252 (Latin-1's superset) when it is among the guesses
    that read the bytes equally cleanly (the lowest "mess"), so French or German text is not read
    as cp1250 or hp_roman8 only because those rank first among equals."""
    from charset_normalizer import from_bytes
    matches = from_bytes(data)
    best = matches.best()
    if best is None:
        return None
    lowest = min(m.chaos for m in matches)
    for m in matches:
        if m.chaos <= lowest and _WESTERN & {m.encoding, *m.could_be_from_charset}:
            try:
                return data.decode("cp1252")
            except UnicodeDecodeError:
                return data.decode("latin-1")
    return str(best)


def _utf16_without_bom(data: bytes) -> str | None:
    """"utf-16-le" or "utf-16-be" when ``data`` (no BOM) has UTF-16's NUL pattern: an even length and,
    in the first ``UTF16_SAMPLE_BYTES``, NUL bytes on one side of the 2-byte units (the high byte of
    an ASCII character: "a\\0b\\0" in UTF-16-LE, even a newline in Chinese text) more than
    ``UTF16_NUL_RATIO`` times as often as on the other (the low byte of U+xx00, such as 一 U+4E00),
    else None. Binary data that happens to match decodes to control characters and is refused by
    the usual check."""
    if len(data) < 2 or len(data) % 2:
        return None
    sample = data[:UTF16_SAMPLE_BYTES]
    low_first, high_first = sample[0::2].count(0), sample[1::2].count(0)   # (LE: the low byte first)
    if high_first > UTF16_NUL_RATIO * low_first:
        return "utf-16-le"
    if low_first > UTF16_NUL_RATIO * high_first:
        return "utf-16-be"
    return None


def decode_text(data: bytes) -> str:
    """Bytes of a text file as str: BOM / UTF-8 first (a cut last character and a handful of invalid
    bytes tolerated), UTF-16 without a BOM by its NUL pattern, then Shift-JIS when it reads as
    Japanese, then GB18030 when it reads as Chinese, else the encoding charset-normalizer finds
    (Big5, UTF-16, Latin-1 preferred among equals, ...). ANSI escape sequences are removed; binary
    content (NUL bytes, control characters) is refused."""
    utf16 = data.startswith((b"\xff\xfe", b"\xfe\xff"))
    bare16 = None if utf16 else _utf16_without_bom(data)
    if bare16 is not None:
        try:
            text = data.decode(bare16)
        except UnicodeDecodeError:              # (a lone surrogate: not text)
            raise unsupported("binary content in a text file") from None
    elif b"\x00" in data[:65536] and not utf16:
        raise unsupported("binary content in a text file")
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            text = None if utf16 else (_as_utf8(data) or _as_shift_jis(data) or _as_gb18030(data))
            if text is None:
                text = _guess(data)
                if text is None:
                    raise unsupported("cannot detect the text encoding (binary file?)") from None
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    sample = text[:65536]
    if sample and len(_CONTROL.findall(sample)) > len(sample) // 100 + 1:
        raise unsupported("binary content in a text file")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text
