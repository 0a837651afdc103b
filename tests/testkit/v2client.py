"""A legacy NPLT v2 client speaking raw frames (no protocol package), like the original client.

Frames: ``>BHH`` header (type, seq, len) then the payload; text payloads are UTF-8. Every received
type code is recorded in ``types_seen`` so tests can assert that no v3-only code ever arrived.
"""
from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

HEADER = struct.Struct(">BHH")
CHAT_TEXT, AGENT_THOUGHT, MODEL_SWITCH, HISTORY_REQUEST, CLEAR_REQUEST = 0x01, 0x0A, 0x0F, 0x10, 0x11
SESSION_LIST, SESSION_SWITCH, SESSION_NEW, SESSION_DELETE, CLIENT_UDP_PORT = 0x14, 0x15, 0x16, 0x17, 0x18
FILE_METADATA = 0x0E
V2_CODES = {0x01, 0x0A, 0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x14, 0x15, 0x16, 0x17, 0x18}
DEADLINE = 10.0
UDP_PORT = 40000          # the UDP port ``connect`` announces by default (nothing listens there)


def welcome_session(welcome: str) -> str:
    """The session id in the server's welcome text ("... Session: s_... ...")."""
    return welcome.split("Session: ")[1].split()[0]


class V2Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.seq = 0
        self.rx_seq = 0
        self.types_seen: set[int] = set()
        self.seq_errors = 0

    @classmethod
    async def connect(cls, addr: tuple[str, int], *, send_udp_port: bool = True,
                      udp_port: int = UDP_PORT) -> tuple[V2Client, str]:
        """Connect, optionally register a UDP port as the original client does (``CLIENT_UDP_PORT``
        JSON ``{"udp_port": N}``, the spec's form, as its first message), read the welcome."""
        reader, writer = await asyncio.open_connection(*addr)
        client = cls(reader, writer)
        if send_udp_port:
            client.send(CLIENT_UDP_PORT, json.dumps({"udp_port": udp_port}))
        welcome = await client.recv_text()
        return client, welcome

    async def new_session(self) -> str:
        """SESSION_NEW; the new session's id (the connection is switched to it)."""
        self.send(SESSION_NEW)
        return (await self.recv_text()).removeprefix("New session: ")

    def send(self, msg_type: int, payload: bytes | str = b"") -> None:
        data = payload.encode() if isinstance(payload, str) else payload
        self.writer.write(HEADER.pack(msg_type, self.seq, len(data)) + data)
        self.seq = (self.seq + 1) & 0xFFFF

    async def recv(self, timeout: float = DEADLINE) -> tuple[int, bytes]:
        header = await asyncio.wait_for(self.reader.readexactly(5), timeout)
        t, seq, n = HEADER.unpack(header)
        payload = await asyncio.wait_for(self.reader.readexactly(n), timeout) if n else b""
        self.types_seen.add(t)
        if seq != self.rx_seq:
            self.seq_errors += 1
        self.rx_seq = (seq + 1) & 0xFFFF
        return t, payload

    async def recv_text(self, timeout: float = DEADLINE) -> str:
        t, payload = await self.recv(timeout)
        assert t == CHAT_TEXT, f"expected CHAT_TEXT, got 0x{t:02X} {payload[:80]!r}"
        return payload.decode("utf-8")

    async def read_answer(self, timeout: float = DEADLINE) -> tuple[list[dict[str, Any]], str, int]:
        """Frames up to the empty CHAT_TEXT: (AGENT_THOUGHT docs, answer text, number of text chunks)."""
        thoughts: list[dict[str, Any]] = []
        chunks: list[str] = []
        while True:
            t, payload = await self.recv(timeout)
            if t == AGENT_THOUGHT:
                thoughts.append(json.loads(payload))
            elif t == CHAT_TEXT:
                if not payload:
                    return thoughts, "".join(chunks), len(chunks)
                chunks.append(payload.decode("utf-8"))
            else:
                raise AssertionError(f"unexpected frame type 0x{t:02X} in an answer")

    async def expect_eof(self, timeout: float = DEADLINE) -> bytes:
        """Read until the server closes; returns whatever arrived before."""
        return await asyncio.wait_for(self.reader.read(), timeout)

    def only_v2_codes(self) -> bool:
        return self.types_seen <= V2_CODES

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
