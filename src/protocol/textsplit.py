"""Split (or cut) text into UTF-8 that fits one frame, cutting only at character boundaries."""
from __future__ import annotations

from .frame import MAX_PAYLOAD


def split_text_utf8(text: str, max_bytes: int = MAX_PAYLOAD) -> list[bytes]:
    """UTF-8 encode ``text`` and cut it into chunks of at most ``max_bytes`` bytes.

    No character is split across chunks, so each chunk decodes on its own. Empty text gives ``[]``.
    """
    if max_bytes < 4:
        raise ValueError(f"max_bytes must be >= 4 (one UTF-8 character), got {max_bytes}")
    data = text.encode("utf-8")
    size = len(data)
    if size <= max_bytes:
        return [data] if data else []
    chunks: list[bytes] = []
    start = 0
    while size - start > max_bytes:
        end = start + max_bytes
        while data[end] & 0xC0 == 0x80:   # a continuation byte: back off to the character start
            end -= 1
        chunks.append(data[start:end])
        start = end
    chunks.append(data[start:])
    return chunks


def cut_text_utf8(text: str, max_bytes: int = MAX_PAYLOAD, marker: str = "…") -> str:
    """``text`` if its UTF-8 fits in ``max_bytes``, else its longest prefix that fits with ``marker``
    appended (no character is split)."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    room = max_bytes - len(marker.encode("utf-8"))
    if room < 0:
        raise ValueError(f"max_bytes ({max_bytes}) is smaller than the marker")
    return data[:room].decode("utf-8", errors="ignore") + marker
