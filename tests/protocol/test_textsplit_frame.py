"""split_text_utf8 and the frame helpers."""
from __future__ import annotations

import pytest

from protocol import HEADER_SIZE, MAX_FRAME, MAX_PAYLOAD, decode_header, encode_frame, split_text_utf8


def test_frame_layout_is_nplt_v2() -> None:
    frame = encode_frame(0x01, 0x1234, b"hey")
    assert frame == b"\x01\x12\x34\x00\x03hey"
    assert decode_header(b"xx" + frame, 2) == (1, 0x1234, 3)
    assert HEADER_SIZE == 5 and MAX_PAYLOAD == 65535 and MAX_FRAME == 65540


def test_split_small_and_empty_text() -> None:
    assert split_text_utf8("") == []
    assert split_text_utf8("héllo") == ["héllo".encode()]
    assert split_text_utf8("x" * MAX_PAYLOAD) == [b"x" * MAX_PAYLOAD]


def test_split_never_cuts_a_character() -> None:
    text = "a" + "€" * 30_000                     # 3-byte characters, offset by one byte
    parts = split_text_utf8(text)
    assert [len(p) for p in parts] == [65533, 24468]
    assert all(len(p) <= MAX_PAYLOAD for p in parts)
    assert "".join(p.decode("utf-8") for p in parts) == text
    emoji = split_text_utf8("🙂" * 5, max_bytes=6)
    assert emoji == ["🙂".encode()] * 5


def test_split_rejects_a_limit_below_one_character() -> None:
    with pytest.raises(ValueError, match="max_bytes must be >= 4"):
        split_text_utf8("abc", max_bytes=3)
