"""Graceful shutdown: nothing acknowledged is lost, running turns are saved as partial answers."""
from __future__ import annotations

import asyncio
import time

import pytest

from protocol import MsgType
from storage import HistoryStore, StorageConfig
from testkit.echo_agent import EchoAgent
from testkit.server import V3Client, running_server
from testkit.v2client import V2Client

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


class StubbornAgent(EchoAgent):
    """An agent that ignores cancellation until told to stop (a hung LLM client)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.let_go = asyncio.Event()

    async def run_turn(self, req, sink):
        self.entered.set()
        while not self.let_go.is_set():
            try:
                await self.let_go.wait()
            except asyncio.CancelledError:
                continue
        return await super().run_turn(req, sink)


async def test_shutdown_waits_at_most_shutdown_grace_s_for_a_hung_turn(tmp_path):
    agent = StubbornAgent()
    async with running_server(tmp_path, agent, shutdown_grace_s=0.2) as (srv, addr):
        c = await V3Client.connect(addr)
        await c.call(T.CHAT_TEXT, text="hang")
        await asyncio.wait_for(agent.entered.wait(), 10)
        started = time.monotonic()
        await srv.stop()
        elapsed = time.monotonic() - started
        agent.let_go.set()
        assert elapsed < 2.5, f"stop took {elapsed:.2f} s with shutdown_grace_s = 0.2 (default 5 s)"
        await c.close()
