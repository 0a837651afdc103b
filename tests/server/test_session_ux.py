"""Sessions as a user meets them, over real TCP: empty sessions do not pile up, a system prompt per
session reaches the model (the real openai client against the scripted endpoint), failed and
cancelled answers are stored and marked in exports."""
from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from protocol import MsgType as T
from server.agent.config import DEFAULT_SYSTEM_PROMPT
from server.app import Server
from testkit.echo_agent import EchoAgent
from testkit.scripted_llm import Reply, ScriptedLLM
from testkit.server import ReplyError, V3Client, make_config, poll, running_server
from testkit.v2client import V2Client

PROMPT = "You are a terse pirate. Answer in one line."


@asynccontextmanager
async def scripted_server(tmp_path: Path):
    """The production wiring (real MemoryManager, OpenAI agent) against a scripted endpoint."""
    async with ScriptedLLM(model="scripted-a") as scripted:
        llm = {"base_url": scripted.base_url, "api_key": "sk-test-0123456789", "model": "scripted-a",
               "request_timeout_s": 5.0, "retries": 2, "retry_backoff_s": 0.01, "retry_max_delay_s": 0.05}
        srv = Server(make_config(tmp_path, sections={"llm": llm, "summarization": {"enabled": False}}))
        addr = await srv.start()
        try:
            yield srv, addr, scripted
        finally:
            await srv.stop()


async def session_ids(c: V3Client, **extra) -> list[str]:
    return [s["session_id"] for s in (await c.call(T.SESSION_LIST, **extra))["sessions"]]


async def test_empty_sessions_do_not_pile_up(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        first = await V3Client.connect(addr)              # HELLO gives none: testkit sends SESSION_NEW
        sid = first.session_id
        for _ in range(3):                                 # HELLO again, and listing: nothing new
            c = await V3Client.connect(addr)
            assert c.session_id == sid and await session_ids(c) == [sid]
            await c.close()
        # "new" never answers with the session you are in: a second empty one is made ...
        second = (await first.call(T.SESSION_NEW))["session"]["session_id"]
        assert second != sid
        await first.wait_for(lambda m: m.type == T.SESSION_EVENT and m.body["kind"] == "created"
                             and m.body["session"]["session_id"] == second)
        # ... and from then on the other empty one is reused: never more than two
        for expected in (sid, second, sid):
            assert (await first.call(T.SESSION_NEW))["session"]["session_id"] == expected
        assert set(await session_ids(first)) == {sid, second}
        created = [m.body["session"]["session_id"] for m in first.inbox
                   if m.type == T.SESSION_EVENT and m.body["kind"] == "created"]
        assert created == [sid]                             # the first: the reuses announced nothing
        r = await first.call(T.CHAT_TEXT, text="now it has a message")   # in `sid`
        await first.turn_events(r["turn_id"])
        # `ask --new` as the CLI does it: HELLO (the newest session, the one with a message), then new
        for _ in range(3):
            c = await V3Client.connect(addr)
            assert c.session_id == sid
            assert (await c.call(T.SESSION_NEW))["session"]["session_id"] == second
            await c.close()
        fresh = (await first.call(T.SESSION_NEW))["session"]["session_id"]   # from `sid`: `second` is empty
        assert fresh == second
        titled = (await first.call(T.SESSION_NEW, title="my own"))["session"]["session_id"]
        assert titled not in (sid, second) and set(await session_ids(first)) == {sid, second, titled}
        v2, welcome = await V2Client.connect(addr)          # a v2 greeting reuses the newest session
        assert titled in welcome
        await v2.close()
        assert len(await session_ids(first)) == 3
        await first.close()


async def test_a_user_without_sessions_gets_none_until_the_first_message(tmp_path):
    async with running_server(tmp_path, max_text_chars=100) as (srv, addr):
        c = await V3Client.connect(addr, new_session=False)
        assert c.hello["session"] is None and c.hello["running_turn"] is None
        assert "lazy_session" in c.hello["capabilities"]
        assert await session_ids(c) == [] and await session_ids(c) == []     # listing never creates
        again = await V3Client.connect(addr, new_session=False)
        assert again.hello["session"] is None
        for t in (T.SESSION_INFO, T.HISTORY_REQUEST, T.SESSION_PROMPT):
            with pytest.raises(ReplyError) as err:
                await c.call(t)
            assert err.value.code == "NOT_FOUND" and "no current session" in err.value.body["message"]
        assert (await c.call(T.MODEL_LIST))["current"] == "echo"            # the next session's model
        with pytest.raises(ReplyError) as err:                              # a refused message creates nothing
            await c.call(T.CHAT_TEXT, text="x" * 101)
        assert err.value.code == "INVALID_MESSAGE" and await session_ids(c) == []
        with pytest.raises(ReplyError) as err:
            await c.call(T.CHAT_TEXT, text="hi", new_session=True, session_id="s_1")
        assert err.value.code == "INVALID_MESSAGE" and "new_session" in err.value.body["message"]

        r = await c.call(T.CHAT_TEXT, text="the first message")             # creates the session
        await c.turn_events(r["turn_id"])
        sid = r["session_id"]
        created = await again.wait_type(T.SESSION_EVENT, kind="created")
        assert created.body["session"]["session_id"] == sid
        assert await session_ids(c) == [sid]
        info = (await c.call(T.SESSION_INFO))["session"]                    # the connection is in it now
        assert info["session_id"] == sid and info["message_count"] == 2 and info["title"] == "the first message"
        # `new_session`: the message starts another session, and the connection follows it
        r = await c.call(T.CHAT_TEXT, text="another topic", new_session=True)
        await c.turn_events(r["turn_id"])
        assert r["session_id"] != sid and (await c.call(T.SESSION_INFO))["session"]["session_id"] == r["session_id"]
        assert set(await session_ids(c)) == {sid, r["session_id"]}
        # a connection that had no session can delete one without being given one
        third = (await c.call(T.SESSION_NEW, title="doomed"))["session"]["session_id"]
        gone = await again.call(T.SESSION_DELETE, session_id=third)
        assert gone["session_id"] == third and gone["current"] is None
        await c.call(T.SESSION_SWITCH, session_id=sid)
        # the user's empty session is reused by a first message, unless it was set up for its own
        plain = (await again.call(T.SESSION_NEW))["session"]["session_id"]
        r = await c.call(T.CHAT_TEXT, text="into the empty one", new_session=True)
        await c.turn_events(r["turn_id"])
        assert r["session_id"] == plain
        pirate = (await again.call(T.SESSION_NEW, system_prompt=PROMPT))["session"]["session_id"]
        r = await c.call(T.CHAT_TEXT, text="not into the pirate one", new_session=True)
        await c.turn_events(r["turn_id"])
        assert r["session_id"] not in (pirate, plain)
        assert (await c.call(T.SESSION_PROMPT, session_id=pirate))["system_prompt"] == PROMPT
        await c.close()
        await again.close()


async def test_system_prompt_per_session_is_stored_and_reaches_the_model(tmp_path):
    async with scripted_server(tmp_path) as (srv, addr, scripted):
        c = await V3Client.connect(addr)
        other = c.session_id
        new = (await c.call(T.SESSION_NEW, title="pirate", system_prompt=PROMPT))["session"]["session_id"]
        got = await c.call(T.SESSION_PROMPT)
        assert got["session"]["session_id"] == new and got["system_prompt"] == PROMPT
        scripted.push(Reply.text("Arr."))
        r = await c.call(T.CHAT_TEXT, text="hello?")
        await c.turn_events(r["turn_id"])
        messages = scripted.requests[-1].body["messages"]
        assert messages[0] == {"role": "system", "content": PROMPT}
        assert [m for m in messages if m["role"] == "system"] == [messages[0]]

        scripted.push(Reply.text("Hi."))                   # another session keeps the server's prompt
        r = await c.call(T.CHAT_TEXT, text="and here?", session_id=other)
        await c.turn_events(r["turn_id"])
        assert scripted.requests[-1].body["messages"][0]["content"] == DEFAULT_SYSTEM_PROMPT

        changed = await c.call(T.SESSION_PROMPT, system_prompt="Answer in French.")
        assert changed["system_prompt"] == "Answer in French."
        await c.wait_type(T.SESSION_EVENT, kind="updated")
        scripted.push(Reply.text("Oui."))
        r = await c.call(T.CHAT_TEXT, text="encore?")
        await c.turn_events(r["turn_id"])
        assert scripted.requests[-1].body["messages"][0] == {"role": "system", "content": "Answer in French."}

        reset = await c.call(T.SESSION_PROMPT, system_prompt="", session_id=other)
        assert reset["system_prompt"] is None
        with pytest.raises(ReplyError) as err:
            await c.call(T.SESSION_PROMPT, system_prompt=5)
        assert err.value.code == "INVALID_MESSAGE" and "system_prompt" in err.value.body["message"]
        assert "System prompt:" in (await c.call(T.HISTORY_EXPORT, format="markdown"))["content"]
        await c.close()
    async with running_server(tmp_path) as (srv, addr):     # stored with the session
        c = await V3Client.connect(addr, session_id=new)
        assert (await c.call(T.SESSION_PROMPT))["system_prompt"] == "Answer in French."
        await c.close()


async def test_a_provider_500_is_stored_as_a_failed_answer(tmp_path):
    async with scripted_server(tmp_path) as (srv, addr, scripted):
        c = await V3Client.connect(addr)
        scripted.push(*[Reply.fail(500, "upstream exploded")] * 3)
        r = await c.call(T.CHAT_TEXT, text="first question")
        end = (await c.turn_events(r["turn_id"]))[-1]
        assert end.type == T.TURN_ERROR and end.body["code"] == "LLM_ERROR"
        meta = end.body["partial_message"]["metadata"]
        assert meta["error"] == "LLM_ERROR" and meta["attempts"] == 3 and meta["error_message"] == end.body["message"]
        scripted.push(Reply.text("second answer"))
        r = await c.call(T.CHAT_TEXT, text="second question")
        await c.turn_events(r["turn_id"])
        # the failed answer, with no content, is sent as a placeholder: the roles keep alternating
        sent = scripted.requests[-1].body["messages"]
        assert [(m["role"], m["content"]) for m in sent[1:]] == [
            ("user", "first question"), ("assistant", "[no answer: the model endpoint failed]"),
            ("user", "second question")]
        c2 = await V3Client.connect(addr)                     # after a reload: question, failure, question, answer
        page = await c2.call(T.HISTORY_REQUEST)
        assert [m["role"] for m in page["messages"]] == ["user", "assistant", "user", "assistant"]
        assert page["messages"][1]["metadata"]["error"] == "LLM_ERROR"
        md = (await c2.call(T.HISTORY_EXPORT, format="markdown"))["content"]
        assert "### Assistant #2 (failed: LLM_ERROR)" in md and "(after 3 attempts)]*" in md
        await c.close()
        await c2.close()


async def test_a_cancelled_answer_is_marked_in_the_export(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent) as (srv, addr):
        c = await V3Client.connect(addr)
        r = await c.call(T.CHAT_TEXT, text="!block please")
        await poll(lambda: agent.blocked == 1)
        await c.call(T.CHAT_CANCEL)
        await c.turn_events(r["turn_id"])
        md = (await c.call(T.HISTORY_EXPORT, format="markdown"))["content"]
        assert "### Assistant #2 (partial, cancelled)" in md
        await c.close()
