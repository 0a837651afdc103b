"""How the clients word values for people: counts with their plural, the server's UTC
timestamps in the user's local time (the CLI's text output and the TUI; ``--json`` keeps ISO UTC),
and the server's text with its control characters shown, never run by the terminal."""
from __future__ import annotations

from datetime import datetime

#: The bidirectional embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069): they reorder
#: what follows them on the line ("Trojan Source", CVE-2021-42574), so a document or a log line can
#: make ``rm -rf /tmp/x`` read as something else; the server refuses them in titles and names
#: (``protocol.messages``). The marks U+200E/U+200F (LRM/RLM) and U+061C (ALM) are left alone: they
#: reorder nothing (a zero-width letter of one direction), and right-to-left text uses them.
BIDI_CONTROLS = frozenset(range(0x202A, 0x202F)) | frozenset(range(0x2066, 0x206A))
# What ``printable`` shows instead of passing it to the terminal: every C0 control but tab and
# newline, DEL, every C1 control (U+0080-U+009F; U+009B is an 8-bit CSI) and the bidi controls.
CONTROLS = frozenset(range(0x20)) - {0x09, 0x0A} | {0x7F} | frozenset(range(0x80, 0xA0)) | BIDI_CONTROLS
_VISIBLE = {c: f"\\u{c:04x}" for c in CONTROLS}


def printable(text: str) -> str:
    """``text`` with each control character in ``CONTROLS`` written as its ``\\uXXXX`` escape (ESC
    as ``\\u001b``). The server's text (answers quoting another user's document, a model's output,
    passages, names, errors) could otherwise set the window title (``ESC ] 0 ; ... BEL``), hide text
    (``ESC [ 8 m``) or write the clipboard (OSC 52), on a terminal or later, when a redirected
    output is ``cat``. The escape is JSON's own (``json.dumps`` writes it for C0 controls), so a
    JSON document stays valid and decodes to the same text. A bidi control (``BIDI_CONTROLS``:
    ``\\u202e`` would show the rest of its line reversed) is escaped the same way. U+2028/U+2029 are
    left alone: terminals do not act on them, and JSON allows them."""
    return text.translate(_VISIBLE)


def counted(n: int, noun: str) -> str:
    """``1 chunk``, ``2 chunks``, ``0 chunks`` (nouns with a plain -s plural)."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _local(ts: str | None) -> datetime | None:
    if not ts:
        return None
    try:
        return datetime.fromisoformat(ts).astimezone()
    except ValueError:
        return None


def stamp(ts: str | None, *, seconds: bool = False) -> str:
    """``2026-11-27 09:12 CET`` (``...:12:03 CET`` with ``seconds``): a full local time with its zone,
    for lines that are read later or elsewhere. An unparsable value is shown as it came."""
    dt = _local(ts)
    if dt is None:
        return ts or ""
    return dt.strftime("%Y-%m-%d %H:%M:%S %Z" if seconds else "%Y-%m-%d %H:%M %Z")


def minute(ts: str | None) -> str:
    """``2026-11-27 09:12`` local, for the TUI's columns (all of its times are local)."""
    dt = _local(ts)
    return dt.strftime("%Y-%m-%d %H:%M") if dt else ""


def clock(ts: str | None) -> str:
    """``HH:MM`` local ('' when unparsable)."""
    dt = _local(ts)
    return dt.strftime("%H:%M") if dt else ""


def compact(ts: str | None) -> str:
    """``HH:MM`` today, else ``YYYY-MM-DD`` (local)."""
    dt = _local(ts)
    if dt is None:
        return ""
    return dt.strftime("%H:%M") if dt.date() == datetime.now().astimezone().date() else dt.strftime("%Y-%m-%d")
