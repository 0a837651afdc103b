"""``max_queued_turns`` and ``queued`` on a node that does not run the session's turn (issue 17): the
turn running on another node is the lane's running one, so the node accepts at most
``max_queued_turns`` turns waiting behind it and counts it in ``queued``. The limits are per node
(docs/cluster.md, "Limits and open points")."""
from __future__ import annotations

import asyncio

import pytest

from protocol import MsgType as T
from testkit.echo_agent import EchoAgent
from testkit.server import ReplyError, answer_text, poll

from cluster.conftest import clients_of_one_session, node
from cluster.test_cluster import _lock_waiters


async def test_a_node_queues_at_most_max_queued_turns_behind_a_turn_running_on_another(tmp_path, pg_url):
    agent_a = EchoAgent()
    async with node(tmp_path, pg_url, "a", agent_a, max_queued_turns=2) as a, \
            node(tmp_path, pg_url, "b", max_queued_turns=2) as b:
        async with clients_of_one_session(a, b) as (ca, cb, sid):
            try:
                r1 = await ca.call(T.CHAT_TEXT, text="!block running on a")
                await agent_a.wait_blocked()
                await cb.wait_type(T.TURN_START, timeout=30, turn_id=r1["turn_id"])   # node B knows it runs on A
                r2 = await cb.call(T.CHAT_TEXT, text="first on b")
                assert r2["queued"] == 1                        # behind the turn running on node A
                r3 = await cb.call(T.CHAT_TEXT, text="second on b")
                assert r3["queued"] == 2                        # and behind the first one waiting on B
                with pytest.raises(ReplyError) as err:          # a third one would be over the limit
                    await cb.call(T.CHAT_TEXT, text="one too many")
                assert err.value.code == "QUEUE_FULL" and "max_queued_turns" in err.value.body["message"]
                agent_a.release()
                assert answer_text(await ca.turn_events(r1["turn_id"], timeout=30)) == "echo: !block running on a"
                for r in (r2, r3):
                    await cb.turn_events(r["turn_id"], timeout=30)
                page = await cb.call(T.HISTORY_REQUEST, limit=50)
                assert [m["content"] for m in page["messages"]] == [
                    "!block running on a", "echo: !block running on a", "first on b", "echo: first on b",
                    "second on b", "echo: second on b"]
            finally:
                agent_a.release()


async def test_with_no_queue_a_node_refuses_a_turn_behind_one_running_on_another(tmp_path, pg_url):
    agent_a = EchoAgent()
    async with node(tmp_path, pg_url, "a", agent_a, max_queued_turns=0) as a, \
            node(tmp_path, pg_url, "b", max_queued_turns=0) as b:
        async with clients_of_one_session(a, b) as (ca, cb, sid):
            try:
                r1 = await ca.call(T.CHAT_TEXT, text="!block running on a")
                await agent_a.wait_blocked()
                await cb.wait_type(T.TURN_START, timeout=30, turn_id=r1["turn_id"])   # node B knows it runs on A
                with pytest.raises(ReplyError) as err:
                    await cb.call(T.CHAT_TEXT, text="no room")
                assert err.value.code == "QUEUE_FULL"
                agent_a.release()
                await ca.turn_events(r1["turn_id"], timeout=30)
                page = await cb.call(T.HISTORY_REQUEST, limit=50)
                assert [m["content"] for m in page["messages"]] == ["!block running on a", "echo: !block running on a"]
                await poll(lambda: sid not in a.services.runner.lanes, 30, "node A letting go of the session")
                r2 = await cb.call(T.CHAT_TEXT, text="now there is room")      # the session is idle again
                assert r2["queued"] == 0
                assert answer_text(await cb.turn_events(r2["turn_id"], timeout=30)) == "echo: now there is room"
            finally:
                agent_a.release()


async def test_turns_waiting_on_one_node_get_the_session_in_the_order_they_were_sent(tmp_path, pg_url):
    """Each waiting turn has a connection of its own in PostgreSQL's queue, and those can arrive there
    out of order: the lock granted to the second one's connection goes to the first turn (it is the
    one the lane runs next), instead of both waiting for each other forever."""
    agent_a = EchoAgent()
    async with node(tmp_path, pg_url, "a", agent_a) as a, node(tmp_path, pg_url, "b") as b:
        async with clients_of_one_session(a, b) as (ca, cb, sid):
            holder = b.services.cluster.holder
            wait_lock, first_may_go = holder.wait_lock, asyncio.Event()
            calls = 0

            async def second_connection_first(key: int):
                nonlocal calls
                calls += 1
                if calls == 1:              # the first turn's connection reaches PostgreSQL last
                    await first_may_go.wait()
                return await wait_lock(key)
            holder.wait_lock = second_connection_first
            try:
                r1 = await ca.call(T.CHAT_TEXT, text="!block running on a")
                await agent_a.wait_blocked()
                await cb.wait_type(T.TURN_START, timeout=30, turn_id=r1["turn_id"])
                r2 = await cb.call(T.CHAT_TEXT, text="first on b")
                r3 = await cb.call(T.CHAT_TEXT, text="second on b")
                await poll(lambda: _lock_waiters(b, sid, 1), timeout=30)       # the second turn's
                first_may_go.set()
                await poll(lambda: _lock_waiters(b, sid, 2), timeout=30)       # then the first turn's
                agent_a.release()
                for r, text in ((r2, "first on b"), (r3, "second on b")):
                    assert answer_text(await cb.turn_events(r["turn_id"], timeout=30)) == "echo: " + text
                page = await cb.call(T.HISTORY_REQUEST, limit=50)
                assert [m["content"] for m in page["messages"]][2:] == [
                    "first on b", "echo: first on b", "second on b", "echo: second on b"]
                assert not b.services.cluster.turn_lock.claims           # nothing left waiting
            finally:
                first_may_go.set()
                agent_a.release()
