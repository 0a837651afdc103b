"""A store that cannot write (a full disk) over real TCP: STORAGE_ERROR, not fatal, nothing acknowledged."""
from __future__ import annotations

import errno

import pytest

from protocol import MsgType as T
from server.app import Server
from storage import AsyncHistoryStore
from testkit.echo_agent import EchoAgent
from testkit.server import ReplyError, V3Client, make_config
from testkit.v2client import V2Client


class FullDisk:
    """The real store, whose appends fail with ENOSPC while ``full`` is set."""

    def __init__(self, store: AsyncHistoryStore) -> None:
        self.store = store
        self.full = False

    def __getattr__(self, name):
        return getattr(self.store, name)

    async def append(self, session_id, role, content, **kw):
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return await self.store.append(session_id, role, content, **kw)


@pytest.fixture
async def full_disk_server(tmp_path):
    cfg = make_config(tmp_path)
    real = await AsyncHistoryStore.open(cfg.storage)
    disk = FullDisk(real)
    srv = Server(cfg, agent=EchoAgent(), store=disk, memory="basic")
    host, port = await srv.start()
    try:
        yield disk, (host, port)
    finally:
        await srv.stop()
        await real.close()


async def test_v3_chat_on_a_full_disk_gets_storage_error_and_the_connection_stays(full_disk_server):
    disk, addr = full_disk_server
    c = await V3Client.connect(addr)
    disk.full = True
    with pytest.raises(ReplyError) as exc:
        await c.call(T.CHAT_TEXT, text="will not fit")
    assert exc.value.code == "STORAGE_ERROR" and exc.value.body["fatal"] is False
    assert "No space left on device" in exc.value.body["message"]
    page = await c.call(T.HISTORY_REQUEST)
    assert page["total"] == 0 and page["messages"] == []          # nothing acknowledged, nothing stored
    disk.full = False
    r = await c.call(T.CHAT_TEXT, text="fits now")                 # same connection, same session
    assert r["user_message"]["id"] == 1
    await c.close()


async def test_v2_chat_on_a_full_disk_is_told_in_text(full_disk_server):
    disk, addr = full_disk_server
    v2, _ = await V2Client.connect(addr)
    disk.full = True
    v2.send(T.CHAT_TEXT, "will not fit")
    text = await v2.recv_text()
    assert text.startswith("Error: ") and "No space left on device" in text
    assert await v2.recv_text() == ""          # the end marker: the chat is answered like a turn
    disk.full = False
    v2.send(T.CHAT_TEXT, "HEARTBEAT")
    assert await v2.recv_text() == "HEARTBEAT"
    await v2.close()
