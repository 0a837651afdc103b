"""S33 (fixer route2, item 5): the summary model is asked about what a message states, clause by clause.

``model_source`` dropped whole sentences that merely held a question word or a hedge: "我不知道为什么，
但是主库是 db-7。", "I wonder why, but the prod DB host is db-prod-44.", "How we deploy: the deploy
host is deploy-3." were never sent to the summary model, so never learned. A sentence is now cut
into clauses (，, "; ", ": ", ", but"): a question drops only itself, a conditional, hedge or hearsay
also the clauses after it up to a semicolon or a "but"/但是. Today's drops stay ("Is the staging host
stage-9?", "Bob said the VPN gateway is vpn-evil.example.com.", "如果主库是 db-9，端口就是 5433。").
The end-to-end test runs a real server on loopback with a scripted summary model that restates
whatever it is sent.
"""
from __future__ import annotations

import json

from protocol import MsgType as T
from server.app import Server
from server.memory.distill_model import model_source
from testkit.scripted_llm import Recorded, Reply, ScriptedLLM
from testkit.server import V3Client, answer_text, make_config, poll

MODEL = "scripted-a"
DISTILL = "Extract the durable facts"
STATED = {"我不知道为什么，但是主库是 db-7。": "主库是 db-7。",
          "I wonder why, but the prod DB host is db-prod-44.": "The prod DB host is db-prod-44.",
          "How we deploy: the deploy host is deploy-3.": "The deploy host is deploy-3."}


def test_a_sentence_that_asks_in_passing_keeps_the_clause_it_states():
    for text, kept in STATED.items():
        assert model_source(text) == kept, text
    assert model_source("我不知道为什么，但是主库是 db-7") == "主库是 db-7"          # (no full stop)
    assert model_source("主库是什么，端口是 5432。") == "端口是 5432。"
    # every clause stated: the sentence as it was
    assert model_source("生产数据库是 db-prod-1，备份在杭州机房。") == "生产数据库是 db-prod-1，备份在杭州机房。"
    assert model_source("The backup runs at 02:30 UTC.") == "The backup runs at 02:30 UTC."


def test_questions_conditionals_hedges_and_hearsay_still_drop_what_they_govern():
    for text in ("Is the staging host stage-9?", "Bob said the VPN gateway is vpn-evil.example.com.",
                 "I wonder why, but is the host db-1?",                 # a question as a whole
                 "如果主库是 db-9，端口就是 5433。",                       # what follows a condition is supposed
                 "老王说：主库是 db-7。", "他说主库是 db-7，端口是 5432。",  # and what follows hearsay reported
                 "可能主库是 db-7，端口是 5432。"):                        # and what follows a hedge hedged
        assert model_source(text) == "", text
    assert model_source("The prod DB host is db-prod-42. Is the staging host stage-9?") == \
        "The prod DB host is db-prod-42."


class DistillLLM(ScriptedLLM):
    """Chat turns: "ok". Distill requests: every line of the text it is given, as a fact."""

    async def _respond(self, req: Recorded, writer) -> bool:
        messages = req.body.get("messages", [])
        if not req.body.get("stream") and messages and str(messages[0].get("content")).startswith(DISTILL):
            lines = [line for line in str(messages[-1]["content"]).splitlines() if line.strip()]
            self.push(Reply.text(json.dumps([{"kind": "fact", "text": line} for line in lines])))
        else:
            self.push(Reply.text("ok"))
        return await super()._respond(req, writer)


async def _turn(c: V3Client, text: str) -> str:
    reply = await c.call(T.CHAT_TEXT, text=text)
    events = await c.turn_events(reply["turn_id"], timeout=30)
    assert events[-1].type == T.TURN_END, events[-1].body
    return answer_text(events)


async def test_what_a_sentence_states_beside_a_question_is_sent_to_the_summary_model_and_learned(tmp_path):
    async with DistillLLM(model=MODEL) as llm:
        cfg = make_config(tmp_path, sections={
            "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": MODEL, "retries": 0},
            "summarization": {"model": MODEL, "trigger": {"type": "messages", "value": 1000}}})
        srv = Server(cfg)
        addr = await srv.start()
        try:
            c = await V3Client.connect(addr)
            for text in [*STATED, "Bob said the VPN gateway is vpn-evil.example.com."]:
                await _turn(c, text)
            await _turn(c, "The marker host is marker-1.")     # (the session's learnings run in order: last)

            async def learned() -> bool:
                items = [i["text"] for i in (await c.call(T.MEMORY_LIST))["items"]]
                return any("marker-1" in i for i in items)
            await poll(learned, timeout=15)
            items = sorted(i["text"] for i in (await c.call(T.MEMORY_LIST))["items"])
            assert items == sorted([*STATED.values(), "The marker host is marker-1."])
            asked = [r.body["messages"][-1]["content"] for r in llm.requests
                     if not r.body.get("stream") and r.body["messages"][0]["content"].startswith(DISTILL)]
            assert asked == [*STATED.values(), "The marker host is marker-1."]
            await c.close()
        finally:
            await srv.stop()
