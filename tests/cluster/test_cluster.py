"""Two server nodes on one PostgreSQL database (issue 17, item 2): a client of one node follows
the turns that run on the other, live and in order; turns of one session run one at a time across
nodes, in arrival order."""
from __future__ import annotations

import asyncio

import asyncpg

from protocol import MsgType as T
from storage.pg.lock_holder import key_of
from testkit.server import answer_text, poll

from cluster.conftest import clients_of_one_session, node


def _strip(body: dict) -> dict:
    return {k: v for k, v in body.items() if k != "re"}


async def test_a_client_of_one_node_follows_a_turn_running_on_the_other(two_nodes):
    a, b = two_nodes
    async with clients_of_one_session(b, a) as (writer, watcher, sid):
        # a tool call whose arguments are too large for a notification (spilled to the table),
        # then an answer in deltas
        text = "!tool " + "big argument " * 800
        r = await writer.call(T.CHAT_TEXT, text=text)
        mine = await writer.turn_events(r["turn_id"], timeout=30)
        seen = await watcher.turn_events(r["turn_id"], timeout=30)
        kinds = [m.type for m in seen]
        assert kinds[0] == T.TURN_START and kinds[-1] == T.TURN_END
        assert [k for k in kinds if k != T.ANSWER_DELTA] == [k for k in (m.type for m in mine)
                                                             if k != T.ANSWER_DELTA]
        assert answer_text(seen) == answer_text(mine) == "echo: " + text   # contiguous offsets
        for kind in (T.TURN_START, T.TOOL_CALL, T.TOOL_RESULT, T.TURN_END):
            assert [_strip(m.body) for m in seen if m.type == kind] == \
                [_strip(m.body) for m in mine if m.type == kind]
        start = next(m for m in seen if m.type == T.TURN_START).body
        assert start["user_message"]["content"] == text and start["user_message"]["id"] == 1
        end = seen[-1].body
        assert end["message"]["id"] == 2 and end["message"]["content"] == "echo: " + text
        assert [_strip(m.body) for m in seen if m.type == T.TOOL_CALL][0]["call"]["arguments"]["q"] == text[5:].strip()
        # the session list update of node B's turn reaches node A's client too
        ev = await watcher.wait_type(T.SESSION_EVENT, timeout=30)
        assert ev.body["session"]["session_id"] == sid

        # and the other way round, several turns: every event in order
        for i in range(5):
            r = await watcher.call(T.CHAT_TEXT, text=f"from a {i}")
            seen = await writer.turn_events(r["turn_id"], timeout=30)
            assert seen[0].type == T.TURN_START and seen[-1].type == T.TURN_END
            assert answer_text(seen) == f"echo: from a {i}"
            assert seen[-1].body["message"]["content"] == f"echo: from a {i}"
        page = await writer.call(T.HISTORY_REQUEST, limit=50)
        assert len(page["messages"]) == 12


async def test_turns_of_one_session_from_two_nodes_run_one_at_a_time_in_arrival_order(tmp_path, pg_url):
    from testkit.echo_agent import EchoAgent
    agent_a, agent_b = EchoAgent(), EchoAgent()
    async with node(tmp_path, pg_url, "a", agent_a) as a, node(tmp_path, pg_url, "b", agent_b) as b:
        async with clients_of_one_session(a, b) as (ca, cb, sid):
            r1 = await ca.call(T.CHAT_TEXT, text="!block first")        # runs on A, held there
            await agent_a.wait_blocked()
            r2 = await cb.call(T.CHAT_TEXT, text="second")              # B: waits for A's turn
            assert r2["queued"] >= 1 and r2["user_message"]["id"] is None
            await poll(lambda: _lock_waiters(b, sid, 1), timeout=30)          # its claim is queued first
            r3 = await ca.call(T.CHAT_TEXT, text="third")               # A again, after B's
            assert r3["queued"] >= 1
            await poll(lambda: _lock_waiters(a, sid, 2), timeout=30)
            r4 = await cb.call(T.CHAT_TEXT, text="fourth")
            await poll(lambda: _lock_waiters(a, sid, 3), timeout=30)
            assert agent_b.started == 0                                 # nothing ran beside "first"
            agent_a.release()
            ids = [r["turn_id"] for r in (r1, r2, r3, r4)]
            await poll(lambda: sum(m.type == T.TURN_END and m.body["turn_id"] in ids for m in ca.inbox) == 4,
                       timeout=30)
            # one at a time: a client of node A saw each turn end before the next one started
            order = [(m.type, m.body["turn_id"]) for m in ca.inbox if m.type in (T.TURN_START, T.TURN_END)]
            assert order == [(t, i) for i in ids for t in (T.TURN_START, T.TURN_END)]
            for i, text in zip(ids, ("!block first", "second", "third", "fourth")):
                assert answer_text(await ca.turn_events(i)) == "echo: " + text
            page = await ca.call(T.HISTORY_REQUEST, limit=50)
            assert [(m["role"], m["content"]) for m in page["messages"]] == [
                ("user", "!block first"), ("assistant", "echo: !block first"),
                ("user", "second"), ("assistant", "echo: second"),
                ("user", "third"), ("assistant", "echo: third"),
                ("user", "fourth"), ("assistant", "echo: fourth")]
            assert agent_a.started == 2 and agent_b.started == 2


async def test_a_node_taking_a_session_over_first_hears_what_the_last_holder_sent(tmp_path, pg_url):
    """The lock can be granted before the notifications the other node sent before letting it go
    have been handled here (two connections, two sockets). The node taking the session over waits
    for its own barrier notification to come back through the listener before its turn starts, so
    its clients still see the other node's turn end first. Here node A's listener is held back on
    purpose until A has the lock and waits on its barrier."""
    from testkit.echo_agent import EchoAgent
    agent_a = EchoAgent()
    slow = {"cluster": {"remote_end_wait_ms": 30_000}}
    async with node(tmp_path, pg_url, "a", agent_a, sections=slow) as a, node(tmp_path, pg_url, "b") as b:
        relay = a.services.cluster.relay
        listener = relay.listener
        gate = asyncio.Event()
        handle = listener.on_event

        async def held_back(channel, payload):
            if channel != relay.sync_channel:          # other nodes' events wait at the gate
                await gate.wait()
            await handle(channel, payload)
        async with clients_of_one_session(a, b) as (ca, cb, sid):
            try:
                r1 = await ca.call(T.CHAT_TEXT, text="!block first")
                await agent_a.wait_blocked()
                r2 = await cb.call(T.CHAT_TEXT, text="second")              # B queues behind A's turn
                await poll(lambda: _lock_waiters(b, sid, 1), timeout=30)
                r3 = await ca.call(T.CHAT_TEXT, text="third")               # A queues behind B's
                await poll(lambda: _lock_waiters(a, sid, 2), timeout=30)
                listener.on_event = held_back
                agent_a.release()
                # B runs "second" and lets go; A gets the lock and waits for its barrier, which is queued
                # behind B's events at the gate
                await poll(lambda: _lock_waiters(a, sid, 0), timeout=30)
                await poll(lambda: bool(relay._syncs), timeout=30)
                assert agent_a.started == 1                                 # "third" has not started
                gate.set()
                ids = [r["turn_id"] for r in (r1, r2, r3)]
                await poll(lambda: sum(m.type == T.TURN_END and m.body["turn_id"] in ids for m in ca.inbox) == 3,
                           timeout=30)
                order = [(m.type, m.body["turn_id"]) for m in ca.inbox if m.type in (T.TURN_START, T.TURN_END)]
                assert order == [(t, i) for i in ids for t in (T.TURN_START, T.TURN_END)]
                assert agent_a.started == 2
            finally:
                listener.on_event = handle


async def _lock_waiters(srv, session_id: str, n: int) -> bool:
    """Whether ``n`` turns wait in PostgreSQL's queue for the session's lock."""
    count = await srv.store.link.run(lambda con: con.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
        "AND ((classid::bigint << 32) | objid::bigint) = $1", key_of("session", session_id)), write=False)
    return count == n


async def test_a_turn_waiting_for_another_node_can_be_withdrawn(tmp_path, pg_url):
    from testkit.echo_agent import EchoAgent
    agent_a = EchoAgent()
    async with node(tmp_path, pg_url, "a", agent_a) as a, node(tmp_path, pg_url, "b") as b:
        async with clients_of_one_session(a, b) as (ca, cb, sid):
            r1 = await ca.call(T.CHAT_TEXT, text="!block first")
            await agent_a.wait_blocked()
            r2 = await cb.call(T.CHAT_TEXT, text="never mind")
            await poll(lambda: _lock_waiters(b, sid, 1), timeout=30)
            cancelled = await cb.call(T.CHAT_CANCEL, turn_id=r2["turn_id"])
            assert cancelled["cancelled"] is True
            end = (await cb.turn_events(r2["turn_id"], timeout=30))[-1]
            assert end.type == T.TURN_END and end.body["withdrawn"] is True and end.body["message"] is None
            await poll(lambda: _lock_waiters(b, sid, 0), timeout=30)   # its claim left the queue
            agent_a.release()
            assert answer_text(await ca.turn_events(r1["turn_id"], timeout=30)) == "echo: !block first"
            await poll(lambda: not a.runner.lanes, timeout=30)     # node A let the session go
            r3 = await cb.call(T.CHAT_TEXT, text="now")             # node B takes the session at once
            assert r3["queued"] == 0
            assert answer_text(await cb.turn_events(r3["turn_id"], timeout=30)) == "echo: now"
            page = await cb.call(T.HISTORY_REQUEST, limit=50)
            assert [m["content"] for m in page["messages"]] == ["!block first", "echo: !block first",
                                                                 "now", "echo: now"]
    # stopped nodes leave no backend behind (lock waiters and node watchers included)
    con = await asyncpg.connect(pg_url)
    try:
        async def no_node_backends() -> bool:
            return await con.fetchval("SELECT count(*) FROM pg_stat_activity "
                                      "WHERE application_name LIKE 'nplt-node:%'") == 0
        await poll(no_node_backends, timeout=30)
    finally:
        await con.close()


async def test_the_callers_waiting_for_a_barrier_together_share_one(two_nodes):
    """``Relay.sync`` (a node taking a session's lock with other nodes about): the callers that
    wait while a barrier is being sent share the next one, and each learns it came back."""
    a, b = two_nodes
    relay = a.services.cluster.relay
    await poll(lambda: relay.peers, timeout=30)
    before = relay.barriers
    assert await asyncio.gather(*(relay.sync(30) for _ in range(20))) == [True] * 20
    assert relay.barriers == before + 1                 # 20 callers, 1 notification
    first = asyncio.ensure_future(relay.sync(30))
    await poll(lambda: relay.barriers == before + 2, timeout=30)    # taken by the sender
    later = [asyncio.ensure_future(relay.sync(30)) for _ in range(5)]
    assert await asyncio.gather(first, *later) == [True] * 6
    assert relay.barriers == before + 3                 # the 5 that came after it: one more
    assert not relay._syncs and relay._next_barrier is None
