"""Session 34, the real-LLM agent on the wire (the real openai client against the scripted
OpenAI-compatible server on loopback):

* a tool call whose arguments are not a JSON object (cut at max_tokens) goes back to the model as
  a JSON object: a vLLM-like endpoint, which JSON-parses every historical call's arguments and
  answers 400, accepts the follow-up (before, it failed the turn with "Unterminated string");
* Ollama-style parallel calls, every one streamed with index 0 and its own id, are separate calls
  (before: one call "clocksys_monitor" with arguments "{}{...}"), and a whole call sent twice with
  one id (and no index) is two calls, not arguments "{}{}";
* the instruction of the last request (max_iterations, context budget) keeps the question's
  language: Chinese for a Chinese question;
* ``complete`` raises ``IncompleteAnswer`` for an answer cut by ``length`` or withheld by the
  content filter (a summary cut mid-sentence was stored as the summary).
"""
from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from server.agent.base import AgentError, IncompleteAnswer
from server.agent.config import AgentConfig
from server.agent.intents import is_chinese
from server.agent.tool_calls import ToolCallAssembler
from server.memory.distill_model import SOURCE_RULES, distill_by_model
from testkit.scripted_llm import Recorded, Reply, ScriptedLLM, ToolCallSpec

from .conftest import llm_config, make_request

CUT_ARGS = '{"sort_by": "cpu", "name": "ngi'        # a call cut at max_tokens mid-arguments


class StrictLLM(ScriptedLLM):
    """A vLLM-like endpoint: every historical ``tool_calls[].function.arguments`` must be a JSON
    object (vLLM json-parses them before the chat template), else HTTP 400 with the parser's message."""

    rejected: list[str]

    async def _respond(self, req: Recorded, writer: Any) -> bool:
        self.rejected = getattr(self, "rejected", [])
        for m in req.body.get("messages") or ():
            for tc in m.get("tool_calls") or ():
                args = tc["function"]["arguments"]
                try:
                    ok = isinstance(json.loads(args), dict)
                    why = "arguments are not a JSON object"
                except ValueError as e:
                    ok, why = False, str(e)
                if not ok:
                    self.rejected.append(why)
                    if self._queue:
                        self._queue.popleft()
                    await self._send_json(writer, 400, {"error": {"message": why, "type": "BadRequestError",
                                                                  "code": 400}})
                    return True
        return await super()._respond(req, writer)


@pytest.fixture
async def strict_llm():
    async with StrictLLM() as server:
        yield server


@pytest.fixture
async def strict_agent(strict_llm, registry):
    from server.agent.openai_agent import OpenAIAgent
    agents = []

    def factory(agent_cfg: AgentConfig | None = None, **overrides: Any) -> OpenAIAgent:
        a = OpenAIAgent(llm_config(strict_llm.base_url, **overrides), agent_cfg or AgentConfig(), registry)
        agents.append(a)
        return a
    yield factory
    for a in agents:
        await a.aclose()


# -- 1. arguments that are not a JSON object --------------------------------------------------------

async def test_arguments_cut_at_max_tokens_go_back_as_a_json_object(strict_llm, strict_agent, sink):
    strict_llm.push(Reply.tools(ToolCallSpec("t1", "processes", CUT_ARGS)), Reply.text("No nginx data."))
    result = await strict_agent().run_turn(make_request("which nginx processes use the most cpu?"), sink)

    assert strict_llm.rejected == []                         # the vLLM-like endpoint took the follow-up
    assert result.content == "No nginx data." and result.finish_reason == "stop"
    [call] = result.tool_calls
    assert call.status == "error" and "not valid JSON" in orjson.loads(call.result)["error"]
    assert call.arguments == {"_raw_arguments": CUT_ARGS}   # stored as the model sent it
    follow_up = strict_llm.requests[1].body["messages"]
    sent = follow_up[2]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(sent) == {"invalid_arguments": CUT_ARGS}
    assert follow_up[3]["tool_call_id"] == "t1" and "not valid JSON" in follow_up[3]["content"]


@pytest.mark.parametrize("raw, wire", [
    ('{"metric": cpu', {"invalid_arguments": '{"metric": cpu'}),
    ('[1, 2]', {"invalid_arguments": "[1, 2]"}),                 # JSON, but not an object
    ('"memory"', {"invalid_arguments": '"memory"'}),
])
async def test_every_argument_text_on_the_wire_is_a_json_object(strict_llm, strict_agent, sink, raw, wire):
    strict_llm.push(Reply.tools(ToolCallSpec("a1", "sys_monitor", raw), ToolCallSpec("a2", "clock", "{}")),
                    Reply.text("done"))
    result = await strict_agent().run_turn(make_request("cpu?"), sink)
    assert strict_llm.rejected == [] and result.content == "done"
    calls = strict_llm.requests[1].body["messages"][2]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [wire, {}]
    assert calls[1]["function"]["arguments"] == "{}"              # a valid object goes as the model sent it


async def test_huge_invalid_arguments_are_cut_on_the_wire(llm, make_agent, sink):
    from server.agent.transcript import MAX_INVALID_ARGUMENTS_CHARS
    raw = '{"note": "' + "x" * 50_000                               # never closed
    llm.push(Reply.tools(ToolCallSpec("h1", "clock", raw, pieces=10)), Reply.text("ok"))
    await make_agent().run_turn(make_request("time?"), sink)
    sent = json.loads(llm.requests[1].body["messages"][2]["tool_calls"][0]["function"]["arguments"])
    assert len(sent["invalid_arguments"]) == MAX_INVALID_ARGUMENTS_CHARS
    assert sent["invalid_arguments"].endswith("…") and raw.startswith(sent["invalid_arguments"][:-1])


# -- 2. parallel calls streamed at index 0 (Ollama), a whole call sent twice --------------------------

def _chunks(*tool_deltas: dict[str, Any]) -> Reply:
    return Reply(chunks=[{"role": "assistant", "content": ""}] + [{"tool_calls": [d]} for d in tool_deltas],
                 finish_reason="tool_calls")


async def test_ollama_parallel_calls_all_at_index_0_are_separate_calls(llm, make_agent, sink):
    llm.push(_chunks({"index": 0, "id": "call_a", "type": "function", "function": {"name": "clock", "arguments": "{}"}},
                     {"index": 0, "id": "call_b", "type": "function",
                      "function": {"name": "sys_monitor", "arguments": '{"metric": "memory"}'}}),
             Reply.text("It is noon and memory is fine."))
    result = await make_agent().run_turn(make_request("what time is it and how much memory is free?"), sink)

    assert [(c.id, c.tool_name, c.arguments, c.status) for c in result.tool_calls] == [
        ("call_a", "clock", {}, "success"), ("call_b", "sys_monitor", {"metric": "memory"}, "success")]
    follow_up = llm.requests[1].body["messages"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in follow_up[2]["tool_calls"]] == [
        ("call_a", "clock", "{}"), ("call_b", "sys_monitor", '{"metric": "memory"}')]
    assert [(m["role"], m["tool_call_id"]) for m in follow_up[3:]] == [("tool", "call_a"), ("tool", "call_b")]
    assert "memory" in orjson.loads(follow_up[4]["content"])


async def test_index_0_calls_streamed_in_pieces_keep_their_own_arguments(llm, make_agent, sink):
    llm.push(_chunks({"index": 0, "id": "p1", "function": {"name": "sys_monitor", "arguments": ""}},
                     {"index": 0, "function": {"arguments": '{"metric":'}},
                     {"index": 0, "function": {"arguments": ' "cpu"}'}},
                     {"index": 0, "id": "p2", "function": {"name": "sys_monitor", "arguments": '{"met'}},
                     {"index": 0, "function": {"arguments": 'ric": "load"}'}}),
             Reply.text("ok"))
    result = await make_agent().run_turn(make_request("cpu and load?"), sink)
    assert [(c.id, c.arguments) for c in result.tool_calls] == [("p1", {"metric": "cpu"}), ("p2", {"metric": "load"})]


async def test_a_whole_call_sent_twice_with_one_id_is_two_calls(llm, make_agent, sink):
    dup = {"id": "dup", "type": "function", "function": {"name": "clock", "arguments": "{}"}}
    llm.push(Reply(chunks=[{"role": "assistant"}, {"tool_calls": [dup]}, {"tool_calls": [dup]}], finish_reason="stop"),
             Reply.text("C done"))
    result = await make_agent().run_turn(make_request("dups"), sink)

    assert [(c.tool_name, c.arguments, c.status) for c in result.tool_calls] == [("clock", {}, "success")] * 2
    ids = [c.id for c in result.tool_calls]
    assert ids[0] == "dup" and ids[1] != "dup" and ids[1].startswith("call_")
    sent = llm.requests[1].body["messages"][2]["tool_calls"]
    assert [(c["id"], c["function"]["arguments"]) for c in sent] == [(i, "{}") for i in ids]


def test_a_name_repeated_in_every_delta_is_still_one_call():
    a = ToolCallAssembler()
    # a server repeating the name with each piece, then a last name-only delta after the whole object
    for piece in ('{"metric": {', '"x": 1}', ', "y": {}}'):
        a.add([{"index": 0, "id": "r1", "function": {"name": "sys_monitor", "arguments": piece}}])
    a.add([{"index": 0, "function": {"name": "sys_monitor"}}])
    a.add([{"index": 0, "function": {"name": "sys_monitor", "arguments": "  "}}])
    [call] = a.calls()
    assert (call.id, call.name, call.arguments) == ("r1", "sys_monitor", '{"metric": {"x": 1}, "y": {}}  ')


def test_index_less_calls_without_ids_are_split_at_a_repeated_whole_call():
    a = ToolCallAssembler()
    a.add([{"function": {"name": "clock", "arguments": "{}"}}])
    a.add([{"function": {"name": "sys_monitor", "arguments": '{"metric": "cpu"}'}}])
    calls = a.calls()
    assert [(c.name, c.arguments) for c in calls] == [("clock", "{}"), ("sys_monitor", '{"metric": "cpu"}')]
    assert len({c.id for c in calls}) == 2


# -- 3. the last request keeps the question's language ---------------------------------------------

async def test_the_last_request_of_a_chinese_question_asks_in_chinese(llm, make_agent, sink):
    llm.push(Reply.tools(ToolCallSpec("z", "clock", "{}")), Reply.text("现在是中午。"))
    result = await make_agent(AgentConfig(max_iterations=1)).run_turn(make_request("服务器现在几点？内存够用吗？"), sink)

    assert result.finish_reason == "max_iterations"
    final = llm.requests[-1].body
    assert final["tool_choice"] == "none"
    last = final["messages"][-1]
    assert last["role"] == "user" and is_chinese(last["content"]) and "中文" in last["content"]
    assert "tool" not in last["content"].lower()
    assert [m["role"] for m in final["messages"]] == ["system", "user", "assistant", "tool", "user"]


async def test_the_last_request_of_an_english_question_asks_for_the_question_s_language(llm, make_agent, sink):
    llm.push(Reply.tools(ToolCallSpec("z", "clock", "{}")), Reply.text("It is noon."))
    await make_agent(AgentConfig(max_iterations=1)).run_turn(make_request("what time is it?"), sink)
    last = llm.requests[-1].body["messages"][-1]
    assert last["role"] == "user" and not is_chinese(last["content"])
    assert "Answer in the language the conversation asked for, else in the language of the user's question." \
        in last["content"]


def test_the_last_instruction_defers_to_the_language_the_conversation_asked_for():
    """A system prompt's "Always answer in French" or a remembered "answer in Chinese" is not overridden by the
    last instruction, and a Japanese question (kanji and kana) is never told to be answered in Chinese."""
    from server.agent.openai_agent import final_prompt
    ja = final_prompt("max_iterations", "サーバーの時刻を確認して、何時か教えてください")
    assert not is_chinese(ja) and "the language the conversation asked for" in ja
    zh = final_prompt("max_iterations", "服务器现在几点？")
    assert "用对话要求的语言回答" in zh and "没有要求时用中文回答" in zh


def test_the_budget_instruction_is_chinese_for_a_chinese_question():
    from server.agent.openai_agent import final_prompt
    zh, en = final_prompt("context_budget", "磁盘还剩多少？"), final_prompt("context_budget", "disk?")
    assert is_chinese(zh) and "上下文" in zh and "中文" in zh
    assert "context window" in en and "language of the user's question" in en
    assert final_prompt("max_iterations", "磁盘还剩多少？") != zh


# -- 5. complete: an unfinished answer is an error ---------------------------------------------------

@pytest.mark.parametrize("reason", ["length", "content_filter"])
async def test_complete_raises_for_an_answer_the_endpoint_did_not_finish(llm, make_agent, reason):
    llm.push(Reply.text("The user runs nginx on web-01 and the backups go to", finish_reason=reason))
    with pytest.raises(IncompleteAnswer) as info:
        await make_agent(max_tokens=64).complete([{"role": "user", "content": "summarize"}])
    err = info.value
    assert isinstance(err, AgentError) and err.code == "LLM_ERROR"
    assert err.finish_reason == reason and err.content.startswith("The user runs nginx")
    assert f"finish_reason {reason}" in err.message and "127.0.0.1" in err.message
    if reason == "length":
        assert "max_tokens limit (64)" in err.message
    assert len(llm.requests) == 1 and llm.requests[0].body.get("stream") is not True   # not retried


async def test_complete_returns_a_finished_answer(llm, make_agent):
    llm.push(Reply.text("A whole summary.", finish_reason="stop"))
    assert await make_agent().complete([{"role": "user", "content": "summarize"}]) == "A whole summary."


async def test_distillation_falls_back_to_the_rules_when_the_answer_was_filtered(llm, make_agent):
    answer = json.dumps([{"kind": "fact", "text": "The prod DB host is db-model-99"}])
    llm.push(Reply.text(answer, finish_reason="content_filter"))
    items, source = await distill_by_model(make_agent(), None, "The prod DB host is db-prod-42.")
    assert len(llm.requests) == 1
    assert source == SOURCE_RULES
    assert all("db-model-99" not in text for _, text in items)



def test_an_arguments_piece_under_another_id_continues_the_call():
    # (a server that sends a fresh id with every delta: only a delta naming a function opens a call)
    a = ToolCallAssembler()
    a.add([{"index": 0, "id": "i1", "function": {"name": "sys_monitor", "arguments": '{"metric": '}}])
    a.add([{"index": 0, "id": "i2", "function": {"arguments": '"cpu"}'}}])
    [call] = a.calls()
    assert (call.name, call.arguments) == ("sys_monitor", '{"metric": "cpu"}')
