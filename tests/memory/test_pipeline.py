"""The turn pipeline's steps, each alone (route, recall, retrieve, generate, persist), the whole
preparation, a replaced step, and the trace reaching TURN_END and the stored answer."""
from __future__ import annotations

import pytest

from memory_testlib import OfflineStub, store_turn
from server.agent.base import BuiltContext, TurnResult
from server.memory import MemoryConfig, MemoryManager
from server.memory.user_files import JsonUserMemoryStore
from server.pipeline import (KNOWLEDGE_HEADER, Answer, Passage, TurnPipeline, TurnState, generate, persist_step,
                             recall_step, retrieve_step, route)
from storage.models import ChatMessage, ToolCall
from testkit.server import running_server
from protocol import MsgType as T
from testkit.server import V3Client


def state(text: str = "where is the prod database?", session_id: str = "s", user_id: str = "alice") -> TurnState:
    return TurnState(session_id, user_id, "m", "t_1", ChatMessage(0, "user", text, "2026-11-25T10:00:00+00:00"))


async def test_route_alone():
    s = state()
    await route(s)
    assert s.route == "chat" and s.trace == {"route": {"decision": "chat", "reason": "no router configured"}}


async def test_recall_alone_records_summary_turns_memory_items_and_drops(store, tmp_path):
    cfg = MemoryConfig.from_dict({"summarization": {"enabled": False}, "context": {"recent_turns": 1}})
    mm = MemoryManager(cfg, store, OfflineStub(), None, "SYS", user_store=JsonUserMemoryStore(tmp_path / "um"))
    a = (await store.create("alice")).session_id
    await store_turn(store, mm, a, "alice", "The prod database host is db-prod-42.", "noted")
    await mm.wait_idle()
    b = (await store.create("alice")).session_id
    await store_turn(store, mm, b, "alice", "the nginx workers on web1 are slow", "restart them")
    await store_turn(store, mm, b, "alice", "disk on web2 is full", "cleaned")
    user = await store.append(b, "user", "where is the prod database host, and were the nginx workers slow?")
    s = TurnState(b, "alice", "m", "t_1", user)
    await recall_step(mm)(s)
    rec = s.trace["recall"]
    [item] = await mm.user_memory.list("alice")
    assert rec["memory_items"] == [item.id] and rec["recalled"] == [1] and rec["summary"] is None
    assert rec["dropped"] == [{"what": "older turns", "count": 1,
                               "why": "before the recent window (reachable by recall only)"}]
    assert "db-prod-42" not in str(s.trace)                  # ids only, never the remembered text
    assert s.context is not None and s.context.messages[-1]["content"] == user.content
    await mm.aclose()


async def test_retrieve_alone_quotes_passages_within_budget():
    s = state()
    await retrieve_step()(s)
    assert s.trace["retrieve"] == {"passages": [], "skipped": "not up front (the agent searches with search_knowledge)"}

    async def search(user_id: str, query: str) -> list[Passage]:
        assert (user_id, query) == ("alice", "where is the prod database?")
        return [Passage("runbook.md:3", "The prod database runs on db-prod-42."), Passage("big.md:1", "x " * 400)]
    s = state()
    s.context = BuiltContext([{"role": "system", "content": "SYS"}, {"role": "user", "content": "q"}],
                             {"budget_tokens": 10_000, "prompt_tokens_estimate": 10})
    await retrieve_step(search, budget=200)(s)
    assert s.trace["retrieve"] == {"passages": ["runbook.md:3"], "dropped": [
        {"citation": "big.md:1", "why": "over the retrieve budget (200 tokens)"}]}
    assert s.context.messages[1] == {"role": "system", "content": KNOWLEDGE_HEADER +
                                     "\n[runbook.md:3] The prod database runs on db-prod-42."}
    s.context = BuiltContext([{"role": "user", "content": "q"}], {"budget_tokens": 100, "prompt_tokens_estimate": 95})
    await retrieve_step(search, budget=5000)(s)
    assert s.trace["retrieve"]["passages"] == [] and len(s.context.messages) == 1   # the prompt stays in budget
    assert {d["why"] for d in s.trace["retrieve"]["dropped"]} == {"over the prompt budget"}


async def test_generate_alone():
    class Agent:
        async def run_turn(self, req, sink):
            assert req.context.messages == [{"role": "user", "content": "hi"}] and sink == "sink"
            return TurnResult("answer", [ToolCall("c1", "clock", {})], {"total_tokens": 3}, "stop", {})
    s = state("hi")
    s.context = BuiltContext([{"role": "user", "content": "hi"}], {"pipeline": s.trace})
    result = await generate(s, Agent(), "sink")
    assert result.content == "answer" and s.result is result
    assert s.trace["generate"] == {"model": "m", "finish_reason": "stop", "tool_calls": ["clock"],
                                   "usage": {"total_tokens": 3}}


async def test_persist_alone_records_its_input_before_storing_and_gives_what_was_stored():
    s = state("hi")
    s.context = BuiltContext([{"role": "user", "content": "hi"}], {"pipeline": s.trace})
    saved = []

    async def save(st: TurnState) -> str:
        # the trace is recorded before the answer is stored: the stored metadata holds it
        trace = st.answer.metadata.get("context", {}).get("pipeline", {})
        saved.append((st.answer.content, dict(trace.get("persist", {}))))
        return "stored-message"
    s.answer = Answer("answer", [ToolCall("c1", "clock", {})], "stop", {"context": s.context.metadata})
    await persist_step(save)(s)
    assert s.stored == "stored-message"
    expected = {"answer_chars": 6, "tool_calls": 1, "finish_reason": "stop",
                "after": ["recall index", "summary check", "long-term memory"]}
    assert s.trace["persist"] == expected and saved == [("answer", expected)]
    # no context prepared (cancelled or failed before recall): stored, nothing recorded
    s2 = state("hi")
    s2.answer = Answer("", [], "cancelled")
    await persist_step(save)(s2)
    assert s2.stored == "stored-message" and s2.trace == {} and saved[-1] == ("", {})
    s3 = state("hi")
    with pytest.raises(RuntimeError):
        await persist_step(save)(s3)                   # no answer: refused


async def test_prepare_runs_the_steps_in_order_and_a_step_can_be_replaced():
    order = []

    class Memory:
        async def build_context(self, session_id, user_id, message, model, reserve_tokens=0):
            order.append("recall")
            return BuiltContext([{"role": "user", "content": message.content}], {"memory": "basic"})

    async def router(s: TurnState) -> None:
        order.append("route")
        s.route = "knowledge"
        s.record("route", decision="knowledge", reason="asks about documents")
    p = TurnPipeline.default(Memory())
    p.replace("route", router)
    s = state()
    ctx = await p.prepare(s)
    assert order == ["route", "recall"] and list(ctx.metadata["pipeline"]) == ["route", "recall", "retrieve"]
    assert ctx.metadata["pipeline"]["route"]["decision"] == "knowledge"


async def test_the_trace_reaches_turn_end_and_the_stored_answer(tmp_path):
    async with running_server(tmp_path, memory="auto") as (srv, addr):
        c = await V3Client.connect(addr)
        reply = await c.call(T.CHAT_TEXT, text="hello there")
        events = await c.turn_events(reply["turn_id"])
        trace = events[-1].body["context"]["pipeline"]
        assert list(trace) == ["route", "recall", "retrieve", "generate", "persist"]
        page = await c.call(T.HISTORY_REQUEST)
        assert page["messages"][-1]["metadata"]["context"]["pipeline"] == trace
        exported = await c.call(T.HISTORY_EXPORT, format="markdown")
        assert "<details><summary>Why this answer (context sent to the model)</summary>" in exported["content"]
        assert '"decision": "chat"' in exported["content"]
        await c.close()


async def test_the_trace_names_a_session_system_prompt_and_a_failed_answer_keeps_its_context(tmp_path):
    async with running_server(tmp_path, memory="auto") as (srv, addr):
        c = await V3Client.connect(addr)
        await c.call(T.SESSION_PROMPT, system_prompt="You are terse.")
        reply = await c.call(T.CHAT_TEXT, text="hello there")
        events = await c.turn_events(reply["turn_id"])
        assert events[-1].body["context"]["pipeline"]["recall"]["system_prompt"] == "session"
        reply = await c.call(T.CHAT_TEXT, text="!fail now")
        events = await c.turn_events(reply["turn_id"])
        assert events[-1].type == T.TURN_ERROR
        page = await c.call(T.HISTORY_REQUEST)
        failed = page["messages"][-1]["metadata"]
        assert failed["finish_reason"] == "error"
        assert list(failed["context"]["pipeline"]) == ["route", "recall", "retrieve", "generate", "persist"]
        assert failed["context"]["pipeline"]["generate"]["finish_reason"] == "error"   # the agent ran, and failed
        assert failed["context"]["pipeline"]["persist"]["finish_reason"] == "error"
        await c.close()


async def test_generate_adopts_the_agents_knowledge_route_and_citations():
    class KnowledgeAgent:
        async def run_turn(self, req, sink):
            req.context.metadata["route"] = {"route": "knowledge", "method": "keyword", "reason": "mentions the docs"}
            return TurnResult("per [runbook.md §Backups] ...", [ToolCall("c1", "search_knowledge", {"query": "q"})],
                              {}, "stop", {"citations": [{"citation": "[runbook.md §Backups]", "doc_id": "d1"}]})
    s = state("what do my documents say about backups?")
    s.context = BuiltContext([{"role": "user", "content": s.user_message.content}], {"pipeline": s.trace})
    await route(s)
    await retrieve_step()(s)
    await generate(s, KnowledgeAgent(), None)
    assert s.route == "knowledge"
    assert s.trace["route"] == {"decision": "knowledge", "method": "keyword", "reason": "mentions the docs",
                                "decided_by": "agent"}
    assert s.trace["retrieve"] == {"passages": ["[runbook.md §Backups]"], "via": "search_knowledge tool",
                                   "searches": 1}


async def test_recall_records_memory_items_cut_by_their_own_budget_and_k(store, tmp_path):
    cfg = MemoryConfig.from_dict({"summarization": {"enabled": False}, "user_memory": {"token_budget": 40, "k": 4}})
    mm = MemoryManager(cfg, store, OfflineStub(), None, "SYS", user_store=JsonUserMemoryStore(tmp_path / "um"))
    a = (await store.create("alice")).session_id
    for n in range(6):
        await store_turn(store, mm, a, "alice", f"The backup host of cluster {n} is bk-{n}-prod.", "ok")
    await mm.wait_idle()
    b = (await store.create("alice")).session_id
    user = await store.append(b, "user", "backup host of the cluster?")
    s = TurnState(b, "alice", "m", "t", user)
    await recall_step(mm)(s)
    rec = s.trace["recall"]
    cuts = {d["why"]: d for d in rec["dropped"] if d["what"] == "memory items"}
    assert set(cuts) == {"over user_memory.token_budget (40 tokens)", "past user_memory.k (4 items)"}
    assert len(rec["memory_items"]) + sum(d["count"] for d in cuts.values()) == 6
    ids = {i.id for i in await mm.user_memory.list("alice")}
    cut_ids = [i for d in cuts.values() for i in d["ids"]]
    assert set(rec["memory_items"]) | set(cut_ids) == ids and not set(rec["memory_items"]) & set(cut_ids)
    assert "bk-" not in str(s.trace)                           # ids only
    await mm.aclose()


async def test_recall_records_turns_cut_by_recall_budget_and_k_and_export_shows_them(tmp_path):
    sections = {"summarization": {"enabled": False}, "context": {"recent_turns": 1},
                "recall": {"k": 3, "token_budget": 50}, "user_memory": {"enabled": False}}
    async with running_server(tmp_path, memory="auto", sections=sections) as (srv, addr):
        c = await V3Client.connect(addr)
        for n in range(5):
            r = await c.call(T.CHAT_TEXT, text=f"the nginx workers on web{n} crashed with a segfault in module x{n}")
            await c.turn_events(r["turn_id"])
        r = await c.call(T.CHAT_TEXT, text="why did the nginx workers crash with a segfault?")
        events = await c.turn_events(r["turn_id"])
        rec = events[-1].body["context"]["pipeline"]["recall"]
        reasons = {d["why"] for d in rec["dropped"] if d["what"] == "recalled turns"}
        assert "recall.k (3) reached: lower-ranked turns were not considered" in reasons
        assert "over recall.token_budget (50 tokens)" in reasons
        [budget_cut] = [d for d in rec["dropped"] if d["why"] == "over recall.token_budget (50 tokens)"]
        assert budget_cut["count"] == len(budget_cut["ids"]) >= 1
        assert not set(budget_cut["ids"]) & set(rec["recalled"])
        exported = await c.call(T.HISTORY_EXPORT, format="json")
        assert "over recall.token_budget (50 tokens)" in exported["content"]
        assert "recall.k (3) reached" in exported["content"]
        await c.close()
