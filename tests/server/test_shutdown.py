"""Graceful shutdown: nothing acknowledged is lost, running turns are saved as partial answers."""
from __future__ import annotations

import asyncio

import pytest

from protocol import MsgType
from storage import HistoryStore, StorageConfig
from testkit.echo_agent import EchoAgent
from testkit.server import V3Client, running_server
from testkit.v2client import CHAT_TEXT, V2Client

T = MsgType


async def test_graceful_shutdown_loses_nothing(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent, storage={"durability": "batched", "batch_ms": 1000}) as (srv, addr):
        c = await V3Client.connect(addr)
        sid = c.session_id
        for i in range(5):
            r = await c.call(T.CHAT_TEXT, text=f"keep {i}")
            await c.turn_events(r["turn_id"])
        running = await c.call(T.CHAT_TEXT, text="!block interrupted by shutdown")
        queued = await c.call(T.CHAT_TEXT, text="queued behind it")
        await agent.wait_blocked()
        v2, _ = await V2Client.connect(addr)
        await srv.stop()
        events = await c.turn_events(running["turn_id"])
        assert events[-1].type == T.TURN_END and events[-1].body["finish_reason"] == "cancelled"
        qe = await c.turn_events(queued["turn_id"])
        assert qe[-1].body["finish_reason"] == "cancelled"
        err = await c.wait_type(T.ERROR)
        assert err.body["code"] == "SHUTTING_DOWN" and err.body["fatal"] is True
        await c.wait_closed()
        assert await v2.recv_text() == "Server is shutting down."
        assert await v2.expect_eof() == b""
        assert agent.closed
        with pytest.raises(OSError):
            await asyncio.open_connection(*addr)
    store = HistoryStore(StorageConfig(root=str(tmp_path / "history")))  # reopen: the store was closed
    try:
        msgs = store.messages(sid)
        contents = [m.content for m in msgs]
        assert contents[:10] == [x for i in range(5) for x in (f"keep {i}", f"echo: keep {i}")]
        assert "!block interrupted by shutdown" in contents and "queued behind it" in contents
        partial = [m for m in msgs if m.metadata.get("partial")]
        assert len(partial) == 2 and partial[0].content == "echo: !block interru"[: len(partial[0].content)]
        assert all(m.metadata["cancel_reason"] == "shutdown" for m in partial)
    finally:
        store.close()


async def test_stop_is_idempotent_and_refuses_new_turns(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        await srv.stop()
        await srv.stop()
        assert srv.runner.closing
