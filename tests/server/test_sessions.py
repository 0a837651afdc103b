"""Session requests: list (paged), new, switch, rename, delete, clear, info; user isolation."""
from __future__ import annotations

import pytest

from protocol import MsgType
from testkit.server import ReplyError, V3Client, running_server

T = MsgType
MISSING = "s_20200101_0123456789ab"


async def chat(c: V3Client, text: str, **kw) -> dict:
    r = await c.call(T.CHAT_TEXT, text=text, **kw)
    events = await c.turn_events(r["turn_id"])
    return events[-1].body


async def test_new_list_switch_rename_info(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        first = c.session_id
        new = await c.call(T.SESSION_NEW, title="  Disk checks ")
        s2 = new["session"]
        assert s2["title"] == "Disk checks" and s2["message_count"] == 0 and s2["running"] is False
        await chat(c, "in the second session")  # the connection switched to it
        listing = await c.call(T.SESSION_LIST)
        ids = [s["session_id"] for s in listing["sessions"]]
        assert ids == [s2["session_id"], first]  # newest updated_at first
        assert listing["has_more"] is False and listing["next_before"] is None
        top = listing["sessions"][0]
        assert top["message_count"] == 2 and top["preview"] and top["summary"] is None
        sw = await c.call(T.SESSION_SWITCH, session_id=first)
        assert sw["session"]["session_id"] == first and sw["running_turn"] is None
        assert (await c.call(T.HISTORY_REQUEST))["total"] == 0
        ren = await c.call(T.SESSION_RENAME, title="Renamed")
        assert ren["session"]["title"] == "Renamed" and ren["session"]["session_id"] == first
        ren = await c.call(T.SESSION_RENAME, title="Other", session_id=s2["session_id"])
        assert ren["session"]["title"] == "Other"
        info = await c.call(T.SESSION_INFO, session_id=s2["session_id"])
        assert info["session"]["message_count"] == 2 and "summary" in info["session"]
        for bad in ({"title": ""}, {"title": "x" * 201}):
            with pytest.raises(ReplyError) as err:
                await c.call(T.SESSION_RENAME, **bad)
            assert err.value.code == "INVALID_MESSAGE" and "'title'" in err.value.body["message"]
        await c.close()


async def test_session_list_pages_with_a_cursor(tmp_path):
    async with running_server(tmp_path, max_page_size=3) as (srv, addr):
        c = await V3Client.connect(addr)
        for i in range(6):
            await c.call(T.SESSION_NEW, title=f"s{i}")
        seen, before, pages = [], None, 0
        while True:
            body = {"limit": 3} if before is None else {"limit": 3, "before": before}
            page = await c.call(T.SESSION_LIST, **body)
            seen += [s["title"] for s in page["sessions"]]
            pages += 1
            if not page["has_more"]:
                break
            before = page["next_before"]
        assert seen[:6] == [f"s{i}" for i in range(5, -1, -1)] and len(seen) == 7 and pages == 3
        with pytest.raises(ReplyError) as err:
            await c.call(T.SESSION_LIST, limit=4)
        assert err.value.code == "INVALID_MESSAGE" and "1..3" in err.value.body["message"]
        with pytest.raises(ReplyError) as err:
            await c.call(T.SESSION_LIST, before="not-a-cursor")
        assert err.value.code == "INVALID_MESSAGE"
        await c.close()


async def test_delete_moves_the_connection_and_clear_hides_messages(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        first = c.session_id
        await chat(c, "keep me")
        second = (await c.call(T.SESSION_NEW))["session"]["session_id"]
        await chat(c, "delete me")
        d = await c.call(T.SESSION_DELETE, session_id=second)
        assert d["session_id"] == second and d["current"]["session_id"] == first
        assert (await c.call(T.HISTORY_REQUEST))["total"] == 2  # now on `first`
        with pytest.raises(ReplyError) as err:
            await c.call(T.SESSION_SWITCH, session_id=second)
        assert err.value.code == "NOT_FOUND"
        assert [s["session_id"] for s in (await c.call(T.SESSION_LIST))["sessions"]] == [first]
        # deleting a session that is not the current one keeps the connection where it is
        third = (await c.call(T.SESSION_NEW))["session"]["session_id"]
        await c.call(T.SESSION_SWITCH, session_id=first)
        d = await c.call(T.SESSION_DELETE, session_id=third)
        assert d["current"]["session_id"] == first
        cl = await c.call(T.CLEAR_REQUEST)
        assert cl["cleared"] == 2 and cl["session"]["message_count"] == 0
        assert (await c.call(T.HISTORY_REQUEST))["messages"] == []
        # deleting the last session leaves the connection without one (none is created); the next
        # message starts one
        d = await c.call(T.SESSION_DELETE, session_id=first)
        assert d["current"] is None
        assert (await c.call(T.SESSION_LIST))["sessions"] == []
        await chat(c, "a new start")
        assert [s["message_count"] for s in (await c.call(T.SESSION_LIST))["sessions"]] == [2]
        await c.close()


async def test_unknown_sessions_are_not_found(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        for msg_type, body in [(T.SESSION_SWITCH, {"session_id": MISSING}),
                               (T.SESSION_SWITCH, {"session_id": "../../etc/passwd"}),
                               (T.SESSION_RENAME, {"session_id": MISSING, "title": "x"}),
                               (T.SESSION_DELETE, {"session_id": MISSING}),
                               (T.CLEAR_REQUEST, {"session_id": MISSING}),
                               (T.SESSION_INFO, {"session_id": "nonsense"}),
                               (T.HISTORY_REQUEST, {"session_id": MISSING}),
                               (T.HISTORY_EXPORT, {"session_id": MISSING, "format": "json"}),
                               (T.HISTORY_SEARCH, {"session_id": MISSING, "query": "x"}),
                               (T.MODEL_SWITCH, {"session_id": MISSING, "model": "echo"}),
                               (T.CHAT_CANCEL, {"session_id": MISSING})]:
            with pytest.raises(ReplyError) as err:
                await c.call(msg_type, **body)
            assert err.value.code == "NOT_FOUND", (msg_type, err.value.body)
        await c.close()


async def test_users_never_see_each_others_sessions(tmp_path):
    users = [("alice", "token-alice"), ("bob", "token-bob")]
    async with running_server(tmp_path, users=users) as (srv, addr):
        alice = await V3Client.connect(addr, token="token-alice")
        bob = await V3Client.connect(addr, token="token-bob")
        assert alice.hello["user"] == "alice" and bob.hello["user"] == "bob"
        await chat(alice, "alice secret about nginx")
        a_sid = alice.session_id
        assert a_sid != bob.session_id
        assert a_sid not in [s["session_id"] for s in (await bob.call(T.SESSION_LIST))["sessions"]]
        for msg_type, body in [(T.SESSION_SWITCH, {"session_id": a_sid}),
                               (T.SESSION_RENAME, {"session_id": a_sid, "title": "pwned"}),
                               (T.SESSION_DELETE, {"session_id": a_sid}),
                               (T.CLEAR_REQUEST, {"session_id": a_sid}),
                               (T.SESSION_INFO, {"session_id": a_sid}),
                               (T.HISTORY_REQUEST, {"session_id": a_sid}),
                               (T.HISTORY_EXPORT, {"session_id": a_sid, "format": "markdown"}),
                               (T.HISTORY_SEARCH, {"session_id": a_sid, "query": "nginx"}),
                               (T.CHAT_TEXT, {"session_id": a_sid, "text": "hi"}),
                               (T.MODEL_SWITCH, {"session_id": a_sid, "model": "echo"})]:
            with pytest.raises(ReplyError) as err:
                await bob.call(msg_type, **body)
            assert err.value.code == "NOT_FOUND" and err.value.body["message"] == "no such session"
        assert (await bob.call(T.HISTORY_SEARCH, query="nginx"))["hits"] == []
        assert (await alice.call(T.HISTORY_SEARCH, query="nginx"))["hits"]
        # bob's HELLO with alice's session id does not restore it
        bob2 = await V3Client.connect(addr, token="token-bob", session_id=a_sid)
        assert bob2.hello["session_restored"] is False and bob2.session_id != a_sid
        # session events go only to the owner's connections
        await alice.call(T.SESSION_RENAME, title="alice only")
        ev = await alice.wait_type(T.SESSION_EVENT, kind="renamed")
        assert ev.body["session"]["title"] == "alice only"
        assert not [m for m in bob.inbox if m.type == T.SESSION_EVENT and m.body["session"]["session_id"] == a_sid]
        assert (await alice.call(T.HISTORY_REQUEST))["total"] == 2
        for c in (alice, bob, bob2):
            await c.close()


async def test_session_events_reach_every_connection_of_the_user(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        a = await V3Client.connect(addr)
        b = await V3Client.connect(addr)
        new = await a.call(T.SESSION_NEW, title="fresh")
        sid = new["session"]["session_id"]
        ev = await b.wait_type(T.SESSION_EVENT, kind="created")
        assert ev.body["session"]["session_id"] == sid and ev.body["re"] is None
        await a.call(T.SESSION_RENAME, title="renamed")
        assert (await b.wait_type(T.SESSION_EVENT, kind="renamed")).body["session"]["title"] == "renamed"
        await a.call(T.MODEL_SWITCH, model="echo-large")
        assert (await b.wait_type(T.SESSION_EVENT, kind="model")).body["session"]["model"] == "echo-large"
        await a.call(T.CLEAR_REQUEST)
        assert (await b.wait_type(T.SESSION_EVENT, kind="cleared")).body["session"]["session_id"] == sid
        await a.call(T.SESSION_DELETE, session_id=sid)
        assert (await b.wait_type(T.SESSION_EVENT, kind="deleted")).body["session"]["session_id"] == sid
        await a.close()
        await b.close()


async def test_rename_and_model_switch_keep_the_list_order(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        old = c.session_id
        await chat(c, "hello")
        new = (await c.call(T.SESSION_NEW))["session"]["session_id"]
        await c.call(T.SESSION_RENAME, session_id=old, title="Renamed")
        await c.call(T.MODEL_SWITCH, session_id=old, model="echo-large")
        listing = await c.call(T.SESSION_LIST)
        assert [s["session_id"] for s in listing["sessions"]] == [new, old]
        assert listing["sessions"][1]["title"] == "Renamed"
        await chat(c, "back again", session_id=old)  # a message does move it up
        assert [s["session_id"] for s in (await c.call(T.SESSION_LIST))["sessions"]] == [old, new]
        await c.close()
