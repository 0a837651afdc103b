"""``[storage] pg_max_lock_waiters``: a CHAT_SEND that would need one more connection for a contended
session lock than the node allows is itself refused QUEUE_FULL, and its message is not stored (not
accepted, then failed later as a TURN_ERROR of whichever claim of the node came first)."""
from __future__ import annotations

import pytest

from protocol import MsgType as T
from storage import StorageConfig
from testkit.echo_agent import EchoAgent
from testkit.server import ReplyError, poll

from cluster.conftest import clients_of_one_session, node
from cluster.test_cluster import _lock_waiters


def test_the_setting_is_declared_with_a_safe_default():
    assert StorageConfig().pg_max_lock_waiters == 16
    assert StorageConfig(pg_max_lock_waiters=1).pg_max_lock_waiters == 1
    with pytest.raises(ValueError):
        StorageConfig(pg_max_lock_waiters=0)


async def test_a_chat_send_past_pg_max_lock_waiters_is_refused_queue_full(tmp_path, pg_url):
    agent_a = EchoAgent()
    capped = {"pg_max_lock_waiters": 1}
    async with node(tmp_path, pg_url, "a", agent_a, storage=capped) as a, \
            node(tmp_path, pg_url, "b", storage=capped) as b:
        assert b.services.cluster.holder.max_waiters == 1
        async with clients_of_one_session(a, b) as (ca, cb, sid):
            try:
                r1 = await ca.call(T.CHAT_TEXT, text="!block running on a")
                await agent_a.wait_blocked()
                await cb.wait_type(T.TURN_START, timeout=30, turn_id=r1["turn_id"])
                r2 = await cb.call(T.CHAT_TEXT, text="first on b")
                assert r2["queued"] == 1
                await poll(lambda: _lock_waiters(b, sid, 1), timeout=30)    # its connection waits
                with pytest.raises(ReplyError) as refused:
                    await cb.call(T.CHAT_TEXT, text="one connection too many")
                assert refused.value.code == "QUEUE_FULL"
                assert "pg_max_lock_waiters" in refused.value.body["message"]
                assert await _lock_waiters(b, sid, 1)                         # no second connection
                agent_a.release()
                await ca.turn_events(r1["turn_id"], timeout=30)
                end = (await cb.turn_events(r2["turn_id"], timeout=30))[-1]
                assert end.type == T.TURN_END                                 # the accepted one ran
                page = await cb.call(T.HISTORY_REQUEST, limit=50)
                assert [m["content"] for m in page["messages"]] == [
                    "!block running on a", "echo: !block running on a", "first on b", "echo: first on b"]
                # room again once that turn let go of its connection
                await poll(lambda: b.services.cluster.holder.lock_waiters == 0, timeout=30)
            finally:
                agent_a.release()
