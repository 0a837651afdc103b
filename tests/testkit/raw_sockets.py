"""Raw sockets for the connection-limit and output tests: a client stuck in its handshake, reading to
EOF, the code of the ERROR frame the server sent before closing, a client that stops reading."""
from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Any

from protocol import Connection, MsgType, Role
from testkit.server import DEADLINE, V3Client


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


async def big_session(addr: tuple[str, int], chars: int = 1_000_000) -> V3Client:
    """A client whose session holds an answer of ``chars`` characters (an export of about that size;
    the test agent's ``!big``)."""
    good = await V3Client.connect(addr)
    r = await good.call(MsgType.CHAT_TEXT, text=f"!big {chars}")
    await good.turn_events(r["turn_id"], timeout=30)
    return good


async def paused_client(srv: Any, addr: tuple[str, int]) -> tuple[V3Client, Any]:
    """A v3 client past HELLO that does not read (small kernel buffers on both ends, so what it does
    not read stays in the server's transport; ``testkit`` tests resume it by restarting its reader);
    and its server connection."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, addr)
    reader, writer = await asyncio.open_connection(sock=sock)
    c = V3Client(reader, writer)
    c.hello = await c.call(MsgType.HELLO, proto=3, client="paused")
    c._task.cancel()
    await asyncio.gather(c._task, return_exceptions=True)
    port = writer.get_extra_info("sockname")[1]
    conn = next(x for x in srv.connections if x.peer.endswith(f":{port}"))
    conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    return c, conn
