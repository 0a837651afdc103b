"""A turn's TURN_END lost for a node (its listener was reconnecting, or the sending node could not send
it: a PostgreSQL restart) does not leave the session looking running there forever: once the relay
reports the possible loss, the node checks the other nodes' turns it believes running against
PostgreSQL and ends the ones that are over (docs/cluster.md, "Events between nodes")."""
from __future__ import annotations

import asyncio
import time

import pytest

from protocol import MsgType as T
from protocol.server_events import TurnEnd
from server.cluster_relay import CHANNEL
from storage.errors import StorageIOError
from testkit.echo_agent import EchoAgent
from testkit.server import ReplyError, poll

from cluster.conftest import clients_of_one_session, node


async def _over_on(b, cb, sid: str, turn_id: str) -> None:
    """Node B saw the turn end: not running any more, and its client got the turn's end once."""
    await poll(lambda: sid not in b.services.cluster.remote_turns, timeout=30, what="the lost turn dropped")
    events = await cb.turn_events(turn_id, timeout=30)
    end = events[-1]
    assert end.type == T.TURN_END and end.body["message"]["content"] == "echo: !block lost end"
    assert [m.type for m in events].count(T.TURN_END) == 1
    assert (await cb.call(T.SESSION_INFO, session_id=sid))["session"]["running"] is False
    started = time.monotonic()
    with pytest.raises(ReplyError) as err:          # answered at once: no turn is known running elsewhere
        await cb.call(T.CHAT_CANCEL, session_id=sid)
    assert err.value.code == "NO_ACTIVE_TURN" and time.monotonic() - started < 1.0
    assert not [m for m in cb.inbox if m.type in (T.TURN_END, T.TURN_ERROR)]    # one end of the turn only


async def test_a_turn_end_missed_while_the_listener_reconnected_is_found_in_postgres(tmp_path, pg_url):
    agent_a = EchoAgent()
    async with node(tmp_path, pg_url, "a", agent_a) as a, node(tmp_path, pg_url, "b") as b:
        listener = b.services.cluster.relay.listener
        handle = listener.on_event
        lost = asyncio.Event()
        async with clients_of_one_session(a, b) as (ca, cb, sid):
            try:
                r = await ca.call(T.CHAT_TEXT, text="!block lost end")
                tid = r["turn_id"]
                await agent_a.wait_blocked()
                await cb.wait_type(T.TURN_START, timeout=30, turn_id=tid)

                async def lossy(channel, payload):     # the notification with its TURN_END never arrives
                    if channel == CHANNEL and isinstance(payload, dict) and any(
                            item[0] == "e" and item[2] == tid for item in payload.get("e", ())):
                        lost.set()
                        return
                    await handle(channel, payload)
                listener.on_event = lossy
                agent_a.release()
                await ca.turn_events(tid, timeout=30)
                await asyncio.wait_for(lost.wait(), 30)
                listener.on_event = handle
                # (before the fix it stayed so until another turn ran in the session)
                assert (await cb.call(T.SESSION_INFO, session_id=sid))["session"]["running"] is True
                # B's listener connection drops (as in a PostgreSQL restart) and reconnects: a gap
                pid = listener._con.get_server_pid()
                await a.store.link.run(lambda con: con.execute("SELECT pg_terminate_backend($1)", pid), write=False)
                await _over_on(b, cb, sid, tid)
                assert listener.connects >= 2
            finally:
                listener.on_event = handle
                agent_a.release()


async def test_a_turn_end_its_node_could_not_send_is_found_in_postgres(tmp_path, pg_url):
    agent_a = EchoAgent()
    async with node(tmp_path, pg_url, "a", agent_a) as a, node(tmp_path, pg_url, "b") as b:
        relay = a.services.cluster.relay
        relay.resend_s = 0.05
        send = relay._send
        failed = asyncio.Event()
        async with clients_of_one_session(a, b) as (ca, cb, sid):
            r = await ca.call(T.CHAT_TEXT, text="!block lost end")
            tid = r["turn_id"]

            async def failing(items):                # PostgreSQL unreachable just then, for this batch
                if not failed.is_set() and any(item[0] == "t" and type(item[2]) is TurnEnd
                                               and item[2].turn_id == tid for item in items):
                    failed.set()
                    raise StorageIOError("PostgreSQL could not be reached (test)")
                await send(items)
            relay._send = failing
            try:
                await agent_a.wait_blocked()
                await cb.wait_type(T.TURN_START, timeout=30, turn_id=tid)
                agent_a.release()
                await ca.turn_events(tid, timeout=30)
                await asyncio.wait_for(failed.wait(), 30)
                await _over_on(b, cb, sid, tid)
                assert not relay.lost
            finally:
                relay._send = send
                agent_a.release()


async def test_a_turn_still_running_is_kept_after_a_gap(tmp_path, pg_url):
    agent_a = EchoAgent()
    async with node(tmp_path, pg_url, "a", agent_a) as a, node(tmp_path, pg_url, "b") as b:
        async with clients_of_one_session(a, b) as (ca, cb, sid):
            try:
                r = await ca.call(T.CHAT_TEXT, text="!block still running")
                await agent_a.wait_blocked()
                await cb.wait_type(T.TURN_START, timeout=30, turn_id=r["turn_id"])
                assert await b.services.cluster.recheck_remote_turns() == 0
                assert sid in b.services.cluster.remote_turns
                assert (await cb.call(T.SESSION_INFO, session_id=sid))["session"]["running"] is True
                agent_a.release()
                await cb.turn_events(r["turn_id"], timeout=30)
                await poll(lambda: sid not in b.services.cluster.remote_turns, timeout=30)
            finally:
                agent_a.release()


async def test_a_turn_that_ended_without_an_answer_is_dropped_after_the_grace(tmp_path, pg_url):
    """Nothing stored after the turn's user message (its answer could not be stored), and its node is
    connected without holding the session's lock: over, once that is still so after
    ``reconnect_grace_ms``. A node with no connection is left to the dead-node watch."""
    async with node(tmp_path, pg_url, "a") as a, node(tmp_path, pg_url, "b") as b:
        cluster = b.services.cluster
        cluster.reconnect_grace_s = 0.2
        user = (await a.store.create("alice")).session_id
        unanswered = await a.store.append(user, "user", "its answer was not stored")
        gone = (await a.store.create("alice")).session_id
        orphan = await a.store.append(gone, "user", "its node has no connection")
        cluster.remote_turns[user] = (a.services.cluster.node_id, "t_unanswered", unanswered.id)
        cluster.remote_turns[gone] = ("0123456789ab", "t_nodeless", orphan.id)
        try:
            assert await cluster.recheck_remote_turns() == 1
            assert user not in cluster.remote_turns and gone in cluster.remote_turns
        finally:
            cluster.remote_turns.pop(gone, None)
