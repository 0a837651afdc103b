"""A clear, delete or purge on another node cancels the summary this node is writing (review s34,
brief PG item 3). Node A writes a summary of a session (its model call held open by the scripted
endpoint); the user's client on A has left; the session is cleared (deleted, purged) on node B. A's
relay hears B's SESSION_EVENT and reports it (``Relay.on_session_gone``, whether or not a client of
the user is attached on A) to the memory layer (``MemoryManager.forget_remote``), which cancels the
summary task and its model call. Before, only the node that handled the request forgot the session:
A kept its model call open and only dropped the result at the end. Two real in-process nodes on one
embedded PostgreSQL, the real memory layer and OpenAI agent, the scripted endpoint over loopback."""
from __future__ import annotations

import asyncio

import pytest

from protocol import MsgType as T
from server.app import Server
from testkit.scripted_llm import Recorded, Reply, ScriptedLLM
from testkit.server import V3Client, make_config, poll

MODEL = "scripted-a"
SUMMARY_PROMPT = "Summarize this conversation (s34 marker)."


class HeldSummaries(ScriptedLLM):
    """Chat turns: "ok". Summary requests: held open (never answered) until ``release``."""

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.release = asyncio.Event()
        self.held: list[Recorded] = []

    async def _respond(self, req: Recorded, writer) -> bool:
        messages = req.body.get("messages", [])
        if messages and messages[0].get("content") == SUMMARY_PROMPT:
            self.held.append(req)
            await self.release.wait()
            return False
        self.push(Reply.text("ok"))
        return await super()._respond(req, writer)


def node_config(tmp_path, pg_url: str, name: str, llm: ScriptedLLM):
    return make_config(tmp_path / name, storage={"url": pg_url, "pg_retry_backoff_ms": 10}, sections={
        "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": MODEL, "retries": 0},
        "summarization": {"model": MODEL, "summary_prompt": SUMMARY_PROMPT,
                          "trigger": {"type": "messages", "value": 3}, "keep": {"type": "messages", "value": 2}}})


def wired(server: Server) -> Server:
    """The node's relay reports other nodes' clears to its memory layer (``server.cluster`` passes
    ``on_session_gone`` to its Relay)."""
    assert server.services.cluster.relay.on_session_gone is not None
    return server


async def turn(c: V3Client, text: str) -> None:
    reply = await c.call(T.CHAT_TEXT, text=text)
    events = await c.turn_events(reply["turn_id"], timeout=30)
    assert events[-1].type == T.TURN_END, events[-1].body


@pytest.mark.parametrize("how", ["clear", "delete", "purge"])
async def test_a_clear_on_another_node_cancels_the_summary_being_written_here(tmp_path, pg_url, how):
    async with HeldSummaries(MODEL) as llm:
        a = Server(node_config(tmp_path, pg_url, "a", llm))
        b = Server(node_config(tmp_path, pg_url, "b", llm))
        await a.start()
        try:
            await b.start()
            try:
                wired(a), wired(b)
                on_a = await V3Client.connect((a.host, a.port))
                sid = on_a.session_id
                await turn(on_a, "The backup host is db-7.")
                await turn(on_a, "The cache host is redis-3.")
                await poll(lambda: llm.held, timeout=15, what="node A's summary call is held")
                task = a.services.memory.summaries._states[sid].task
                assert task is not None and not task.done()
                await on_a.close()                       # no client of the user is left on node A

                on_b = await V3Client.connect((b.host, b.port))
                if how == "clear":
                    await on_b.call(T.CLEAR_REQUEST, session_id=sid)
                elif how == "delete":
                    await on_b.call(T.SESSION_DELETE, session_id=sid)
                else:
                    await on_b.call(T.SESSION_PURGE, session_id=sid)
                await on_b.close()
                await poll(task.done, timeout=10, what="node A's summary is cancelled")   # before: held on
                assert task.cancelled()
                assert not a.services.memory.summaries.state(sid)["running"]
            finally:
                llm.release.set()
                await b.stop()
        finally:
            llm.release.set()
            await a.stop()
