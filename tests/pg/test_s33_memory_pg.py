"""Honest clear across nodes (S33): node A's summary model is still extracting the facts of a message
when the session is cleared, deleted or purged on node B. Before, the clear ended its pending mark
and A's learning then stored the cleared fact for good, on every node; now the clear leaves a lasting
floor in the user's memory document ("cleared up to message N", read from the session's row), and
no learning of a message at or below it adds anything, on any node. Two real in-process nodes on one
embedded PostgreSQL, the real memory layer and OpenAI agent, the scripted endpoint over loopback."""
from __future__ import annotations

import asyncio
import json

import pytest

from protocol import MsgType as T
from server.app import Server
from testkit.scripted_llm import Recorded, Reply, ScriptedLLM
from testkit.server import V3Client, make_config, poll

MODEL = "scripted-a"
DISTILL = "Extract the durable facts"
SECRET = "rb-wombat-3"


class HeldLLM(ScriptedLLM):
    """Chat turns: "ok". Distill requests: every line of the text as a fact; one whose text holds
    ``hold_on`` waits for ``release`` first (a slow summary model)."""

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.hold_on = SECRET
        self.release = asyncio.Event()
        self.held: list[Recorded] = []

    async def _respond(self, req: Recorded, writer) -> bool:
        messages = req.body.get("messages", [])
        if not req.body.get("stream") and messages and str(messages[0].get("content")).startswith(DISTILL):
            text = str(messages[-1]["content"])
            if self.hold_on in text:
                self.held.append(req)
                await self.release.wait()
            lines = [line for line in text.splitlines() if line.strip()]
            self.push(Reply.text(json.dumps([{"kind": "fact", "text": line} for line in lines])))
        else:
            self.push(Reply.text("ok"))
        return await super()._respond(req, writer)


def node_config(tmp_path, pg_url: str, name: str, llm: ScriptedLLM):
    return make_config(tmp_path / name, storage={"url": pg_url, "pg_retry_backoff_ms": 10}, sections={
        "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": MODEL, "retries": 0},
        "summarization": {"model": MODEL, "trigger": {"type": "messages", "value": 1000}}})


async def turn(c: V3Client, text: str) -> None:
    reply = await c.call(T.CHAT_TEXT, text=text)
    events = await c.turn_events(reply["turn_id"], timeout=30)
    assert events[-1].type == T.TURN_END, events[-1].body


async def listed(c: V3Client) -> list[str]:
    return [i["text"] for i in (await c.call(T.MEMORY_LIST))["items"]]


@pytest.mark.parametrize("how", ["clear", "delete", "purge"])
async def test_a_fact_still_being_extracted_on_one_node_stays_cleared_on_every_node(tmp_path, pg_url, how):
    async with HeldLLM(MODEL) as llm:
        a = Server(node_config(tmp_path, pg_url, "a", llm))
        b = Server(node_config(tmp_path, pg_url, "b", llm))
        await a.start()
        try:
            await b.start()
            try:
                on_a = await V3Client.connect((a.host, a.port))
                on_b = await V3Client.connect((b.host, b.port))
                s1 = on_a.session_id
                await turn(on_a, f"The release branch is {SECRET}.")
                await poll(lambda: llm.held, timeout=15, what="node A's extraction is held")

                if how == "clear":               # on node B, while node A's model still extracts
                    await on_b.call(T.CLEAR_REQUEST, session_id=s1)
                elif how == "delete":
                    await on_b.call(T.SESSION_DELETE, session_id=s1)
                else:
                    await on_b.call(T.SESSION_PURGE, session_id=s1)
                await b.services.memory.wait_idle()          # node B's forgetting has ended
                llm.release.set()
                await a.services.memory.wait_idle()          # node A's learning has ended
                assert len(llm.held) == 1

                for c in (on_a, on_b):
                    assert not any(SECRET in t for t in await listed(c))
                    await c.call(T.SESSION_NEW)
                    n = len(llm.requests)
                    await turn(c, "which release branch do we use?")
                    assert SECRET not in json.dumps([r.body for r in llm.requests[n:]])
                # what is said after the clear is learned as before (the floor holds only the cleared messages)
                if how == "clear":
                    await on_a.call(T.SESSION_SWITCH, session_id=s1)
                    await turn(on_a, "The build host is b-7.")

                    async def learned() -> bool:
                        return "The build host is b-7." in await listed(on_b)
                    await poll(learned, timeout=20)
                    assert not any(SECRET in t for t in await listed(on_b))
                for c in (on_a, on_b):
                    await c.close()
            finally:
                await b.stop()
        finally:
            await a.stop()
        fresh_node = Server(node_config(tmp_path, pg_url, "c", llm))    # a node started afresh reads the same
        await fresh_node.start()
        try:
            fresh = await V3Client.connect((fresh_node.host, fresh_node.port))
            assert not any(SECRET in t for t in await listed(fresh))
            await fresh.close()
        finally:
            await fresh_node.stop()
