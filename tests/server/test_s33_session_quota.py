"""``[limits] max_sessions_per_user`` (review s33, t19: one connection made 10,000 sessions in 28 s,
and CHAT_TEXT new_session with 32,000-character texts fills the disk): every path that makes a
session (SESSION_NEW, CHAT_TEXT new_session, v2 SESSION_NEW) is refused QUOTA_EXCEEDED past it,
sessions in the trash counting until purged; other users are not affected."""
from __future__ import annotations

import asyncio

import pytest

from protocol import MsgType
from server.config import ServerConfig
from testkit.server import ReplyError, V3Client, running_server
from testkit.v2client import SESSION_NEW as V2_SESSION_NEW
from testkit.v2client import V2Client

T = MsgType
USERS = [("alice", "tok-a"), ("bob", "tok-b")]


async def refused(c: V3Client, msg_type: int, **body) -> ReplyError:
    with pytest.raises(ReplyError) as err:
        await c.call(msg_type, **body)
    assert err.value.code == "QUOTA_EXCEEDED" and err.value.body["fatal"] is False
    return err.value


async def test_sessions_past_the_quota_are_refused_on_every_v3_path(tmp_path):
    async with running_server(tmp_path, users=USERS, max_sessions_per_user=3) as (srv, addr):
        a = await V3Client.connect(addr, token="tok-a")              # session 1 (SESSION_NEW)
        r = await a.call(T.CHAT_TEXT, text="hello")                  # (not empty: never reused)
        await a.turn_events(r["turn_id"])
        two = (await a.call(T.SESSION_NEW, title="two"))["session"]["session_id"]
        await a.call(T.SESSION_NEW, title="three")
        err = await refused(a, T.SESSION_NEW, title="four")
        assert "max_sessions_per_user is 3" in err.body["message"] and "trash" in err.body["message"]
        await refused(a, T.CHAT_TEXT, text="x" * 1000, new_session=True)
        await a.call(T.SESSION_DELETE, session_id=two)               # in the trash: still counted
        await refused(a, T.SESSION_NEW, title="four")
        await a.call(T.SESSION_PURGE, session_id=two)                # purged: room for one
        r = await a.call(T.CHAT_TEXT, text="a new one", new_session=True)
        await a.turn_events(r["turn_id"])
        await refused(a, T.SESSION_NEW, title="five")
        listed = await a.call(T.SESSION_LIST)
        trash = await a.call(T.SESSION_LIST, deleted=True)
        assert len(listed["sessions"]) == 3 and trash["sessions"] == []
        b = await V3Client.connect(addr, token="tok-b")              # another user: own count
        assert (await b.call(T.SESSION_NEW, title="bob's"))["session"]["title"] == "bob's"
        for c in (a, b):
            await c.close()


async def test_creates_at_once_cannot_pass_the_quota_together(tmp_path):
    """Two connections of one user asking at the same time get exactly the places left."""
    async with running_server(tmp_path, users=USERS, max_sessions_per_user=4) as (srv, addr):
        a = await V3Client.connect(addr, token="tok-a")              # 1
        b = await V3Client.connect(addr, token="tok-a", new_session=False)
        calls = [c.call(T.SESSION_NEW, title=f"s{i}") for i in range(4) for c in (a, b)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        made = [r for r in results if isinstance(r, dict)]
        errors = [r for r in results if isinstance(r, ReplyError)]
        assert len(made) == 3 and len(errors) == 5 and {e.code for e in errors} == {"QUOTA_EXCEEDED"}
        assert srv.services.sessions.max_sessions == 4
        listed = await a.call(T.SESSION_LIST)
        assert len(listed["sessions"]) == 4
        for c in (a, b):
            await c.close()


async def test_a_v2_client_reads_why_its_new_session_was_refused(tmp_path):
    async with running_server(tmp_path, max_sessions_per_user=2) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)                  # the greeting makes session 1
        assert "Session: " in welcome
        assert (await v2.new_session()).startswith("s_")             # 2
        v2.send(V2_SESSION_NEW)
        text = await v2.recv_text()
        assert text.startswith("Error: you have 2 sessions") and "max_sessions_per_user is 2" in text
        assert v2.only_v2_codes()
        await v2.close()


def test_max_sessions_per_user_is_a_limit_with_a_safe_default():
    assert ServerConfig.from_dict({}, env={}).limits.max_sessions_per_user == 10_000
    assert ServerConfig.from_dict({"limits": {"max_sessions_per_user": 1}}, env={}).limits.max_sessions_per_user == 1
    for bad in (0, -1, 10_000_001):
        with pytest.raises(Exception, match="max_sessions_per_user"):
            ServerConfig.from_dict({"limits": {"max_sessions_per_user": bad}}, env={})
