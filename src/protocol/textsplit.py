"""Split text into UTF-8 chunks that each fit one frame, cutting only at character boundaries."""
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
