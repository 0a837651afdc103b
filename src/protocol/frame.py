"""The NPLT frame: header ``>BHH`` (type u8, seq u16, len u16) then ``len`` payload bytes."""
from __future__ import annotations

import struct

HEADER = struct.Struct(">BHH")
HEADER_SIZE = HEADER.size           # 5
MAX_PAYLOAD = 0xFFFF                # 65535 bytes per frame
MAX_FRAME = HEADER_SIZE + MAX_PAYLOAD
SEQ_MODULO = 0x10000                # seq wraps from 65535 to 0


def encode_frame(type_code: int, seq: int, payload: bytes = b"") -> bytes:
    """One frame as bytes. The caller guarantees ``len(payload) <= MAX_PAYLOAD``."""
    return HEADER.pack(type_code, seq, len(payload)) + payload


def decode_header(data: bytes, offset: int = 0) -> tuple[int, int, int]:
    """(type, seq, len) of the header at ``offset`` (at least 5 bytes must be available)."""
    return HEADER.unpack_from(data, offset)
