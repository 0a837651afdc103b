"""The server with the real memory layer (summaries, recall) and the real offline agent wiring."""
from __future__ import annotations

from protocol import MsgType
from server.app import Server
from testkit.echo_agent import EchoAgent
from testkit.server import V3Client, make_config, running_server

T = MsgType
SUMMARIZE_EARLY = {"summarization": {"trigger": {"type": "messages", "value": 4},
                                     "keep": {"type": "messages", "value": 2}}}


async def test_real_memory_builds_context_and_pushes_summaries(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent, memory="auto", sections=SUMMARIZE_EARLY) as (srv, addr):
        assert type(srv.memory).__name__ == "MemoryManager"
        c = await V3Client.connect(addr)
        other = await V3Client.connect(addr)  # another connection of the same user
        for i in range(3):
            r = await c.call(T.CHAT_TEXT, text=f"fact number {i}: the backup runs at {i} am")
            end = (await c.turn_events(r["turn_id"]))[-1]
            assert end.type == T.TURN_END and end.body["context"].get("memory") != "basic"
        ev = await other.wait_type(T.SESSION_EVENT, kind="summary")
        summary = ev.body["session"]["summary"]
        assert "the backup runs at 0 am" in summary["text"] and summary["covers_to_id"] >= 2
        info = await c.call(T.SESSION_INFO)
        assert info["session"]["summary"]["covers_to_id"] >= summary["covers_to_id"]  # rolling
        r = await c.call(T.CHAT_TEXT, text="when does the backup run?")
        await c.turn_events(r["turn_id"])
        system = [m["content"] for m in agent.requests[-1].context.messages if m["role"] == "system"]
        assert any("the backup runs at 0 am" in s for s in system)  # the summary is in the next prompt
        page = await c.call(T.HISTORY_REQUEST)
        assert page["total"] == 8  # raw history is never shortened
        await c.close()
        await other.close()


async def test_memory_warnings_become_notices(tmp_path):
    async with running_server(tmp_path, memory="auto") as (srv, addr):
        c = await V3Client.connect(addr)
        await srv.notify("warning", c.session_id, {"level": "warning", "code": "SUMMARY_FAILED",
                                                   "message": "summarizing failed 3 times"})
        n = await c.wait_type(T.NOTICE)
        assert n.body == {"re": None, "level": "warning", "code": "SUMMARY_FAILED",
                          "message": "summarizing failed 3 times", "session_id": c.session_id}
        await c.close()


async def test_default_wiring_uses_the_offline_agent(tmp_path):
    srv = Server(make_config(tmp_path))  # no agent, no memory given: the real wiring
    await srv.start()
    try:
        c = await V3Client.connect((srv.host, srv.port))
        assert c.hello["agent"]["offline"] is True and c.hello["agent"]["name"] != "echo"
        r = await c.call(T.CHAT_TEXT, text="show memory usage")
        events = await c.turn_events(r["turn_id"], timeout=30)
        assert events[-1].type == T.TURN_END and events[-1].body["message"]["content"]
        assert any(e.type == T.TOOL_RESULT for e in events)  # the offline agent used a real tool
        await c.close()
    finally:
        await srv.stop()
