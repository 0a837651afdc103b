"""The tools a model is offered are the tools that can work here (session 32).

With ``tools.file_roots = []`` and ``tools.log_roots = []`` (the documented "disabled"), read_log,
list_dir, read_file and search_files were still in every request's ``tools`` (~1 k tokens each turn),
and calling them only answered "disabled". They are offered only when their roots are configured; the
unknown-tool error and the schema token count follow the same list. Checked on what reaches the
scripted endpoint, through the agent and through a whole server.
"""
from __future__ import annotations

from typing import Any

import orjson
import pytest

from protocol import MsgType
from server.agent.base import BuiltContext, TurnRequest
from server.agent.config import AgentConfig, LLMConfig
from server.agent.openai_agent import OpenAIAgent
from server.app import Server
from server.config import ServerConfig
from server.tools import ToolContext, ToolRegistry, ToolsConfig
from storage.models import ChatMessage
from testkit.scripted_llm import Reply, ScriptedLLM, ToolCallSpec
from testkit.server import V3Client

ALWAYS = ["sys_monitor", "processes", "network_check", "history_search", "clock"]
FILES = ["list_dir", "read_file", "search_files"]


class Sink:
    async def status(self, status: str, detail: str | None = None) -> None: ...
    async def tool_call(self, call: Any) -> None: ...
    async def tool_result(self, call: Any) -> None: ...
    async def delta(self, text: str) -> None: ...
    async def notice(self, level: str, code: str, message: str) -> None: ...


def request() -> TurnRequest:
    return TurnRequest(session_id="s_1", user_id="alice", model="m", turn_id="t_1",
                       user_message=ChatMessage(id=1, role="user", content="hi"),
                       context=BuiltContext(messages=[{"role": "user", "content": "hi"}], metadata={}))


def names(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools", [])]


@pytest.mark.parametrize("roots,expected", [
    ({}, ALWAYS),
    ({"log_roots": ["LOGS"]}, ["sys_monitor", "processes", "network_check", "read_log", "history_search", "clock"]),
    ({"file_roots": ["FILES"]}, ["sys_monitor", "processes", "network_check", *FILES, "history_search", "clock"]),
    ({"log_roots": ["LOGS"], "file_roots": ["FILES"]},
     ["sys_monitor", "processes", "network_check", "read_log", *FILES, "history_search", "clock"]),
])
async def test_the_request_offers_exactly_the_enabled_tools(tmp_path, roots, expected):
    for d in ("LOGS", "FILES"):
        (tmp_path / d).mkdir()
    cfg = ToolsConfig(cpu_sample_s=0.02, **{k: [str(tmp_path / v[0])] for k, v in roots.items()})
    tools = ToolRegistry(cfg)
    async with ScriptedLLM(model="m") as llm:
        agent = OpenAIAgent(LLMConfig.from_dict({"base_url": llm.base_url, "model": "m", "retries": 0,
                                                 "models_from_endpoint": False}, env={"NPLT_LLM_API_KEY": "sk-t"}),
                            AgentConfig(), tools)
        try:
            llm.push(Reply.tools(ToolCallSpec("c1", "read_log", '{"path": "x.log"}')), Reply.text("ok"))
            result = await agent.run_turn(request(), Sink())
            assert names(llm.requests[0].body) == expected == names(llm.requests[1].body)
            assert await tools.offered("alice") == expected
            assert await agent.tool_schema_tokens("alice") == agent.count_schemas(llm.requests[0].body["tools"])
        finally:
            await agent.aclose()
    [call] = result.tool_calls
    error = orjson.loads(call.result)["error"]
    if "log_roots" in roots:       # offered: it ran (and found no such file)
        assert not error.startswith("unknown tool")
    else:                          # not offered: not run, the unknown-tool error naming what is offered
        assert error == f"unknown tool 'read_log' (available: {', '.join(expected)})"
    unknown = await tools.run("nope", {}, ToolContext("alice"))
    assert orjson.loads(unknown.result)["error"] == f"unknown tool 'nope' (available: {', '.join(expected)})"


async def test_a_server_without_roots_offers_no_file_or_log_tool(tmp_path):
    async with ScriptedLLM(model="m") as llm:
        cfg = ServerConfig.from_dict({
            "server": {"host": "127.0.0.1", "port": 0}, "storage": {"root": str(tmp_path / "history")},
            "llm": {"base_url": llm.base_url, "api_key": "sk-test-123", "model": "m", "retries": 0,
                    "models_from_endpoint": False},
            "tools": {"file_roots": [], "log_roots": []}, "summarization": {"enabled": False}}, env={})
        srv = Server(cfg, memory="basic")
        host, port = await srv.start()
        try:
            c = await V3Client.connect((host, port))
            llm.push(Reply.text("hello"))
            r = await c.call(MsgType.CHAT_TEXT, text="hi")
            end = (await c.turn_events(r["turn_id"]))[-1]
            assert end.type == MsgType.TURN_END
            offered = names(llm.requests[-1].body)
            await c.close()
        finally:
            await srv.stop()
    # no document: no search_knowledge; the server wires an offer service and a memory layer
    assert offered == [*ALWAYS, "offer_download", "user_memory"]
