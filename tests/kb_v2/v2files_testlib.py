"""Helpers: a server built by the production wiring (offline agent, knowledge base, UDP endpoint) and a v2
client that uploads files and reads answers carrying DOWNLOAD_OFFER frames."""
from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

from server.app import Server
from testkit.server import make_config
from testkit.v2client import AGENT_THOUGHT, CHAT_TEXT, CLIENT_UDP_PORT, V2Client

FILE_DATA, FILE_METADATA, DOWNLOAD_OFFER = 0x0D, 0x0E, 0x0C


@asynccontextmanager
async def files_server(tmp_path: Path, *, agent: Any = None, **sections: dict[str, Any]
                       ) -> AsyncIterator[tuple[Server, tuple[str, int]]]:
    """No ``agent``: the offline agent the factory builds without an [llm] section."""
    cfg = make_config(tmp_path, sections={"llm": {}, **sections})
    srv = Server(cfg, agent=agent, memory="basic")
    host, port = await srv.start()
    try:
        yield srv, (host, port)
    finally:
        await srv.stop()


async def connect(addr: tuple[str, int], udp_port: int | None = None, *, early: bool = False) -> V2Client:
    """A v2 client; with ``udp_port`` it announces it as the deployed client does (JSON): after the
    welcome, or with ``early`` as its first message (no legacy grace period to wait out)."""
    if early and udp_port is not None:
        reader, writer = await asyncio.open_connection(*addr)
        client = V2Client(reader, writer)
        client.send(CLIENT_UDP_PORT, json.dumps({"udp_port": udp_port}))
        await client.recv_text()        # the welcome
        return client
    client, _welcome = await V2Client.connect(addr, send_udp_port=False)
    if udp_port is not None:
        client.send(CLIENT_UDP_PORT, json.dumps({"udp_port": udp_port}))
    return client


def send_file(client: V2Client, name: str, data: bytes, piece: int = 200, size: int | None = None) -> None:
    """FILE_METADATA then FILE_DATA pieces of ``piece`` bytes (the deployed client sends 200)."""
    client.send(FILE_METADATA, json.dumps({"filename": name, "size": len(data) if size is None else size}))
    for off in range(0, len(data), piece):
        client.send(FILE_DATA, data[off:off + piece])


async def answer_with_offers(client: V2Client, timeout: float = 20.0) -> tuple[str, list[dict[str, Any]]]:
    """Frames up to the end marker: (answer text, DOWNLOAD_OFFER documents)."""
    chunks: list[str] = []
    offers: list[dict[str, Any]] = []
    while True:
        t, payload = await client.recv(timeout)
        if t == DOWNLOAD_OFFER:
            offers.append(json.loads(payload))
        elif t == CHAT_TEXT:
            if not payload:
                return "".join(chunks), offers
            chunks.append(payload.decode())
        elif t != AGENT_THOUGHT:
            raise AssertionError(f"unexpected frame type 0x{t:02X}")
