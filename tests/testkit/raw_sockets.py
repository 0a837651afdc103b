"""Raw sockets for the connection-limit tests: a client stuck in its handshake, reading to EOF, and
the code of the ERROR frame the server sent before closing."""
from __future__ import annotations

import asyncio
import ssl

from protocol import Connection, MsgType, Role
from testkit.server import DEADLINE


async def squat(addr, ssl_ctx: ssl.SSLContext | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A socket that sends the first byte of a HELLO (0x20) and nothing more: a v3 client "in its
    handshake" that never finishes it (or, with TLS, a TCP connection that never starts the TLS one)."""
    reader, writer = await asyncio.open_connection(*addr)
    if ssl_ctx is None:
        writer.write(bytes([MsgType.HELLO]))
    return reader, writer


async def read_to_eof(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes (a reset ends it too)."""
    data = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), DEADLINE):
            data += chunk
    except ConnectionError:
        pass
    return data


def error_code(data: bytes) -> str | None:
    """The code of the ERROR frame the server sent (None: it only closed)."""
    events = Connection(Role.CLIENT).receive_data(data) if data else []
    return events[0].body["code"] if events else None
