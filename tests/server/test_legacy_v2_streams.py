"""v2: nothing is ever written between the CHAT_TEXT chunks of a running answer (docs/protocol.md §7)."""
from __future__ import annotations

import json

from testkit.echo_agent import EchoAgent
from testkit.server import V3Client, poll, running_server
from testkit.v2client import CHAT_TEXT, HISTORY_REQUEST, SESSION_LIST, SESSION_SWITCH, V2Client, welcome_session


async def server_has_read(srv, v2: V2Client) -> None:
    """Wait until the server side of the (only) v2 connection has received every frame ``v2`` sent."""
    await poll(lambda: any(c.legacy is not None and c.codec.rx_seq == v2.seq for c in srv.connections))


async def test_requests_sent_during_an_answer_are_answered_after_its_end_marker(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent, max_queued_turns=0) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)
        sid = welcome_session(welcome)
        v2.send(CHAT_TEXT, "!block one")
        await agent.wait_blocked(1)
        v2.send(CHAT_TEXT, "HEARTBEAT")
        v2.send(HISTORY_REQUEST)
        v2.send(SESSION_LIST)
        v2.send(CHAT_TEXT, "second")  # the first turn still runs: it must wait, not be refused
        await server_has_read(srv, v2)
        agent.release()
        thoughts, text, _ = await v2.read_answer()
        assert text == "echo: !block one"
        assert [t["type"] for t in thoughts] == ["stream_start", "thinking", "generating"]
        assert await v2.recv_text() == "HEARTBEAT"
        doc = json.loads(await v2.recv_text())
        assert doc["session_id"] == sid
        assert [m["content"] for m in doc["messages"]] == ["!block one", "echo: !block one"]
        listing = await v2.recv_text()
        assert listing.startswith("Sessions (1):") and f"* {sid}" in listing
        _, text, _ = await v2.read_answer()
        assert text == "echo: second"
        assert v2.only_v2_codes()
        await v2.close()


async def test_a_switch_sent_during_an_answer_applies_after_it(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)
        first = welcome_session(welcome)
        second = await v2.new_session()
        v2.send(CHAT_TEXT, "!block in second")
        await agent.wait_blocked(1)
        v2.send(SESSION_SWITCH, first)
        v2.send(CHAT_TEXT, "in first")
        await server_has_read(srv, v2)
        agent.release()
        _, text, _ = await v2.read_answer()
        assert text == "echo: !block in second"
        assert (await v2.recv_text()).startswith(f"Switched to session {first}")
        _, text, _ = await v2.read_answer()
        assert text == "echo: in first"
        v3 = await V3Client.connect(addr)
        for sid, expected in ((second, ["!block in second", "echo: !block in second"]),
                              (first, ["in first", "echo: in first"])):
            page = await v3.call(HISTORY_REQUEST, session_id=sid)
            assert [m["content"] for m in page["messages"]] == expected
        assert v2.only_v2_codes()
        await v2.close()
        await v3.close()


async def test_a_v3_turn_on_the_same_session_does_not_hold_the_v2_connection(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)
        sid = welcome_session(welcome)
        v3 = await V3Client.connect(addr, session_id=sid)
        r = await v3.call(CHAT_TEXT, text="!block from v3")
        await agent.wait_blocked(1)
        v2.send(CHAT_TEXT, "HEARTBEAT")  # not the v2 connection's turn: answered at once
        assert await v2.recv_text() == "HEARTBEAT"
        agent.release()
        await v3.turn_events(r["turn_id"])
        assert v2.only_v2_codes()
        await v2.close()
        await v3.close()


async def test_shutdown_during_an_answer_ends_it_before_saying_so(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent) as (srv, addr):
        v2, _ = await V2Client.connect(addr)
        v2.send(CHAT_TEXT, "!block until shutdown")
        await agent.wait_blocked(1)
        v2.send(CHAT_TEXT, "HEARTBEAT")  # waits behind the turn; the server stops first
        await server_has_read(srv, v2)
        await srv.stop()
        _, text, _ = await v2.read_answer()
        assert "echo: !block until shutdown".startswith(text) and text
        last = await v2.recv_text()
        if last == "HEARTBEAT":  # answered if the worker ran between the turn's end and the close
            last = await v2.recv_text()
        assert last == "Server is shutting down."
        assert await v2.expect_eof() == b""
        assert v2.only_v2_codes()
