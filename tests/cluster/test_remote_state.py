"""A SESSION_SWITCH or a reattaching HELLO on node A to a session whose turn runs on node B (issue 17,
server.cluster_state):
the reply carries that turn's state from node B (its user message and the answer so far), and the
events that follow complete it exactly (deltas the state already holds are dropped by their
offsets, as the TUI's ``join_deltas`` does). A node that does not answer costs at most
``remote_state_wait_ms``."""
from __future__ import annotations

import asyncio
import time

from client.tui.state import join_deltas
from protocol import MsgType as T
from protocol.server_events import AnswerDelta
from testkit.echo_agent import EchoAgent
from testkit.server import V3Client, poll

from cluster.conftest import node

TEXT = "!block tell me about the quarterly disk usage of every database host in the fleet"
FULL = "echo: " + TEXT


def assert_completes(state: dict, events: list, reply_seq: int, full: str) -> None:
    """The turn's events all came after the reply, and with the state they give the whole answer."""
    assert all(m.seq > reply_seq for m in events), [(m.type, m.seq) for m in events]
    deltas = [AnswerDelta(state["session_id"], state["turn_id"], m.body["text"], m.body["offset"])
              for m in events if m.type == T.ANSWER_DELTA]
    assert state["content"] + join_deltas(len(state["content"]), deltas) == full
    assert events[-1].type == T.TURN_END and events[-1].body["message"]["content"] == full


async def test_switching_to_a_session_whose_turn_runs_elsewhere_shows_it_so_far(tmp_path, pg_url):
    agent_b = EchoAgent(chunks=8)
    async with node(tmp_path, pg_url, "a", sections={"cluster": {"remote_state_wait_ms": 5000}}) as a, \
            node(tmp_path, pg_url, "b", agent_b) as b:
        cb = await V3Client.connect((b.host, b.port))
        ca = await V3Client.connect((a.host, a.port))
        try:
            sid = cb.session_id
            await ca.call(T.SESSION_NEW, title="elsewhere")                 # ca is in another session
            r = await cb.call(T.CHAT_TEXT, text=TEXT)
            await agent_b.wait_blocked()                                    # half the answer streamed
            await poll(lambda: sid in a.services.cluster.remote_turns, timeout=30)
            # node B publishes an event to the user before it answers node A's request for the
            # state: it reaches node A while the SESSION_SWITCH waits, and must follow its reply
            cluster_b = b.services.cluster
            tasks = []

            async def event_then_answer(node_id: str, item: list) -> None:
                rec = await b.store.rename(sid, "renamed while asked")
                await b.services.sessions.publish_event("renamed", rec)
                cluster_b.remote_state.on_control(node_id, item)

            def on_control(node_id: str, item: list) -> None:
                if item[0] == "g":
                    tasks.append(asyncio.get_running_loop().create_task(event_then_answer(node_id, item)))
                else:
                    cluster_b._on_control(node_id, item)
            cluster_b.relay.on_control = on_control
            answer = await ca.request(T.SESSION_SWITCH, session_id=sid)
            state = answer.body["running_turn"]
            renamed = await ca.wait_for(lambda m: m.type == T.SESSION_EVENT and m.body["kind"] == "renamed")
            assert renamed.seq > answer.seq                     # held until the reply had gone out
            assert state is not None and state["turn_id"] == r["turn_id"] and state["session_id"] == sid
            assert state["user_message"]["content"] == TEXT
            full = FULL
            assert state["content"] and full.startswith(state["content"]) and state["content"] != full
            agent_b.release()
            events = await ca.turn_events(r["turn_id"], timeout=30)
            assert_completes(state, events, answer.seq, full)
            # an idle session: no running turn, and no waiting for other nodes
            started = time.monotonic()
            reply = await ca.call(T.SESSION_SWITCH, session_id=(await ca.call(T.SESSION_NEW))["session"]["session_id"])
            reply = await ca.call(T.SESSION_SWITCH, session_id=sid)
            assert reply["running_turn"] is None and time.monotonic() - started < 2.0
        finally:
            agent_b.release()
            for c in (ca, cb):
                await c.close()


async def test_a_hello_reattaching_through_another_node_gets_the_turn_so_far(tmp_path, pg_url):
    agent_b = EchoAgent(chunks=8)
    async with node(tmp_path, pg_url, "a") as a, node(tmp_path, pg_url, "b", agent_b) as b:
        cb = await V3Client.connect((b.host, b.port))
        try:
            sid = cb.session_id
            r = await cb.call(T.CHAT_TEXT, text=TEXT)
            await agent_b.wait_blocked()
            await poll(lambda: sid in a.services.cluster.remote_turns, timeout=30)
            ca = await V3Client.connect((a.host, a.port), hello=False)      # a reconnect through node A
            try:
                answer = await ca.request(T.HELLO, proto=3, client="testkit/1", session_id=sid)
                state = answer.body["running_turn"]
                assert answer.body["session_restored"] is True and state is not None
                assert state["turn_id"] == r["turn_id"] and FULL.startswith(state["content"]) and state["content"]
                agent_b.release()
                assert_completes(state, await ca.turn_events(r["turn_id"], timeout=30), answer.seq, FULL)
            finally:
                await ca.close()
        finally:
            agent_b.release()
            await cb.close()


async def test_a_node_that_does_not_answer_costs_at_most_remote_state_wait_ms(tmp_path, pg_url):
    async with node(tmp_path, pg_url, "a", sections={"cluster": {"remote_state_wait_ms": 300}}) as a, \
            node(tmp_path, pg_url, "b"):
        ca = await V3Client.connect((a.host, a.port))
        try:
            sid = ca.session_id or (await ca.call(T.SESSION_NEW))["session"]["session_id"]
            cluster = a.services.cluster
            await poll(lambda: cluster.relay.peers, timeout=30)
            cluster.remote_turns[sid] = ("gone-node", "t-none", 0)          # a turn no node answers for
            started = time.monotonic()
            reply = await ca.call(T.SESSION_SWITCH, session_id=sid)
            waited = time.monotonic() - started
            assert reply["running_turn"] is None and 0.25 <= waited < 5.0
        finally:
            await ca.close()
