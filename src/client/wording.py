"""How the clients word values for people: counts with their plural, and the server's UTC
timestamps in the user's local time (the CLI's text output and the TUI; ``--json`` keeps ISO UTC)."""
from __future__ import annotations

from datetime import datetime


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
