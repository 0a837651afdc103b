"""Chat turns over real TCP with the echo agent: events, storage, cancel, errors, queueing."""
from __future__ import annotations


import pytest

from protocol import MsgType
from testkit.echo_agent import EchoAgent
from testkit.server import ReplyError, V3Client, answer_text, running_server

T = MsgType


async def test_chat_streams_events_in_order_and_stores_both_messages(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        r = await c.call(T.CHAT_TEXT, text="hello world")
        assert r["queued"] == 0 and r["session_id"] == c.session_id
        assert r["user_message"]["role"] == "user" and r["user_message"]["content"] == "hello world"
        events = await c.turn_events(r["turn_id"])
        types = [e.type for e in events]
        assert types[0] == T.TURN_START and types[-1] == T.TURN_END
        assert all(e.body["re"] == r["re"] for e in events)
        assert answer_text(events) == "echo: hello world"
        statuses = [e.body["status"] for e in events if e.type == T.TURN_STATUS]
        assert statuses == ["thinking", "generating"]
        end = events[-1].body
        assert end["finish_reason"] == "stop" and end["message"]["content"] == "echo: hello world"
        assert end["message"]["metadata"]["model"] == "echo" and end["usage"]["total_tokens"] == 5
        assert end["context"]["memory"] == "basic"
        page = await c.call(T.HISTORY_REQUEST)
        assert [(m["role"], m["content"]) for m in page["messages"]] == [
            ("user", "hello world"), ("assistant", "echo: hello world")]
        assert page["messages"][1]["id"] == end["message"]["id"]
        info = await c.call(T.SESSION_INFO)
        assert info["session"]["title"] == "hello world" and info["session"]["message_count"] == 2
        await c.close()


async def test_tool_calls_are_streamed_and_stored(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        r = await c.call(T.CHAT_TEXT, text="!tool cpu")
        events = await c.turn_events(r["turn_id"])
        call = next(e.body["call"] for e in events if e.type == T.TOOL_CALL)
        result = next(e.body["call"] for e in events if e.type == T.TOOL_RESULT)
        assert call["status"] == "running" and call["result"] == "" and call["tool_name"] == "fake_tool"
        assert result["status"] == "success" and result["result"] == "42" and result["id"] == call["id"]
        assert [e.body["status"] for e in events if e.type == T.TURN_STATUS] == ["thinking", "tool_call", "generating"]
        stored = events[-1].body["message"]["tool_calls"]
        assert stored and stored[0]["result"] == "42"
        page = await c.call(T.HISTORY_REQUEST)
        assert page["messages"][-1]["tool_calls"][0]["tool_name"] == "fake_tool"
        await c.close()


async def test_long_title_is_truncated_and_only_set_once(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        text = "please check " + "the disk usage on every mounted filesystem " * 4
        r = await c.call(T.CHAT_TEXT, text=text)
        await c.turn_events(r["turn_id"])
        r = await c.call(T.CHAT_TEXT, text="second message")
        await c.turn_events(r["turn_id"])
        title = (await c.call(T.SESSION_INFO))["session"]["title"]
        assert title.startswith("please check the disk") and title.endswith("…") and len(title) <= 61
        await c.close()


async def test_two_clients_on_one_session_see_the_same_events(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        a = await V3Client.connect(addr)
        b = await V3Client.connect(addr, session_id=a.session_id)
        assert b.hello["session_restored"] is True
        r = await a.call(T.CHAT_TEXT, text="shared")
        ea = await a.turn_events(r["turn_id"])
        eb = await b.turn_events(r["turn_id"])
        assert [e.type for e in ea] == [e.type for e in eb]
        assert all(e.body["re"] == r["re"] for e in ea)
        assert all(e.body["re"] is None for e in eb)
        assert answer_text(eb) == "echo: shared"
        # b also gets the session-list update for the user
        ev = await b.wait_type(T.SESSION_EVENT, kind="updated")
        assert ev.body["session"]["session_id"] == a.session_id
        await a.close()
        await b.close()


async def test_cancel_saves_the_partial_answer(tmp_path):
    agent = EchoAgent(chunks=4)
    async with running_server(tmp_path, agent) as (srv, addr):
        c = await V3Client.connect(addr)
        r = await c.call(T.CHAT_TEXT, text="!block a long answer")
        await agent.wait_blocked()
        info = await c.call(T.SESSION_INFO)
        assert info["session"]["running"] is True
        cancel = await c.call(T.CHAT_CANCEL)
        assert cancel == {"re": cancel["re"], "turn_id": r["turn_id"], "cancelled": True, "withdrawn": False}
        events = await c.turn_events(r["turn_id"])
        end = events[-1]
        assert end.type == T.TURN_END and end.body["finish_reason"] == "cancelled"
        partial = answer_text(events)
        assert partial and end.body["message"]["content"] == partial
        assert end.body["message"]["metadata"]["partial"] is True
        page = await c.call(T.HISTORY_REQUEST)
        assert page["messages"][-1]["metadata"]["partial"] is True
        with pytest.raises(ReplyError) as err:
            await c.call(T.CHAT_CANCEL)
        assert err.value.code == "NO_ACTIVE_TURN"
        with pytest.raises(ReplyError) as err:
            await c.call(T.CHAT_CANCEL, turn_id="t_nope")
        assert err.value.code == "NO_ACTIVE_TURN"
        await c.close()


async def test_agent_error_gives_turn_error_with_partial_message(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        r = await c.call(T.CHAT_TEXT, text="!fail now please")
        events = await c.turn_events(r["turn_id"])
        err = events[-1]
        assert err.type == T.TURN_ERROR and err.body["code"] == "LLM_ERROR"
        pm = err.body["partial_message"]
        assert pm["metadata"]["partial"] is True and pm["content"] == answer_text(events)
        r = await c.call(T.CHAT_TEXT, text="!failnow")
        events = await c.turn_events(r["turn_id"])
        # a failure before any output is stored too: an empty answer marked with the error
        failed = events[-1].body["partial_message"]
        assert events[-1].body["code"] == "LLM_TIMEOUT" and failed["content"] == ""
        assert failed["metadata"]["partial"] is False
        assert failed["metadata"]["error"] == "LLM_TIMEOUT" and failed["metadata"]["attempts"] == 1
        assert failed["metadata"]["error_message"] == events[-1].body["message"]
        page = await c.call(T.HISTORY_REQUEST)
        assert [m["role"] for m in page["messages"]] == ["user", "assistant", "user", "assistant"]
        assert page["messages"][-1] == failed
        await c.close()


async def test_disconnect_mid_turn_then_history_shows_the_saved_answer(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent) as (srv, addr):
        c = await V3Client.connect(addr)
        sid = c.session_id
        await c.call(T.CHAT_TEXT, text="!block keep going without me")
        await agent.wait_blocked()
        await c.close()
        agent.release()
        c2 = await V3Client.connect(addr, session_id=sid)
        if c2.hello["running_turn"] is not None:  # still finishing: wait for its end
            await c2.turn_events(c2.hello["running_turn"]["turn_id"])
        page = await c2.call(T.HISTORY_REQUEST)
        last = page["messages"][-1]
        assert last["role"] == "assistant" and last["content"] == "echo: !block keep going without me"
        assert "partial" not in last["metadata"]
        await c2.close()


async def test_reattach_to_a_running_turn(tmp_path):
    agent = EchoAgent(chunks=4)
    async with running_server(tmp_path, agent) as (srv, addr):
        a = await V3Client.connect(addr)
        r = await a.call(T.CHAT_TEXT, text="!block reattach to me")
        await agent.wait_blocked()
        before = answer_text(await_list(a.inbox, r["turn_id"]))
        await a.close()
        b = await V3Client.connect(addr, session_id=a.session_id)
        state = b.hello["running_turn"]
        assert state["turn_id"] == r["turn_id"] and state["status"] == "generating"
        assert state["content"] == before and state["user_message"]["content"] == "!block reattach to me"
        agent.release()
        events = await b.turn_events(r["turn_id"])
        deltas = [e for e in events if e.type == T.ANSWER_DELTA]
        assert deltas[0].body["offset"] == len(state["content"])
        full = state["content"] + "".join(d.body["text"] for d in deltas)
        assert full == "echo: !block reattach to me" == events[-1].body["message"]["content"]
        # switch also reports the running turn
        agent2_turn = await b.call(T.CHAT_TEXT, text="!block again")
        await agent.wait_started(2)
        await b.turn_events(agent2_turn["turn_id"])  # the gate is open: it completes
        sw = await b.call(T.SESSION_SWITCH, session_id=a.session_id)
        assert sw["running_turn"] is None
        await b.close()


def await_list(inbox, turn_id):
    return [m for m in inbox if m.body.get("turn_id") == turn_id]


async def test_turns_in_one_session_are_queued_and_serialized(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent) as (srv, addr):
        c = await V3Client.connect(addr)
        r1 = await c.call(T.CHAT_TEXT, text="!block first")
        await agent.wait_blocked()
        r2 = await c.call(T.CHAT_TEXT, text="second")
        assert r1["queued"] == 0 and r2["queued"] == 1
        assert isinstance(r1["user_message"]["id"], int)
        # queued: stored when its turn starts, after the answer before it
        assert r2["user_message"]["id"] is None and r2["user_message"]["metadata"] == {"queued": True}
        assert agent.started == 1  # the second waits for the first
        agent.release()
        e1 = await c.turn_events(r1["turn_id"])
        e2 = await c.turn_events(r2["turn_id"])
        assert e1[-1].type == e2[-1].type == T.TURN_END
        assert e1[-1].body["message"]["id"] < e2[0].body["user_message"]["id"] < e2[-1].body["message"]["id"]
        page = await c.call(T.HISTORY_REQUEST)
        assert [m["content"] for m in page["messages"]] == [
            "!block first", "echo: !block first", "second", "echo: second"]
        await c.close()


async def test_turns_in_different_sessions_run_concurrently(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent) as (srv, addr):
        a = await V3Client.connect(addr)
        b = await V3Client.connect(addr)
        await b.call(T.SESSION_NEW, title="other")
        ra = await a.call(T.CHAT_TEXT, text="!block in a")
        rb = await b.call(T.CHAT_TEXT, text="!block in b")
        await agent.wait_blocked(2)  # both running at once
        stats = await a.call(T.STATS)
        assert stats["turns_running"] == 2
        agent.release()
        assert (await a.turn_events(ra["turn_id"]))[-1].type == T.TURN_END
        assert (await b.turn_events(rb["turn_id"]))[-1].type == T.TURN_END
        assert (await a.call(T.STATS))["turns_total"] == 2
        await a.close()
        await b.close()


async def test_queue_full_and_bad_chat_requests(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent, max_queued_turns=1, max_text_chars=50) as (srv, addr):
        c = await V3Client.connect(addr)
        r1 = await c.call(T.CHAT_TEXT, text="!block one")
        await agent.wait_blocked()
        r2 = await c.call(T.CHAT_TEXT, text="two")
        with pytest.raises(ReplyError) as err:
            await c.call(T.CHAT_TEXT, text="three")
        assert err.value.code == "QUEUE_FULL"
        with pytest.raises(ReplyError) as err:
            await c.call(T.CHAT_TEXT, text="x" * 51)
        assert err.value.code == "INVALID_MESSAGE" and "'text'" in err.value.body["message"]
        with pytest.raises(ReplyError) as err:
            await c.call(T.CHAT_TEXT, text="")
        assert err.value.code == "INVALID_MESSAGE"
        with pytest.raises(ReplyError) as err:
            await c.call(T.CHAT_TEXT, text="hi", session_id="s_20200101_000000000000")
        assert err.value.code == "NOT_FOUND"
        agent.release()
        await c.turn_events(r1["turn_id"])
        await c.turn_events(r2["turn_id"])
        page = await c.call(T.HISTORY_REQUEST)
        assert [m["content"] for m in page["messages"] if m["role"] == "user"] == ["!block one", "two"]
        await c.close()


async def test_chat_into_another_session_reaches_the_sender(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        first = c.session_id
        other = (await c.call(T.SESSION_NEW))["session"]["session_id"]
        r = await c.call(T.CHAT_TEXT, text="to the first", session_id=first)
        assert r["session_id"] == first
        events = await c.turn_events(r["turn_id"])
        assert events[-1].body["session_id"] == first
        assert (await c.call(T.HISTORY_REQUEST))["total"] == 0  # current session is `other`
        assert (await c.call(T.HISTORY_REQUEST, session_id=first))["total"] == 2
        assert other != first
        await c.close()


async def test_models_are_per_session(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        models = await c.call(T.MODEL_LIST)
        assert [m["name"] for m in models["models"]] == ["echo", "echo-large"]
        assert models["models"][0]["default"] is True and models["current"] == "echo"
        sw = await c.call(T.MODEL_SWITCH, model="echo-large")
        assert sw["model"] == "echo-large" and sw["session_id"] == c.session_id
        assert (await c.call(T.MODEL_LIST))["current"] == "echo-large"
        r = await c.call(T.CHAT_TEXT, text="which model")
        events = await c.turn_events(r["turn_id"])
        assert events[0].body["model"] == "echo-large"
        assert srv.agent.requests[-1].model == "echo-large"
        other = await c.call(T.SESSION_NEW)
        assert other["session"]["model"] == "echo"  # not global
        with pytest.raises(ReplyError) as err:
            await c.call(T.MODEL_SWITCH, model="gpt-99")
        assert err.value.code == "UNKNOWN_MODEL"
        await c.close()


async def test_stats(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        a = await V3Client.connect(addr)
        b = await V3Client.connect(addr)
        s = await a.call(T.STATS)
        assert s["clients"] == 2 and s["turns_total"] == 0 and s["turns_running"] == 0
        assert s["agent"] == {"name": "echo", "offline": True, "model": "echo"}
        assert s["version"] == srv.version and s["uptime_s"] >= 0 and s["sessions_loaded"] >= 1
        await a.close()
        await b.close()


async def test_many_deltas_arrive_complete_and_in_order(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        r = await c.call(T.CHAT_TEXT, text="!tokens 5000")
        events = await c.turn_events(r["turn_id"], timeout=30)
        text = answer_text(events)
        assert text == "tok " * 5000 == events[-1].body["message"]["content"]
        await c.close()


async def test_hello_reply_with_a_running_turn_too_big_for_one_message_is_cut_to_fit(tmp_path):
    # the running turn's user message and partial answer together exceed max_message_size
    agent = EchoAgent(chunks=2)
    async with running_server(tmp_path, agent, max_message_size=65535) as (srv, addr):
        a = await V3Client.connect(addr)
        text = "!block " + "é" * 16000 + "z" * 15990  # 48 KB of UTF-8; with half its echo, over 64 KB
        r = await a.call(T.CHAT_TEXT, text=text)
        await agent.wait_blocked()
        b = await V3Client.connect(addr, session_id=a.session_id)  # answered, not left hanging
        assert b.hello["truncated"] is True
        state = b.hello["running_turn"]
        assert state["turn_id"] == r["turn_id"]
        assert state["user_message"]["content"].startswith("!block éé") and "cut by the server" in state["user_message"]["content"]
        assert len(state["user_message"]["content"]) < len(text)
        assert (await b.call(T.PING)) is not None  # the connection is usable
        agent.release()
        end = (await b.turn_events(r["turn_id"]))[-1]
        assert end.type == T.TURN_END
        await a.close()
        await b.close()
