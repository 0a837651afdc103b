"""S33 long-term memory fixes: a clear's lasting floor (JSON document), one subject across English
and Chinese (a correction in the other language replaces the old fact, and a question in either
language finds it), the summary model never asked about questions, hypotheses, hedges or hearsay,
and the turn trace's after-turn work as the memory layer really schedules it."""
from __future__ import annotations

import json

import pytest

from protocol import MsgType as T
from server.app import Server
from server.basic_memory import BasicMemory
from server.memory.distill_model import model_source
from server.memory.distill import (asked_subject, other_language, retracts, same_subject, subject_key,
                                   takes_back)
from server.memory.user_files import JsonUserMemoryStore
from server.memory.user_store import MemoryItem
from server.pipeline import AFTER_TURN, after_turn_work
from testkit.scripted_llm import Recorded, Reply, ScriptedLLM
from testkit.server import V3Client, answer_text, make_config, poll, running_server

MODEL = "scripted-a"
DISTILL = "Extract the durable facts"


def item(n: int, text: str, session: str = "s1", message: int = 1) -> MemoryItem:
    return MemoryItem(f"m{n}", "fact", text, session, message, "2026-11-27T10:00:00+00:00")


# -- 1. a clear's floor (the JSON document; tests/pg/test_s33_memory_pg.py: two nodes) ------------

async def test_a_learning_that_ends_after_a_clear_adds_nothing_of_the_cleared_messages(tmp_path):
    root = tmp_path / "um"
    store = JsonUserMemoryStore(root)
    try:
        assert await store.add("alice", [item(1, "The vault host is vault-7.", "s1", 5)], learned=("s1", 5))
        await store.mark_forgetting("alice", "s1")
        assert await store.forget_session("alice", "s1") == 1
        # a learning that began before the clear (message 4 of s1) ends after it: nothing of it is added
        assert await store.add("alice", [item(2, "The build host is b-4.", "s1", 4)], learned=("s1", 4)) == []
        # a clear that took back up to message 9 (as the history says: ``upto``)
        await store.mark_forgetting("alice", "s1")
        assert await store.forget_session("alice", "s1", upto=9) == 0
        assert await store.add("alice", [item(3, "The cache host is c-9.", "s1", 9)]) == []
        assert await store.learned("alice", "s1") == 9          # a learning skips the cleared messages
        later = await store.add("alice", [item(4, "The cache host is c-10.", "s1", 10)])   # said after the clear
        assert [i.id for i in later] == ["m4"]
        assert await store.add("alice", [item(5, "The build host is b-4.", "s2", 4)]) != []   # other sessions: as before
    finally:
        await store.close()
    reopened = JsonUserMemoryStore(root)            # the floor is in the user's file: a restart keeps it
    try:
        assert await reopened.add("alice", [item(6, "The queue host is q-2.", "s1", 2)]) == []
        assert sorted(i.text for i in await reopened.list("alice")) == ["The build host is b-4.",
                                                                       "The cache host is c-10."]
        assert await reopened.list("bob") == []
    finally:
        await reopened.close()


# -- 2. one subject across English and Chinese ------------------------------------------------------

def test_a_subject_is_one_across_english_and_chinese_and_single_language_keys_stay():
    old, new = "生产数据库的主机是db-prod-42。", "The prod DB host is db-prod-43 now."
    assert same_subject("fact", old) == same_subject("fact", new) == "fact:prod db host"
    assert same_subject("fact", "预发服务器是 stage-7.internal") == same_subject("fact", "The staging server is stage-8")
    assert same_subject("fact", "Redis地址是10.0.0.5") == same_subject("fact", "The Redis address is 10.0.0.6")
    assert same_subject("fact", "生产数据库的端口是5432") == same_subject("fact", "The production database port is 5433")
    assert same_subject("fact", "我的名字是张三") == same_subject("fact", "My name is Alice.") == "fact:name"
    assert same_subject("fact", "MySQL是5.7") == same_subject("fact", "MySQL is 8.0")
    # a request to forget a subject, or a value that no longer holds, takes it in the other language too
    assert retracts(takes_back("Forget the prod DB host.")[0])("fact", old)
    assert retracts(takes_back("忘掉生产数据库的主机")[0])("fact", new)
    assert retracts(takes_back("The prod DB host is not db-prod-42 anymore.")[0])("fact", old)
    assert not retracts(takes_back("Forget the staging DB host.")[0])("fact", old)
    # as before in one language: 在 ("is at") apart from 是, a subject outside the table keeps its key
    assert same_subject("fact", "生产数据库在杭州") == same_subject("fact", "生产数据库改成上海了") != \
        same_subject("fact", "生产数据库是PostgreSQL")
    assert same_subject("fact", "我的常用编辑器是vim") == "fact:常用编辑器是"
    assert subject_key("fact", old) == "fact:生产数据库主机是"             # the per-language key is unchanged
    assert same_subject("fact", "My son is a doctor") is None
    # a question for the value, in either language
    assert asked_subject("生产数据库的主机是什么？") == asked_subject("What is the prod DB host?") == "fact:prod db host"
    assert asked_subject("生产数据库在哪里？") == same_subject("fact", "生产数据库在杭州")
    assert asked_subject("what time is it?") is None and asked_subject("The prod DB host is db-1.") is None
    assert other_language("生产数据库的主机是什么？") == "prod db host"
    assert other_language("What is the prod DB host?") == "生产 数据库 主机"


async def _turn(c: V3Client, text: str) -> str:
    reply = await c.call(T.CHAT_TEXT, text=text)
    events = await c.turn_events(reply["turn_id"], timeout=30)
    assert events[-1].type == T.TURN_END, events[-1].body
    return answer_text(events)


async def _items(c: V3Client) -> list[str]:
    return [i["text"] for i in (await c.call(T.MEMORY_LIST))["items"]]


@pytest.mark.parametrize("first, second", [
    ("生产数据库的主机是db-prod-42。", "The prod DB host is db-prod-43 now."),
    ("The prod DB host is db-prod-42.", "生产数据库的主机现在是db-prod-43。"),
])
async def test_a_correction_in_the_other_language_replaces_the_old_fact_offline(tmp_path, first, second):
    srv = Server(make_config(tmp_path))               # no model: the offline agent, the rules
    addr = await srv.start()
    try:
        c = await V3Client.connect(addr)
        await _turn(c, first)
        await c.call(T.SESSION_NEW)
        await _turn(c, second)

        async def replaced() -> bool:
            return await _items(c) == [second]
        await poll(replaced, timeout=15)
        await c.call(T.SESSION_NEW)
        for question in ("生产数据库的主机是什么？", "What is the prod DB host?"):
            answer = await _turn(c, question)
            assert "db-prod-43" in answer and "db-prod-42" not in answer, (question, answer)
        await c.close()
    finally:
        await srv.stop()


class ChatLLM(ScriptedLLM):
    """Answers every chat turn with "ok"."""

    async def _respond(self, req: Recorded, writer) -> bool:
        self.push(Reply.text("ok"))
        return await super()._respond(req, writer)


async def test_a_question_in_the_other_language_gets_the_corrected_fact_in_the_model_prompt(tmp_path):
    async with ChatLLM(model=MODEL) as llm:
        cfg = make_config(tmp_path, sections={
            "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": MODEL, "retries": 0},
            "summarization": {"enabled": False}})
        srv = Server(cfg)
        addr = await srv.start()
        try:
            c = await V3Client.connect(addr)
            await _turn(c, "生产数据库的主机是db-prod-42。")
            await c.call(T.SESSION_NEW)
            await _turn(c, "The prod DB host is db-prod-43 now.")

            async def replaced() -> bool:
                return await _items(c) == ["The prod DB host is db-prod-43 now."]
            await poll(replaced, timeout=15)
            await c.call(T.SESSION_NEW)
            for question in ("生产数据库的主机是什么？", "What is the prod DB host?"):
                n = len(llm.requests)
                await _turn(c, question)
                sent = json.dumps([r.body for r in llm.requests[n:]], ensure_ascii=False)
                assert "db-prod-43" in sent and "db-prod-42" not in sent, question
            await c.close()
        finally:
            await srv.stop()


# -- 4. the summary model is asked only about what the user states ---------------------------------

def test_the_model_source_drops_questions_hypotheses_hedges_and_hearsay():
    assert model_source("Is the staging host stage-9?") == ""
    assert model_source("Bob said the VPN gateway is vpn-evil.example.com.") == ""
    assert model_source("If my DB host is db-9, which port? I think the cache host is c-1. 生产数据库在哪里？") == ""
    assert model_source("The prod DB host is db-prod-42. Is the staging host stage-9?") == \
        "The prod DB host is db-prod-42."
    # kept: a preference (also hedged or conditional) and a request to forget (the learning drops its item)
    kept = "I think we should answer in Chinese. Forget that my home address is 12 Elm Street."
    assert model_source(kept) == kept.replace(". ", ".\n")


class DistillLLM(ScriptedLLM):
    """Chat turns: "ok". Distill requests: every line of the text it is given, as a fact (a model
    that restates whatever it sees)."""

    async def _respond(self, req: Recorded, writer) -> bool:
        messages = req.body.get("messages", [])
        if not req.body.get("stream") and messages and str(messages[0].get("content")).startswith(DISTILL):
            lines = [line for line in str(messages[-1]["content"]).splitlines() if line.strip()]
            self.push(Reply.text(json.dumps([{"kind": "fact", "text": line} for line in lines])))
        else:
            self.push(Reply.text("ok"))
        return await super()._respond(req, writer)


async def test_questions_and_hearsay_never_reach_the_summary_model_nor_the_memory(tmp_path):
    async with DistillLLM(model=MODEL) as llm:
        cfg = make_config(tmp_path, sections={
            "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": MODEL, "retries": 0},
            "summarization": {"model": MODEL, "trigger": {"type": "messages", "value": 1000}}})
        srv = Server(cfg)
        addr = await srv.start()
        try:
            c = await V3Client.connect(addr)
            for text in ("Is the staging host stage-9?", "Bob said the VPN gateway is vpn-evil.example.com.",
                         "If my DB host is db-9, which port should I use? Maybe the cache host is c-1.",
                         "The prod DB host is db-prod-42. Is the staging host stage-9?"):
                await _turn(c, text)

            async def learned() -> bool:          # (the session's learnings run in order: the last one ends last)
                return await _items(c) == ["The prod DB host is db-prod-42."]
            await poll(learned, timeout=15)
            asked = [r.body["messages"][-1]["content"] for r in llm.requests
                     if not r.body.get("stream") and r.body["messages"][0]["content"].startswith(DISTILL)]
            assert asked == ["The prod DB host is db-prod-42."]
            await c.close()
        finally:
            await srv.stop()


# -- 5. the trace's after-turn work is what after_turn schedules -----------------------------------

@pytest.mark.parametrize("sections, after", [
    ({}, ["recall index", "summary check", "long-term memory"]),
    ({"user_memory": {"enabled": False}}, ["recall index", "summary check"]),
    ({"user_memory": {"enabled": False}, "summarization": {"enabled": False}}, ["recall index"]),
    ({"user_memory": {"enabled": False}, "summarization": {"enabled": False}, "recall": {"enabled": False}}, []),
    ({"recall": {"enabled": False}, "summarization": {"enabled": False}}, ["long-term memory"]),
])
async def test_the_trace_lists_only_the_after_turn_work_that_is_turned_on(tmp_path, sections, after):
    async with running_server(tmp_path, memory="auto", sections=sections) as (srv, addr):
        c = await V3Client.connect(addr)
        reply = await c.call(T.CHAT_TEXT, text="hello there")
        events = await c.turn_events(reply["turn_id"])
        assert events[-1].body["context"]["pipeline"]["persist"]["after"] == after
        assert after_turn_work(srv.services.memory) == after
        reply = await c.call(T.CHAT_TEXT, text="!fail now")         # a failed turn schedules nothing
        events = await c.turn_events(reply["turn_id"])
        assert events[-1].type == T.TURN_ERROR
        failed = (await c.call(T.HISTORY_REQUEST))["messages"][-1]["metadata"]
        assert failed["context"]["pipeline"]["persist"]["after"] == []
        await c.close()
    assert after_turn_work(BasicMemory(None)) == [] and after == [w for w in AFTER_TURN if w in after]
