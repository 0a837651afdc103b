"""Helpers of the knowledge-base wire tests: a server with users in groups, raw uploads."""
from __future__ import annotations

import hashlib
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

from protocol import MsgType
from protocol.binary import MAX_DATA, encode_data
from server.auth import hash_token
from testkit.server import V3Client, running_server

# user -> (groups, admin)
USERS: dict[str, tuple[list[str], bool]] = {
    "alice": (["red"], False), "bob": (["blue"], False), "carol": (["red", "blue"], False),
    "dave": ([], False), "root": ([], True),
}


def token(user: str) -> str:
    return f"token-of-{user}"


def auth_section() -> dict[str, Any]:
    return {"users": [{"user_id": u, "token_sha256": hash_token(token(u)), "groups": g, "admin": a}
                      for u, (g, a) in USERS.items()]}


@asynccontextmanager
async def kb_server(tmp_path: Path, knowledge: dict | None = None, **kw: Any) -> AsyncIterator[tuple[Any, Any]]:
    sections = {"auth": auth_section(), "knowledge": knowledge or {}}
    async with running_server(tmp_path, sections=sections, **kw) as (srv, addr):
        yield srv, addr


async def connect(addr: Any, user: str) -> V3Client:
    return await V3Client.connect(addr, token=token(user))


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def send_data(c: V3Client, handle: int, offset: int, data: bytes) -> None:
    for start in range(0, len(data), MAX_DATA):
        chunk = data[start:start + MAX_DATA]
        c.send_bytes(c.codec.send_raw(MsgType.KB_UPLOAD_DATA, encode_data(handle, offset + start, chunk)))


async def raw_upload(c: V3Client, name: str, data: bytes, *, checksum: str | None = None,
                     collection: str | None = None) -> dict[str, Any]:
    """BEGIN, every byte, END through the raw test client; the END reply (ReplyError on ERROR)."""
    body: dict[str, Any] = {"name": name, "size": len(data), "md5": checksum or md5(data)}
    if collection:
        body["collection"] = collection
    begin = await c.call(MsgType.KB_UPLOAD_BEGIN, **body)
    send_data(c, begin["handle"], begin["offset"], data[begin["offset"]:])
    return await c.call(MsgType.KB_UPLOAD_END, upload_id=begin["upload_id"])


@asynccontextmanager
async def wired_server(tmp_path: Path, **sections: Any) -> AsyncIterator[tuple[Any, Any]]:
    """The production wiring (the real agent from the config, the real memory) with the test users."""
    from server.app import Server
    from testkit.server import make_config
    cfg = make_config(tmp_path, sections={"llm": {}, "auth": auth_section(), **sections})
    srv = Server(cfg)
    addr = await srv.start()
    try:
        yield srv, addr
    finally:
        await srv.stop()


async def chat(c: V3Client, text: str) -> tuple[dict[str, Any], list[Any]]:
    """Send one chat message; (TURN_END body, every event of the turn)."""
    reply = await c.call(MsgType.CHAT_TEXT, text=text)
    events = await c.turn_events(reply["turn_id"], timeout=30)
    assert events[-1].type == MsgType.TURN_END, events[-1].body
    return events[-1].body, events
