"""CHAT_REGENERATE and CHAT_EDIT over real TCP: replaced messages are kept, marked superseded, hidden
from default history and from the model's context (the real MemoryManager builds it)."""
from __future__ import annotations

import pytest

from protocol import MsgType as T
from storage.models import SummaryRecord
from testkit.echo_agent import EchoAgent
from testkit.server import ReplyError, V3Client, poll, running_server


async def chat(c: V3Client, text: str) -> None:
    r = await c.call(T.CHAT_TEXT, text=text)
    await c.turn_events(r["turn_id"])


def contents(page: dict) -> list[str]:
    return [m["content"] for m in page["messages"]]


def prompt_texts(agent: EchoAgent) -> list[str]:
    return [m.get("content") for m in agent.requests[-1].context.messages if m["role"] != "system"]


async def test_regenerate_supersedes_the_last_answer(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent, memory="auto") as (srv, addr):
        c = await V3Client.connect(addr)
        await chat(c, "one")
        await chat(c, "two")
        reply = await c.call(T.CHAT_REGENERATE)
        assert reply["user_message"]["id"] == 3 and reply["user_message"]["content"] == "two"
        assert reply["superseded"] == [4]
        events = await c.turn_events(reply["turn_id"])
        assert events[0].type == T.TURN_START and events[0].body["user_message"]["id"] == 3
        assert events[-1].type == T.TURN_END and events[-1].body["message"]["id"] == 5
        # the new turn's prompt holds the first turn, then the question once, without the old answer
        assert prompt_texts(agent) == ["one", "echo: one", "two"]

        assert contents(await c.call(T.HISTORY_REQUEST)) == ["one", "echo: one", "two", "echo: two"]
        full = await c.call(T.HISTORY_REQUEST, superseded=True)
        assert [m["id"] for m in full["messages"]] == [1, 2, 3, 4, 5]
        assert full["messages"][3]["metadata"]["superseded"] is True and full["total"] == 5
        md = (await c.call(T.HISTORY_EXPORT, format="markdown"))["content"]
        assert "### Assistant #4 (superseded)" in md

        again = await c.call(T.CHAT_REGENERATE)            # regenerating twice supersedes the newer answer
        assert again["superseded"] == [5]
        await c.turn_events(again["turn_id"])
        assert [m["id"] for m in (await c.call(T.HISTORY_REQUEST))["messages"]] == [1, 2, 3, 6]
        await c.close()


async def test_edit_supersedes_the_message_and_everything_after_it(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent, memory="auto") as (srv, addr):
        c = await V3Client.connect(addr)
        for text in ("one", "two", "three"):
            await chat(c, text)
        reply = await c.call(T.CHAT_EDIT, message_id=3, text="deux")
        assert reply["superseded"] == [3, 4, 5, 6]
        new = reply["user_message"]
        assert new["id"] == 7 and new["content"] == "deux" and new["metadata"]["edited_from"] == 3
        await c.turn_events(reply["turn_id"])
        assert prompt_texts(agent) == ["one", "echo: one", "deux"]
        assert contents(await c.call(T.HISTORY_REQUEST)) == ["one", "echo: one", "deux", "echo: deux"]
        md = (await c.call(T.HISTORY_EXPORT, format="markdown"))["content"]
        assert "### User #7 (edited, replaces #3)" in md and "### User #3 (superseded)" in md

        for message_id, why in ((2, "an answer"), (3, "superseded"), (99, "missing")):
            with pytest.raises(ReplyError) as err:
                await c.call(T.CHAT_EDIT, message_id=message_id, text="x")
            assert err.value.code == "NOT_FOUND", why
        with pytest.raises(ReplyError) as err:
            await c.call(T.CHAT_EDIT, message_id=7, text=" ")
        assert err.value.code == "INVALID_MESSAGE"
        await c.close()


async def test_regenerate_and_edit_need_an_idle_session(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent) as (srv, addr):
        c = await V3Client.connect(addr)
        with pytest.raises(ReplyError) as err:
            await c.call(T.CHAT_REGENERATE)                 # nothing to answer again
        assert err.value.code == "INVALID_MESSAGE"
        await chat(c, "first")
        r = await c.call(T.CHAT_TEXT, text="!block me")
        await poll(lambda: agent.blocked == 1)
        for req, body in ((T.CHAT_REGENERATE, {}), (T.CHAT_EDIT, {"message_id": 1, "text": "x"})):
            with pytest.raises(ReplyError) as err:
                await c.call(req, **body)
            assert err.value.code == "QUEUE_FULL"
        agent.release()
        await c.turn_events(r["turn_id"])
        page = await c.call(T.HISTORY_REQUEST, superseded=True)
        assert not any(m["metadata"].get("superseded") for m in page["messages"])   # nothing was changed
        await c.close()


async def test_superseded_turns_are_not_recalled(tmp_path):
    async with running_server(tmp_path, EchoAgent(), memory="auto") as (srv, addr):
        c = await V3Client.connect(addr)
        await chat(c, "my pet is a zebra")
        await chat(c, "filler")
        assert await srv.memory.search("local", "zebra", session_id=c.session_id)   # indexed
        reply = await c.call(T.CHAT_EDIT, message_id=1, text="my pet is a cat")
        await c.turn_events(reply["turn_id"])
        hits = await srv.memory.search("local", "zebra", session_id=c.session_id)
        assert hits == []
        assert await srv.memory.search("local", "cat", session_id=c.session_id)
        await c.close()


async def test_an_edit_takes_back_a_summary_of_what_it_replaces(tmp_path):
    """A summary covering an edited-away message stops reaching the model and SESSION_INFO: the
    newest earlier summary covering none of it is current again, or, without one, none is."""
    agent = EchoAgent()
    async with running_server(tmp_path, agent, memory="auto") as (srv, addr):
        c = await V3Client.connect(addr)
        for text in ("one", "two", "three", "four"):
            await chat(c, text)                        # messages 1..8
        sid = (await c.call(T.SESSION_INFO))["session"]["session_id"]
        await srv.store.add_summary(sid, SummaryRecord("EARLY: the user said one", 1, 2))
        await srv.store.add_summary(sid, SummaryRecord("LATE: the user said one, two and three", 1, 6))
        await chat(c, "five")
        assert any("LATE" in (m.get("content") or "") for m in agent.requests[-1].context.messages)

        # editing message 5 ("three", covered by LATE): EARLY is the summary again
        reply = await c.call(T.CHAT_EDIT, message_id=5, text="drei")
        await c.turn_events(reply["turn_id"])
        sent = str(agent.requests[-1].context.messages)
        assert "LATE" not in sent and "EARLY" in sent and "three" not in sent
        info = (await c.call(T.SESSION_INFO, session_id=sid))["session"]
        assert info["summary"]["text"] == "EARLY: the user said one"

        # editing message 1 (covered by every summary): no summary is left
        reply = await c.call(T.CHAT_EDIT, message_id=1, text="uno")
        await c.turn_events(reply["turn_id"])
        assert "EARLY" not in str(agent.requests[-1].context.messages)
        assert (await c.call(T.SESSION_INFO, session_id=sid))["session"]["summary"] is None
        assert prompt_texts(agent) == ["uno"]
        md = (await c.call(T.HISTORY_EXPORT, format="markdown"))["content"]
        assert "- Summary" not in md
        await c.close()


async def test_an_edit_of_the_message_a_title_was_made_from_makes_it_again(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent, memory="auto") as (srv, addr):
        c = await V3Client.connect(addr)
        await chat(c, "deploy with the token abc123 please")       # pasted by mistake, then edited away
        await chat(c, "and check the logs")
        info = (await c.call(T.SESSION_INFO))["session"]
        assert "abc123" in info["title"]
        reply = await c.call(T.CHAT_EDIT, message_id=1, text="deploy build 42")
        await c.turn_events(reply["turn_id"])
        info = (await c.call(T.SESSION_INFO))["session"]
        assert info["title"] == "deploy build 42"
        listing = await c.call(T.SESSION_LIST)
        assert "abc123" not in str(listing)
        # a later message's edit, or a title the user set, leaves the title alone
        await chat(c, "restart nginx")
        edited = [m for m in (await c.call(T.HISTORY_REQUEST))["messages"] if m["content"] == "restart nginx"][0]
        reply = await c.call(T.CHAT_EDIT, message_id=edited["id"], text="restart haproxy")
        await c.turn_events(reply["turn_id"])
        assert (await c.call(T.SESSION_INFO))["session"]["title"] == "deploy build 42"
        await c.call(T.SESSION_RENAME, title="Deploys")
        first = (await c.call(T.HISTORY_REQUEST))["messages"][0]
        reply = await c.call(T.CHAT_EDIT, message_id=first["id"], text="deploy build 43")
        await c.turn_events(reply["turn_id"])
        assert (await c.call(T.SESSION_INFO))["session"]["title"] == "Deploys"
        await c.close()


async def test_history_pages_skip_pages_of_superseded_messages_only(tmp_path):
    """(review s31: after regenerates and an edit, limit-2 pages came back [], [], [] with has_more
    true between the newest and the oldest visible messages: a client stopping at an empty page
    never reached messages 1-2)"""
    async with running_server(tmp_path, EchoAgent(), memory="auto") as (srv, addr):
        c = await V3Client.connect(addr)
        for text in ("one", "two", "three"):
            await chat(c, text)
        for _ in range(2):
            await c.turn_events((await c.call(T.CHAT_REGENERATE))["turn_id"])
        edit = await c.call(T.CHAT_EDIT, message_id=5, text="three, again")
        await c.turn_events(edit["turn_id"])
        visible = [m["id"] for m in (await c.call(T.HISTORY_REQUEST, limit=50))["messages"]]
        seen: list[int] = []
        before = None
        while True:
            page = await c.call(T.HISTORY_REQUEST, limit=2, **({"before": before} if before else {}))
            ids = [m["id"] for m in page["messages"]]
            assert ids or not page["has_more"], page        # never an empty page while more are left
            seen = ids + seen
            if not page["has_more"]:
                break
            before = page["next_before"]
        assert seen == visible and seen[:4] == [1, 2, 3, 4]
        await c.close()
