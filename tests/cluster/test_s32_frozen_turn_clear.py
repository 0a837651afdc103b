"""A delete or clear whose session's turn runs on another node that does not stop in time (frozen:
here, its node does not act on the cancel request until the test lets it) is refused QUEUE_FULL,
rather than going ahead and letting that turn's answer land in the cleared or deleted session after
it (docs/cluster.md, "Stopping a turn that runs on another node")."""
from __future__ import annotations

import pytest

import server.sessions as sessions_module
from protocol import MsgType as T
from testkit.echo_agent import EchoAgent
from testkit.server import ReplyError

from cluster.conftest import clients_of_one_session, node


@pytest.mark.parametrize("action", ["clear", "delete"])
async def test_clear_or_delete_is_refused_while_a_frozen_nodes_turn_holds_the_session(
        tmp_path, pg_url, monkeypatch, action):
    monkeypatch.setattr(sessions_module, "TURN_STOP_WAIT_S", 0.5)     # (10 s by default)
    quick = {"cluster": {"ending_turn_wait_ms": 200}}
    agent_a = EchoAgent()
    async with node(tmp_path, pg_url, "a", agent_a, sections=quick) as a, \
            node(tmp_path, pg_url, "b", sections=quick) as b:
        # node A "frozen": the cancel requests of other nodes reach it only when the test says so
        remote_cancel = a.services.cluster.remote_cancel
        real_on_control = remote_cancel.on_control
        held: list[tuple[str, list]] = []
        monkeypatch.setattr(remote_cancel, "on_control", lambda n, item: held.append((n, item)))
        async with clients_of_one_session(a, b) as (ca, cb, sid):
            try:
                if action == "delete":
                    keep = (await cb.call(T.SESSION_NEW))["session"]["session_id"]
                    await cb.call(T.SESSION_SWITCH, session_id=sid)
                r = await ca.call(T.CHAT_TEXT, text="!block half an answer")
                await agent_a.wait_blocked()
                await cb.wait_type(T.TURN_START, timeout=30, turn_id=r["turn_id"])   # B knows it runs on A
                with pytest.raises(ReplyError) as refused:
                    if action == "clear":
                        await cb.call(T.CLEAR_REQUEST, session_id=sid)
                    else:
                        await cb.call(T.SESSION_DELETE, session_id=sid)
                assert refused.value.code == "QUEUE_FULL"
                assert "did not stop; try again" in refused.value.body["message"]
                assert held and held[0][1][0] == "c"        # it had asked node A to cancel the turn
                rec = await b.store.get(sid)
                assert not rec.deleted and [m.content for m in await b.store.messages(sid, after_id=-1)] == [
                    "!block half an answer"]                  # nothing was cleared or deleted
                # node A comes back: it cancels its turn and stores the partial answer, then lets go
                monkeypatch.setattr(remote_cancel, "on_control", real_on_control)
                for n, item in held:
                    real_on_control(n, item)
                end = (await cb.turn_events(r["turn_id"], timeout=30))[-1]
                assert end.type == T.TURN_END and end.body["finish_reason"] == "cancelled"
                stored = await b.store.messages(sid, after_id=-1)
                assert [(m.role, m.metadata.get("partial")) for m in stored] == [("user", None), ("assistant", True)]
                # asked again, the clear / delete goes ahead, and nothing lands after it
                if action == "clear":
                    await cb.call(T.CLEAR_REQUEST, session_id=sid)
                    assert await b.store.messages(sid, after_id=-1) == []
                    assert (await b.store.get(sid)).message_count == 0
                else:
                    reply = await cb.call(T.SESSION_DELETE, session_id=sid)
                    assert reply["current"]["session_id"] == keep
                    assert (await b.store.get(sid)).deleted
                # node A's turn is over: the session's lock is free (a regenerate-style claim gets it)
                hold = await b.services.cluster.turn_lock.try_hold(sid)
                assert hold is not None
                await hold.release()
                if action == "clear":
                    assert await a.store.messages(sid, after_id=-1) == []
            finally:
                agent_a.release()
