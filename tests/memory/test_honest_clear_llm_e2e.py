"""Honest clear through the real OpenAI agent and the real ``openai`` client against the scripted
OpenAI-compatible endpoint, over loopback TCP: after a clear, a clear with purge, or a purge of the
session, no request body the model receives holds any of the cleared text -- not in the summary,
the recalled excerpts, the long-term memory block or anywhere else -- and the session's automatic
title, SESSION_INFO and both exports hold none of it either."""
from __future__ import annotations

import json

import pytest

from protocol import MsgType as T
from server.app import Server
from storage.models import DEFAULT_TITLE
from testkit.scripted_llm import Recorded, Reply, ScriptedLLM
from honest_clear_lib import forget, leaks, plant_secrets_until_summarized, say
from testkit.server import V3Client, make_config

MODEL = "scripted-a"


class LLM(ScriptedLLM):
    """Answers every chat turn with "ok" and every summary request (not streamed) with the text it
    was asked to summarize, so a summary holds exactly what reached the summarizer, in whatever
    order they come (the reply is queued and taken with no await in between)."""

    async def _respond(self, req: Recorded, writer) -> bool:
        if req.body.get("stream"):
            self.push(Reply.text("ok"))
        else:
            asked = [m.get("content") or "" for m in req.body.get("messages", []) if m.get("role") != "system"]
            self.push(Reply.text("Summary: " + " ".join(asked)[-4000:]))
        return await super()._respond(req, writer)


@pytest.mark.parametrize("how", ["clear", "clear purge", "purge"])
async def test_no_cleared_text_reaches_the_model_after_a_clear(tmp_path, how):
    async with LLM(model=MODEL) as llm:
        cfg = make_config(tmp_path, sections={
            "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": MODEL, "retries": 0},
            "summarization": {"trigger": {"type": "messages", "value": 6}, "keep": {"type": "messages", "value": 2}}})
        srv = Server(cfg)
        addr = await srv.start()
        try:
            c = await V3Client.connect(addr)
            first = await plant_secrets_until_summarized(srv, c)   # FIRST names the session (automatic title)
            memory = srv.services.memory
            rec = await srv.store.get(first)
            assert rec.title_auto and leaks(rec.title) and leaks(rec.summaries[-1].text)
            other = (await c.call(T.SESSION_NEW))["session"]["session_id"]
            await say(c, "which vault host, code word and shell did I mention?")
            assert leaks(json.dumps(llm.requests[-1].body))     # before: memory reaches another session

            session = await forget(c, first, how)
            if how != "purge":
                await c.call(T.SESSION_SWITCH, session_id=first)
            await memory.wait_idle()
            n = len(llm.requests)
            question = "what is the vault host, the code word and my favourite shell?"
            await say(c, question)                      # in the cleared session (or a new one)
            await c.call(T.SESSION_SWITCH, session_id=other)
            await say(c, question)                      # in another session: no long-term memory of it
            for sid in (session, other):                # more turns: recall and summaries run again
                await c.call(T.SESSION_SWITCH, session_id=sid)
                for i in range(3):
                    await say(c, f"check the load on db{i} and the vault host")
            await memory.wait_idle()
            after = llm.requests[n:]
            assert len(after) >= 8
            for r in after:
                assert not leaks(json.dumps(r.body)), r.body["messages"]
            for sid in (session, other):
                info = await c.call(T.SESSION_INFO, session_id=sid)
                assert not leaks(json.dumps(info)), info
                for fmt in ("json", "markdown"):
                    exported = await c.call(T.HISTORY_EXPORT, session_id=sid, format=fmt)
                    assert not leaks(exported["content"]), (sid, fmt)
            if how != "purge":                           # the automatic title went with the clear,
                title = (await c.call(T.SESSION_INFO, session_id=first))["session"]["title"]
                assert title != DEFAULT_TITLE and title.startswith("what is the vault host")   # renamed by the next one
            assert (await c.call(T.MEMORY_LIST))["items"] == []
            await c.close()
        finally:
            await srv.stop()
