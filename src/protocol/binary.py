"""Binary data frames (docs/protocol.md §5.8): file bytes travel raw, not base64.

A data frame (``KB_UPLOAD_DATA``, ``KB_DOWNLOAD_DATA``) is one ordinary NPLT frame whose payload is
a 12-byte header ``>IQ`` (``handle`` u32: the transfer it belongs to, ``offset`` u64: where its bytes
go in the file) followed by 1..``MAX_DATA`` bytes of the file. Data frames are never fragmented
(each fits one frame), so they interleave freely with other messages between them; they carry no
request id and are not answered one by one. The receiving codec returns them as ``Message`` events
whose ``body`` is the raw payload (``bytes``); ``decode_data`` splits it.
"""
from __future__ import annotations

import struct
from typing import Iterator

from .codes import BINARY_TYPES, ErrorCode, MsgType
from .errors import ProtocolError
from .frame import MAX_PAYLOAD

DATA_HEADER = struct.Struct(">IQ")
DATA_HEADER_SIZE = DATA_HEADER.size          # 12
MAX_DATA = MAX_PAYLOAD - DATA_HEADER_SIZE    # 65523 file bytes per frame
MAX_HANDLE = 0xFFFFFFFF


def encode_data(handle: int, offset: int, data: bytes | memoryview) -> bytes:
    """The payload of one data frame (send it with ``Connection.send_raw``)."""
    if not 0 <= handle <= MAX_HANDLE or offset < 0:
        raise ValueError(f"bad handle {handle!r} or offset {offset!r}")
    if not 0 < len(data) <= MAX_DATA:
        raise ValueError(f"a data frame carries 1..{MAX_DATA} bytes, not {len(data)}")
    return DATA_HEADER.pack(handle, offset) + data


def decode_data(payload: bytes) -> tuple[int, int, memoryview]:
    """(handle, offset, data) of a received data frame's payload; INVALID_MESSAGE if malformed."""
    if len(payload) <= DATA_HEADER_SIZE:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE,
                            f"data frame of {len(payload)} bytes: a {DATA_HEADER_SIZE}-byte header "
                            "and at least one byte expected", fatal=False)
    handle, offset = DATA_HEADER.unpack_from(payload)
    return handle, offset, memoryview(payload)[DATA_HEADER_SIZE:]


def data_frames(send_raw, type: MsgType, handle: int, offset: int,
                data: bytes | memoryview) -> Iterator[bytes]:
    """Frames (bytes, via ``send_raw`` of a ``protocol.Connection``) carrying ``data`` from ``offset``."""
    if type not in BINARY_TYPES:
        raise ValueError(f"{type!r} is not a binary type")
    view = memoryview(data)
    for start in range(0, len(view), MAX_DATA):
        yield send_raw(type, encode_data(handle, offset + start, view[start:start + MAX_DATA]))
