"""Stopping a turn that runs on another node (issue 17, server.cluster_cancel): CHAT_CANCEL sent to
node A cancels the turn running, or withdraws the turn waiting, on node B; deleting or clearing a
session on node A cancels its turn on node B first (its partial answer stored before the delete or
clear), and node B's clients of a session deleted on node A are moved, as node A's are."""
from __future__ import annotations

import time

import pytest

from protocol import MsgType as T
from testkit.echo_agent import EchoAgent
from testkit.server import ReplyError, answer_text, poll

from cluster.conftest import clients_of_one_session, node
from cluster.test_cluster import _lock_waiters


@pytest.mark.parametrize("by", ["session", "turn_id"])
async def test_chat_cancel_on_one_node_stops_the_turn_running_on_the_other(tmp_path, pg_url, by):
    agent_b = EchoAgent()
    async with node(tmp_path, pg_url, "a") as a, node(tmp_path, pg_url, "b", agent_b) as b:
        async with clients_of_one_session(b, a) as (cb, ca, sid):
            try:
                r = await cb.call(T.CHAT_TEXT, text="!block stop me")
                await agent_b.wait_blocked()
                await ca.wait_type(T.TURN_START, timeout=30)           # node A knows the turn runs on B
                body = {"session_id": sid} if by == "session" else {"turn_id": r["turn_id"]}
                reply = await ca.call(T.CHAT_CANCEL, **body)
                assert (reply["turn_id"], reply["cancelled"], reply["withdrawn"]) == (r["turn_id"], True, False)
                for c in (cb, ca):
                    end = (await c.turn_events(r["turn_id"], timeout=30))[-1]
                    assert end.type == T.TURN_END and end.body["finish_reason"] == "cancelled"
                    assert end.body["message"]["metadata"]["partial"] is True
                page = await ca.call(T.HISTORY_REQUEST)
                assert [(m["role"], m["metadata"].get("finish_reason")) for m in page["messages"]] == [
                    ("user", None), ("assistant", "cancelled")]
                # nothing runs anywhere now: answered at once, without waiting for other nodes
                started = time.monotonic()
                with pytest.raises(ReplyError) as err:
                    await ca.call(T.CHAT_CANCEL, session_id=sid)
                assert err.value.code == "NO_ACTIVE_TURN" and time.monotonic() - started < 1.0
                # and a turn id no node has: NO_ACTIVE_TURN once the nodes had their time to answer
                with pytest.raises(ReplyError) as err:
                    await ca.call(T.CHAT_CANCEL, turn_id="t-nobody-has-this")
                assert err.value.code == "NO_ACTIVE_TURN"
            finally:
                agent_b.release()


async def test_chat_cancel_on_one_node_withdraws_a_turn_queued_on_the_other(tmp_path, pg_url):
    agent_a = EchoAgent()
    async with node(tmp_path, pg_url, "a", agent_a) as a, node(tmp_path, pg_url, "b") as b:
        async with clients_of_one_session(a, b) as (ca, cb, sid):
            try:
                r1 = await ca.call(T.CHAT_TEXT, text="!block first")
                await agent_a.wait_blocked()
                r2 = await cb.call(T.CHAT_TEXT, text="queued on b")
                await poll(lambda: _lock_waiters(b, sid, 1), timeout=30)
                reply = await ca.call(T.CHAT_CANCEL, turn_id=r2["turn_id"])     # asked of node A
                assert (reply["turn_id"], reply["cancelled"], reply["withdrawn"]) == (r2["turn_id"], True, True)
                end = (await cb.turn_events(r2["turn_id"], timeout=30))[-1]
                assert end.body["withdrawn"] is True and end.body["message"] is None
                await poll(lambda: _lock_waiters(b, sid, 0), timeout=30)
                agent_a.release()
                assert answer_text(await ca.turn_events(r1["turn_id"], timeout=30)) == "echo: !block first"
                page = await ca.call(T.HISTORY_REQUEST)
                assert [m["content"] for m in page["messages"]] == ["!block first", "echo: !block first"]
            finally:
                agent_a.release()


@pytest.mark.parametrize("action", ["delete", "clear"])
async def test_delete_or_clear_on_one_node_cancels_the_turn_on_the_other(tmp_path, pg_url, action):
    agent_b = EchoAgent()
    async with node(tmp_path, pg_url, "a") as a, node(tmp_path, pg_url, "b", agent_b) as b:
        async with clients_of_one_session(b, a) as (cb, ca, sid):
            try:
                r = await cb.call(T.CHAT_TEXT, text="!block half an answer")
                await agent_b.wait_blocked()
                await ca.wait_type(T.TURN_START, timeout=30)
                if action == "delete":
                    # (another session of the user, where the deleted one's clients move)
                    keep = (await ca.call(T.SESSION_NEW))["session"]["session_id"]
                    reply = await ca.call(T.SESSION_DELETE, session_id=sid)
                    assert reply["current"]["session_id"] == keep
                else:
                    await ca.call(T.CLEAR_REQUEST, session_id=sid)
                # the turn on node B was cancelled, and its partial answer stored, before the delete /
                # clear was answered (cleared: the partial answer is hidden with its question)
                stored = await a.store.messages(sid, after_id=-1)
                if action == "delete":
                    assert [(m.role, m.metadata.get("cancel_reason")) for m in stored] == [
                        ("user", None), ("assistant", "deleted")]
                end = (await cb.turn_events(r["turn_id"], timeout=30))[-1]
                assert end.type == T.TURN_END and end.body["finish_reason"] == "cancelled"
                assert end.body["message"]["metadata"]["cancel_reason"] == (
                    "deleted" if action == "delete" else "cleared")
                if action == "clear":
                    # the partial answer was stored before the clear (hidden with it), not after it
                    assert stored == [] and await a.store.messages(sid, after_id=-1) == []
                    rec = await a.store.get(sid)
                    assert rec.message_count == 0
                else:
                    assert (await a.store.get(sid)).deleted
                    # node B's client of the deleted session was moved to the user's newest session
                    ev = await cb.wait_type(T.SESSION_EVENT, kind="deleted", timeout=30)
                    assert ev.body["session"]["session_id"] == sid

                    async def moved() -> bool:
                        try:
                            return (await cb.call(T.HISTORY_REQUEST))["session_id"] == keep
                        except ReplyError as exc:              # not moved yet: its session is gone
                            assert exc.code == "NOT_FOUND"
                            return False
                    await poll(moved, timeout=30)
            finally:
                agent_b.release()
