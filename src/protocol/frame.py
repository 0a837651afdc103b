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


TLS_ON_PLAIN_PORT = ("a TLS handshake on a plain-TCP port: this server does not speak TLS here "
                     "(connect without TLS, or enable TLS on the server)")


def looks_like_tls(data: bytes, offset: int = 0) -> bool:
    """Whether the bytes at ``offset`` start a TLS record header (handshake 0x16, version 0x03 0x00..0x04):
    a client connecting with TLS to a plain port. Read as an NPLT frame it would be a v2 SESSION_NEW
    (0x16) with seq 0x03xx, which no v2 client sends first (they start at seq 0)."""
    return len(data) - offset >= 3 and data[offset] == 0x16 and data[offset + 1] == 0x03 and data[offset + 2] <= 0x04
