"""Review s33, v2 chat and history: superseded messages left out of v2 history pages (as from v3 pages),
and a v2 chat queued behind another client's turn is told so at once.

docs/protocol.md §7 (what a v2 client accepts): status goes as AGENT_THOUGHT JSON {"type": "stream_start" |
"thinking" | "tool_call" | "generating", "content": ...}; the answer as CHAT_TEXT chunks ended by an
empty CHAT_TEXT; "once a chat has started a turn, later requests (HEARTBEAT, another chat, ...) are
handled after the turn's end marker, in the order sent".
"""
from __future__ import annotations

import json

from protocol import MsgType
from testkit.echo_agent import EchoAgent
from testkit.server import V3Client, running_server
from testkit.v2client import AGENT_THOUGHT, CHAT_TEXT, HISTORY_REQUEST, V2Client, welcome_session


async def _history(v2: V2Client, request: str = "") -> dict:
    v2.send(HISTORY_REQUEST, request)
    return json.loads(await v2.recv_text())


async def test_v2_history_leaves_out_superseded_messages_as_v3_pages_do(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)
        sid = welcome_session(welcome)
        store = srv.store
        await store.append(sid, "user", "what time is it")                                    # 1
        await store.append(sid, "assistant", "old answer", metadata={"superseded": True})      # 2 (regenerated)
        await store.append(sid, "assistant", "new answer")                                    # 3
        await store.append(sid, "user", "first wording", metadata={"superseded": True})        # 4 (edited)
        for _ in range(6):                                                                    # 5..10
            await store.append(sid, "assistant", "superseded too", metadata={"superseded": True})
        await store.append(sid, "user", "second wording", metadata={"edited_from": 4})         # 11
        doc = await _history(v2)
        assert [(m["id"], m["content"]) for m in doc["messages"]] == [
            (1, "what time is it"), (3, "new answer"), (11, "second wording")]
        assert doc["message_count"] == 11 and doc["has_more"] is False
        v3 = await V3Client.connect(addr, session_id=sid)
        page = await v3.call(MsgType.HISTORY_REQUEST, session_id=sid)
        assert [m["id"] for m in page["messages"]] == [m["id"] for m in doc["messages"]]     # the same messages
        # a page of superseded messages only is paged past, as for v3: no empty page while more are left
        doc = await _history(v2, json.dumps({"before": 11, "limit": 3}))
        assert [m["id"] for m in doc["messages"]] == [3]
        assert all(not m["metadata"].get("superseded") for m in doc["messages"])
        doc = await _history(v2, json.dumps({"before": doc["next_before"], "limit": 3}))
        assert [m["id"] for m in doc["messages"]] == [1] and doc["has_more"] is False
        assert v2.only_v2_codes()
        await v3.close()
        await v2.close()


async def test_a_v2_chat_queued_behind_another_turn_is_told_at_once(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent=agent) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)
        sid = welcome_session(welcome)
        v3 = await V3Client.connect(addr, session_id=sid)
        reply = await v3.call(MsgType.CHAT_TEXT, text="!block a long v3 question", session_id=sid)
        await agent.wait_blocked(1)
        v2.send(CHAT_TEXT, "a v2 question")
        v2.send(CHAT_TEXT, "HEARTBEAT")
        # while the v3 turn still runs: the v2 answer opens, saying it waits
        first = [await v2.recv(timeout=5) for _ in range(2)]
        assert [(t, json.loads(p)) for t, p in first] == [
            (AGENT_THOUGHT, {"type": "stream_start", "content": ""}),
            (AGENT_THOUGHT, {"type": "thinking", "content": "queued behind 1 turn"})]
        assert agent.blocked == 1                                   # (still running)
        agent.release()
        await v3.turn_events(reply["turn_id"])
        thoughts, text, _ = await v2.read_answer()
        assert text == "echo: a v2 question"
        assert all(t["type"] != "stream_start" for t in thoughts)  # opened once, not twice
        assert await v2.recv_text() == "HEARTBEAT"                  # after the end marker, in order (§7)
        assert v2.only_v2_codes()
        await v3.close()
        await v2.close()


async def test_a_v2_chat_in_an_idle_session_opens_its_answer_once(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        v2, _ = await V2Client.connect(addr)
        v2.send(CHAT_TEXT, "hello")
        thoughts, text, _ = await v2.read_answer()
        assert text == "echo: hello"
        assert [t["type"] for t in thoughts].count("stream_start") == 1 and thoughts[0]["type"] == "stream_start"
        assert not any("queued" in str(t["content"]) for t in thoughts)
        await v2.close()
