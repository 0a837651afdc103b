"""Wording shared by the TUI's widgets."""
from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """``1 chunk``, ``2 chunks``, ``0 chunks`` (nouns with a plain -s plural)."""
    return f"{n} {noun}" + ("" if n == 1 else "s")
