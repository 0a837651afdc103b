"""Queued turns over real TCP: stored order and context, withdrawal, reattach, delete and clear
during a turn, cancel from anywhere, session-list events while a turn runs."""
from __future__ import annotations

import pytest

from protocol import MsgType
from testkit.echo_agent import EchoAgent
from testkit.server import ReplyError, V3Client, running_server

T = MsgType


def contents(page: dict) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in page["messages"]]


def prompt_texts(agent: EchoAgent, i: int) -> list[tuple[str, str]]:
    """(role, content) of the user/assistant messages of the i-th turn's prompt, system prompt left out."""
    return [(m["role"], m["content"]) for m in agent.requests[i].context.messages
            if m["role"] in ("user", "assistant") and isinstance(m.get("content"), str)]


async def test_a_queued_turn_sees_the_answers_before_it(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent, memory="auto") as (srv, addr):   # the real MemoryManager
        c = await V3Client.connect(addr)
        r1 = await c.call(T.CHAT_TEXT, text="!block first question")
        await agent.wait_blocked()
        r2 = await c.call(T.CHAT_TEXT, text="second question")
        r3 = await c.call(T.CHAT_TEXT, text="third question")
        agent.release()
        for r in (r1, r2, r3):
            assert (await c.turn_events(r["turn_id"]))[-1].type == T.TURN_END
        page = await c.call(T.HISTORY_REQUEST)
        assert contents(page) == [
            ("user", "!block first question"), ("assistant", "echo: !block first question"),
            ("user", "second question"), ("assistant", "echo: second question"),
            ("user", "third question"), ("assistant", "echo: third question")]
        assert prompt_texts(agent, 1)[-3:] == [
            ("user", "!block first question"), ("assistant", "echo: !block first question"),
            ("user", "second question")]
        assert prompt_texts(agent, 2)[-3:] == [
            ("user", "second question"), ("assistant", "echo: second question"), ("user", "third question")]
        await c.close()


async def test_cancelling_a_queued_turn_withdraws_it(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent, max_queued_turns=1) as (srv, addr):
        c = await V3Client.connect(addr)
        other = await V3Client.connect(addr)   # same user, same session
        await c.call(T.CHAT_TEXT, text="!block running")
        await agent.wait_blocked()
        r2 = await c.call(T.CHAT_TEXT, text="withdraw me")
        cancel = await other.call(T.CHAT_CANCEL, turn_id=r2["turn_id"])   # from another connection
        assert cancel == {"re": cancel["re"], "turn_id": r2["turn_id"], "cancelled": True, "withdrawn": True}
        events = await c.turn_events(r2["turn_id"])
        assert [e.type for e in events] == [T.TURN_END]                  # never started
        end = events[0].body
        assert end["message"] is None and end["withdrawn"] is True and end["finish_reason"] == "cancelled"
        assert end["user_message"]["content"] == "withdraw me" and end["re"] == r2["re"]
        r3 = await c.call(T.CHAT_TEXT, text="queued instead")            # the slot is free again
        assert r3["queued"] == 1
        agent.release()
        assert (await c.turn_events(r3["turn_id"]))[-1].type == T.TURN_END
        page = await c.call(T.HISTORY_REQUEST)
        assert contents(page) == [("user", "!block running"), ("assistant", "echo: !block running"),
                                  ("user", "queued instead"), ("assistant", "echo: queued instead")]
        assert agent.started == 2
        await c.close()
        await other.close()


async def test_cancel_by_turn_id_finds_the_turn_after_switching_away(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent) as (srv, addr):
        c = await V3Client.connect(addr)
        r = await c.call(T.CHAT_TEXT, text="!block long")
        await agent.wait_blocked()
        await c.call(T.SESSION_NEW, title="elsewhere")
        with pytest.raises(ReplyError) as err:   # the new session has no turn
            await c.call(T.CHAT_CANCEL)
        assert err.value.code == "NO_ACTIVE_TURN"
        cancel = await c.call(T.CHAT_CANCEL, turn_id=r["turn_id"])
        assert cancel["cancelled"] is True and cancel["withdrawn"] is False
        end = (await c.turn_events(r["turn_id"]))[-1]
        assert end.type == T.TURN_END and end.body["finish_reason"] == "cancelled"
        await c.close()


async def test_turn_ids_of_other_users_cannot_be_cancelled(tmp_path):
    agent = EchoAgent()
    users = [("alice", "token-alice"), ("bob", "token-bob")]
    async with running_server(tmp_path, agent, users=users, max_queued_turns=0) as (srv, addr):
        alice = await V3Client.connect(addr, token="token-alice")
        bob = await V3Client.connect(addr, token="token-bob")
        r = await alice.call(T.CHAT_TEXT, text="!block alice's turn")
        await agent.wait_blocked()
        with pytest.raises(ReplyError) as err:
            await bob.call(T.CHAT_CANCEL, turn_id=r["turn_id"])
        assert err.value.code == "NO_ACTIVE_TURN"
        # alice's session is busy and her queue is full: bob must still see "no such session"
        with pytest.raises(ReplyError) as err:
            await bob.call(T.CHAT_TEXT, text="probe", session_id=alice.session_id)
        assert err.value.code == "NOT_FOUND"
        with pytest.raises(ReplyError) as err:
            await alice.call(T.CHAT_TEXT, text="mine")
        assert err.value.code == "QUEUE_FULL"
        assert alice.session_id not in srv.runner.lanes or srv.runner.lanes[alice.session_id].current
        agent.release()
        assert (await alice.turn_events(r["turn_id"]))[-1].type == T.TURN_END
        await alice.close()
        await bob.close()


async def test_reattach_lists_the_queued_turns(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent) as (srv, addr):
        a = await V3Client.connect(addr)
        r1 = await a.call(T.CHAT_TEXT, text="!block one")
        await agent.wait_blocked()
        r2 = await a.call(T.CHAT_TEXT, text="two")
        r3 = await a.call(T.CHAT_TEXT, text="three")
        b = await V3Client.connect(addr, session_id=a.session_id)
        state = b.hello["running_turn"]
        assert state["turn_id"] == r1["turn_id"]
        assert [(q["turn_id"], q["user_message"]["content"], q["user_message"]["id"]) for q in state["queued"]] \
            == [(r2["turn_id"], "two", None), (r3["turn_id"], "three", None)]
        sw = await b.call(T.SESSION_SWITCH, session_id=a.session_id)
        assert [q["turn_id"] for q in sw["running_turn"]["queued"]] == [r2["turn_id"], r3["turn_id"]]
        agent.release()
        for r in (r1, r2, r3):
            assert (await b.turn_events(r["turn_id"]))[-1].type == T.TURN_END
        await a.close()
        await b.close()


async def test_other_clients_see_the_session_running_when_a_turn_starts(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent) as (srv, addr):
        a = await V3Client.connect(addr)
        b = await V3Client.connect(addr)
        await b.call(T.SESSION_NEW, title="b's own session")
        await a.call(T.CHAT_TEXT, text="hello")          # names a's session, then a later turn
        await a.wait_type(T.TURN_END)
        r = await a.call(T.CHAT_TEXT, text="!block busy")
        ev = await b.wait_for(lambda m: m.type == T.SESSION_EVENT and m.body["kind"] == "updated"
                              and m.body["session"]["session_id"] == a.session_id
                              and m.body["session"]["running"] is True
                              and m.body["session"]["message_count"] == 3)
        assert ev.body["session"]["title"] == "hello"
        agent.release()
        await a.turn_events(r["turn_id"])
        await b.wait_for(lambda m: m.type == T.SESSION_EVENT and m.body["session"]["session_id"] == a.session_id
                         and m.body["session"]["running"] is False and m.body["session"]["message_count"] == 4)
        await a.close()
        await b.close()


async def test_deleting_a_session_mid_turn_moves_every_attached_client(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent) as (srv, addr):
        a = await V3Client.connect(addr)
        keep = (await a.call(T.SESSION_NEW, title="keep"))["session"]["session_id"]
        doomed = (await a.call(T.SESSION_NEW, title="doomed"))["session"]["session_id"]
        b = await V3Client.connect(addr, session_id=doomed)
        r1 = await a.call(T.CHAT_TEXT, text="!block doomed turn")
        await agent.wait_blocked()
        r2 = await a.call(T.CHAT_TEXT, text="queued in doomed")
        await a.call(T.SESSION_SWITCH, session_id=keep)
        deleted = await a.call(T.SESSION_DELETE, session_id=doomed)
        assert deleted["current"]["session_id"] == keep                 # a was elsewhere: stays
        end1 = (await b.turn_events(r1["turn_id"]))[-1]
        assert end1.type == T.TURN_END and end1.body["finish_reason"] == "cancelled"
        end2 = await b.turn_events(r2["turn_id"])
        assert [e.type for e in end2] == [T.TURN_END] and end2[0].body["withdrawn"] is True
        # b was attached to the deleted session: it now works on the newest remaining one
        page = await b.call(T.HISTORY_REQUEST)
        assert page["session_id"] == keep
        info = await b.call(T.SESSION_INFO)
        assert info["session"]["session_id"] == keep
        assert agent.started == 1
        await a.close()
        await b.close()


async def test_clearing_a_session_mid_turn_leaves_no_orphan_answer(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent) as (srv, addr):
        c = await V3Client.connect(addr)
        r1 = await c.call(T.CHAT_TEXT, text="!block being answered")
        await agent.wait_blocked()
        r2 = await c.call(T.CHAT_TEXT, text="waiting")
        cleared = await c.call(T.CLEAR_REQUEST)
        assert cleared["cleared"] == 2 and cleared["session"]["running"] is False  # question + partial
        assert (await c.turn_events(r1["turn_id"]))[-1].body["finish_reason"] == "cancelled"
        assert (await c.turn_events(r2["turn_id"]))[-1].body["withdrawn"] is True
        assert (await c.call(T.HISTORY_REQUEST))["messages"] == []
        agent.release()
        r3 = await c.call(T.CHAT_TEXT, text="fresh start")
        assert (await c.turn_events(r3["turn_id"]))[-1].type == T.TURN_END
        assert contents(await c.call(T.HISTORY_REQUEST)) == [("user", "fresh start"),
                                                             ("assistant", "echo: fresh start")]
        await c.close()


async def test_default_page_sizes_follow_a_small_max_page_size(tmp_path):
    async with running_server(tmp_path, max_page_size=3) as (srv, addr):
        c = await V3Client.connect(addr)
        for i in range(4):
            await c.call(T.SESSION_NEW, title=f"s{i}")
        listed = await c.call(T.SESSION_LIST)                 # no limit: the default, capped at 3
        assert len(listed["sessions"]) == 3 and listed["has_more"] is True
        assert (await c.call(T.HISTORY_REQUEST))["messages"] == []
        assert (await c.call(T.HISTORY_SEARCH, query="nothing"))["hits"] == []
        with pytest.raises(ReplyError) as err:
            await c.call(T.SESSION_LIST, limit=4)
        assert err.value.body["message"] == "field 'limit': expected an integer in 1..3, got 4"
        with pytest.raises(ReplyError) as err:
            await c.call(T.HISTORY_REQUEST, before=0)
        assert err.value.body["message"] == "field 'before': expected an integer >= 1, got 0"
        await c.close()


async def test_model_list_reports_the_given_sessions_model(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        first = c.session_id
        second = (await c.call(T.SESSION_NEW))["session"]["session_id"]
        await c.call(T.MODEL_SWITCH, model="echo-large", session_id=first)
        assert (await c.call(T.MODEL_LIST))["current"] == "echo"                       # current: second
        assert (await c.call(T.MODEL_LIST, session_id=first))["current"] == "echo-large"
        other = await V3Client.connect(addr, session_id=first)
        assert (await other.call(T.MODEL_LIST))["current"] == "echo-large"
        assert (await other.call(T.MODEL_LIST, session_id=second))["current"] == "echo"
        with pytest.raises(ReplyError) as err:
            await c.call(T.MODEL_LIST, session_id="s_20200101_000000000000")
        assert err.value.code == "NOT_FOUND"
        with pytest.raises(ReplyError) as err:
            await c.call(T.SESSION_RENAME, title="two\nlines")
        assert err.value.code == "INVALID_MESSAGE"
        await c.close()
        await other.close()


async def test_active_turns_per_user_are_capped_across_sessions(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent, max_active_turns_per_user=2) as (srv, addr):
        c = await V3Client.connect(addr)
        r1 = await c.call(T.CHAT_TEXT, text="!block in the first session")
        await agent.wait_blocked(1)
        r2 = await c.call(T.CHAT_TEXT, text="queued in the first session")
        await c.call(T.SESSION_NEW, title="second")
        with pytest.raises(ReplyError) as err:
            await c.call(T.CHAT_TEXT, text="a third turn elsewhere")
        assert err.value.code == "QUEUE_FULL" and "max_active_turns_per_user" in err.value.body["message"]
        await c.call(T.CHAT_CANCEL, turn_id=r2["turn_id"])                # withdrawing frees a slot
        r3 = await c.call(T.CHAT_TEXT, text="!block now it fits")
        await agent.wait_blocked(2)
        assert srv.runner.active == {"local": 2}
        agent.release()
        for r in (r1, r3):
            assert (await c.turn_events(r["turn_id"]))[-1].type == T.TURN_END
        assert srv.runner.active == {}
        assert c.hello["limits"]["max_active_turns_per_user"] == 2
        await c.close()
