"""Honest clear, end to end over loopback TCP with the real memory layer: after a clear (plain or
purge) or a purge of the session, none of its text reaches a later prompt (the exact context the
agent receives), SESSION_INFO, the export or the long-term memory -- summaries, recall and
long-term memory and the automatic title made from the first message included (a variant through the
real OpenAI agent and the scripted endpoint: test_honest_clear_llm_e2e.py)."""
from __future__ import annotations

import pytest

from protocol import MsgType as T
from testkit.echo_agent import EchoAgent
from honest_clear_lib import forget, leaks, plant_secrets_until_summarized, say
from testkit.server import V3Client, running_server

SUMMARIZE = {"summarization": {"trigger": {"type": "messages", "value": 6}, "keep": {"type": "messages", "value": 2}}}


@pytest.mark.parametrize("how", ["clear", "clear purge", "purge"])
async def test_cleared_text_reaches_no_prompt_info_export_or_memory(tmp_path, how):
    echo = EchoAgent()
    async with running_server(tmp_path, echo, memory="auto", sections=SUMMARIZE) as (srv, addr):
        c = await V3Client.connect(addr)
        first = await plant_secrets_until_summarized(srv, c)
        memory = srv.services.memory
        assert leaks((await srv.store.get(first)).summaries[-1].text)      # the summary did hold them

        session = await forget(c, first, how)
        question = "what is the vault host, the code word and my favourite shell?"
        await say(c, question)
        context = echo.requests[-1].context
        assert not leaks(str(context.messages)), context.messages
        assert context.metadata["summary_used"] is None and context.metadata["memory_items"] == []
        other = (await c.call(T.SESSION_NEW))["session"]["session_id"]    # another session: no memory of it
        await say(c, question)
        assert not leaks(str(echo.requests[-1].context.messages))
        await memory.wait_idle()
        assert await memory.user_memory.list("local") == []
        assert (await c.call(T.MEMORY_LIST))["items"] == []
        for sid in (session, other):
            info = await c.call(T.SESSION_INFO, session_id=sid)
            assert not leaks(str(info)), info
            for fmt in ("json", "markdown"):
                exported = await c.call(T.HISTORY_EXPORT, session_id=sid, format=fmt)
                assert not leaks(exported["content"]), (sid, fmt)
        hits = await c.call(T.HISTORY_SEARCH, query="vault PELICAN zsh-extra")
        assert not leaks(str(hits))
        await c.close()


async def test_a_clear_keeps_a_title_the_user_set(tmp_path):
    async with running_server(tmp_path, EchoAgent(), memory="auto") as (srv, addr):
        c = await V3Client.connect(addr)
        first = c.hello["session"]["session_id"]
        await say(c, "The vault host is vault-7.")
        await c.call(T.SESSION_RENAME, session_id=first, title="ops notes")
        await c.call(T.CLEAR_REQUEST, session_id=first, purge=True)
        assert (await c.call(T.SESSION_INFO, session_id=first))["session"]["title"] == "ops notes"
        await say(c, "check disk usage on web1")
        assert (await c.call(T.SESSION_INFO, session_id=first))["session"]["title"] == "ops notes"
        await c.close()
