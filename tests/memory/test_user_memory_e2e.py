"""Long-term user memory end to end: production wiring, the real openai client against the scripted
endpoint (so the test sees exactly what reaches the model), two users over loopback TCP, the
MEMORY_LIST / MEMORY_FORGET requests, and a clear that takes back what the session taught."""
from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import pytest

from protocol import MsgType as T
from server.app import Server
from server.memory.context import MEMORY_HEADER
from testkit.scripted_llm import Reply, ScriptedLLM
from testkit.server import ReplyError, V3Client, make_config, poll

MODEL = "scripted-a"
USERS = [("alice", "token-a"), ("bob", "token-b")]


@asynccontextmanager
async def server(tmp_path, **user_memory: Any) -> AsyncIterator[tuple[tuple[str, int], ScriptedLLM]]:
    async with ScriptedLLM(model=MODEL) as llm:
        cfg = make_config(tmp_path, users=USERS, sections={
            "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": MODEL, "retries": 0},
            "summarization": {"enabled": False}, "user_memory": user_memory})
        srv = Server(cfg)
        addr = await srv.start()
        try:
            yield addr, llm
        finally:
            await srv.stop()


async def say(c: V3Client, llm: ScriptedLLM, text: str, **extra: Any) -> tuple[list[dict], dict]:
    """One turn; returns (the messages the model got, TURN_END's context metadata)."""
    llm.push(Reply.text("ok"))
    n = len(llm.requests)
    reply = await c.call(T.CHAT_TEXT, text=text, **extra)
    events = await c.turn_events(reply["turn_id"])
    assert events[-1].type == T.TURN_END, events[-1].body
    return llm.requests[n].body["messages"], events[-1].body["context"]


def memory_block(messages: list[dict]) -> str:
    found = [m["content"] for m in messages if m["role"] == "system" and m["content"].startswith(MEMORY_HEADER)]
    return found[0] if found else ""


async def test_memory_reaches_other_sessions_stays_per_user_and_can_be_forgotten(tmp_path):
    async with server(tmp_path) as (addr, llm):
        alice = await V3Client.connect(addr, token="token-a")
        bob = await V3Client.connect(addr, token="token-b")
        first = alice.hello["session"]["session_id"]
        await say(alice, llm, "The prod DB host is db-prod-42. Please answer in Chinese.")
        async def listed() -> list[dict]:
            return (await alice.call(T.MEMORY_LIST))["items"]

        async def learned() -> bool:
            return len(await listed()) == 2
        await poll(learned)                        # learning runs after TURN_END, in the background
        items = await listed()
        assert [(i["kind"], i["text"], i["session_id"]) for i in items] == [
            ("fact", "The prod DB host is db-prod-42.", first), ("preference", "Please answer in Chinese.", first)]
        fact, pref = items[0]["id"], items[1]["id"]

        # another session of alice: both reach the model, with their source; nothing of it reaches bob
        await alice.call(T.SESSION_NEW)
        messages, context = await say(alice, llm, "ssh into the prod database host")
        block = memory_block(messages)
        assert f"- The prod DB host is db-prod-42. (session {first}, " in block     # auto title: by its id
        assert "Please answer in Chinese." in block
        assert context["memory_items"] == [pref, fact] and context["memory_dropped"] == 0
        assert messages.index({"role": "system", "content": block}) == 1    # right after the system prompt
        listing = await bob.call(T.MEMORY_LIST)
        assert (listing["enabled"], listing["items"]) == (True, [])
        with pytest.raises(ReplyError) as err:
            await bob.call(T.MEMORY_FORGET, item_id=fact)
        assert err.value.body["code"] == "NOT_FOUND"
        messages, context = await say(bob, llm, "ssh into the prod database host")
        assert "db-prod-42" not in str(messages) and context["memory_items"] == []

        # forgetting one item: it never reaches the model again
        assert (await alice.call(T.MEMORY_FORGET, item_id=pref))["item_id"] == pref
        messages, _ = await say(alice, llm, "ssh into the prod database host")
        assert "Please answer in Chinese." not in str(messages) and "db-prod-42" in memory_block(messages)

        # renaming the session that taught it: the next prompt names it by its new title
        await alice.call(T.SESSION_RENAME, session_id=first, title='Prod "DB" notes')
        messages, _ = await say(alice, llm, "ssh into the prod database host")
        assert "(session \"Prod 'DB' notes\", " in memory_block(messages)

        # clearing the session that taught it: gone from the memory, the prompt, SESSION_INFO and export
        await alice.call(T.CLEAR_REQUEST, session_id=first)
        messages, context = await say(alice, llm, "ssh into the prod database host")
        assert "db-prod-42" not in str(messages) and context["memory_items"] == []
        async def emptied() -> bool:
            return await listed() == []
        await poll(emptied)
        info = await alice.call(T.SESSION_INFO)
        export = await alice.call(T.HISTORY_EXPORT, format="json")
        assert "db-prod-42" not in str(info) and "db-prod-42" not in export["content"]
        for c in (alice, bob):
            await c.close()


async def test_turned_off_by_config(tmp_path):
    async with server(tmp_path, enabled=False) as (addr, llm):
        alice = await V3Client.connect(addr, token="token-a")
        await say(alice, llm, "The prod DB host is db-prod-42.")
        await alice.call(T.SESSION_NEW)
        messages, context = await say(alice, llm, "prod DB host?")
        assert memory_block(messages) == "" and context["memory_items"] == []
        assert (await alice.call(T.MEMORY_LIST))["enabled"] is False
        with pytest.raises(ReplyError) as err:
            await alice.call(T.MEMORY_FORGET, item_id="m1")
        assert err.value.body["code"] == "UNSUPPORTED"
        await alice.close()


async def test_an_edit_or_a_correction_replaces_what_was_remembered(tmp_path):
    async with server(tmp_path) as (addr, llm):
        alice = await V3Client.connect(addr, token="token-a")
        first = alice.hello["session"]["session_id"]

        async def texts() -> list[str]:
            return [i["text"] for i in (await alice.call(T.MEMORY_LIST))["items"]]

        async def remembered(expected: list[str]) -> None:
            async def same() -> bool:
                return await texts() == expected
            await poll(same)

        await say(alice, llm, "The prod DB host is db-prod-41.")
        await remembered(["The prod DB host is db-prod-41."])
        typo = (await alice.call(T.HISTORY_REQUEST))["messages"][0]
        assert typo["content"] == "The prod DB host is db-prod-41."

        # the user edits the message into a question: what it taught is gone before the edited turn runs
        llm.push(Reply.text("ok"))
        reply = await alice.call(T.CHAT_EDIT, message_id=typo["id"], text="What is the load on web1?")
        await alice.turn_events(reply["turn_id"])
        assert await texts() == []
        # and edited again into a statement: the new text is learned
        edited = (await alice.call(T.HISTORY_REQUEST))["messages"][0]
        llm.push(Reply.text("ok"))
        reply = await alice.call(T.CHAT_EDIT, message_id=edited["id"], text="The prod DB host is db-prod-42.")
        await alice.turn_events(reply["turn_id"])
        await remembered(["The prod DB host is db-prod-42."])

        # a later statement about the same thing replaces the older one; other items stay
        await say(alice, llm, "Our backup bucket is s3://bk-1. The prod DB host is db-prod-43 now.")
        await remembered(["Our backup bucket is s3://bk-1.", "The prod DB host is db-prod-43 now."])

        await alice.call(T.SESSION_NEW)
        messages, context = await say(alice, llm, "ssh into the prod DB host")
        block = memory_block(messages)
        assert f"- The prod DB host is db-prod-43 now. (session {first}, " in block
        assert "db-prod-41" not in str(messages) and "db-prod-42" not in str(messages)
        assert len(context["memory_items"]) == 1 and "bk-1" not in block      # facts go in when relevant
        await alice.close()
