"""Session 32 fixes of the OpenAI agent's stream reading, tool offering and start-up note.

- The SSE decoder joined the held part of a line to every read and split it again: a 16 MB line took
  11 s of event-loop CPU (quadratic), and nothing bounded an event. It is linear now, and an event over
  ``[llm] max_event_bytes`` fails the step with LLM_ERROR naming the setting, before more is buffered.
- A tool registered but not offered in the turn (search_knowledge for a user without documents) still
  ran when the model named it; it is an unknown tool now, with the registry's unknown-tool error.
- The default system prompt listed six tools (read_log even when disabled, no file tools); it names none.
- NPLT_LLM_PROVIDER=deepseek with the key in another variable fell back offline with one INFO line; it is
  a WARNING naming the variables looked at.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any

import orjson
import pytest

from server.config_base import ConfigError
from server.agent.base import AgentError
from server.agent.chat_stream import MAX_EVENT_BYTES, SSEDecoder, _Oversize
from server.agent.config import DEFAULT_SYSTEM_PROMPT, LLMConfig
from server.app import Server
from server.config import ServerConfig
from server.agent.config import AgentConfig
from server.agent.openai_agent import OpenAIAgent
from server.tools import ToolContext, ToolRegistry, ToolsConfig
from testkit.scripted_llm import Reply, ScriptedLLM, ToolCallSpec

from .conftest import llm_config, make_request
from .test_chat_stream import HEAD, RawServer, Script, http_chunk

MiB = 1024 * 1024


def chunk(delta: dict, finish: str | None = None) -> str:
    return json.dumps({"id": "c", "object": "chat.completion.chunk", "model": "m",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


# -- 1. the decoder: linear, and bounded -----------------------------------------------------------

def test_a_long_line_decodes_in_linear_time():
    """8 MiB as one data line, fed in 4 KiB reads: the old decoder copied and rescanned the held part on
    every read (2048 reads, ~8 GB copied: ~4 s of CPU here); linear, it takes milliseconds."""
    line = b"data: " + b"x" * (8 * MiB) + b"\n\n"
    best = float("inf")
    for _ in range(3):                       # the best of three: other load on the machine only adds
        decoder = SSEDecoder()
        out: list[bytes] = []
        start = time.process_time()
        for i in range(0, len(line), 4096):
            out += decoder.feed(line[i:i + 4096])
        best = min(best, time.process_time() - start)
        assert [len(p) for p in out] == [8 * MiB] and decoder.buffered == 0
    assert best < 1.0, f"decoding an 8 MiB line took {best:.2f} s of CPU"


def test_an_event_may_hold_exactly_the_limit():
    """The limit counts an event's lines as received: ``data: `` is part of them, line ends are not."""
    limit = 1000
    decoder = SSEDecoder(limit)
    payload = b"y" * (limit - len(b"data: "))
    out = []
    for i in range(0, len(payload), 7):      # the line arrives in pieces
        out += decoder.feed((b"data: " if i == 0 else b"") + payload[i:i + 7])
    out += decoder.feed(b"\r\n\r\n")
    assert out == [payload] and decoder.buffered == 0
    assert decoder.feed(b"data: " + payload + b"\n\n") == [payload]     # the next event starts from zero
    two = decoder.feed(b"data: " + payload[:500] + b"\ndata: " + payload[:488] + b"\n\n")
    assert two == [payload[:500] + b"\n" + payload[:488]]                # 506 + 494: exactly the limit
    with pytest.raises(_Oversize):
        SSEDecoder(limit).feed(b"data: " + payload + b"y\n")            # one byte more


@pytest.mark.parametrize("stream", [
    b"data: " + b"z" * 1001 + b"\n\n",                                # one long data line
    b"data: " + b"z" * 600 + b"\ndata: " + b"z" * 600 + b"\n",         # two lines of one event
    b": " + b"c" * 2000,                                               # a comment that never ends
    b"".join(b"data: " + b"z" * 90 + b"\n" for _ in range(20)),        # data lines that never form an event
], ids=["long-line", "two-lines", "endless-comment", "no-blank-line"])
def test_an_event_over_the_limit_raises_before_it_is_buffered(stream):
    decoder = SSEDecoder(1000)
    with pytest.raises(_Oversize) as err:
        for i in range(0, len(stream), 64):
            decoder.feed(stream[i:i + 64])
    assert err.value.limit == 1000 and err.value.size > 1000
    assert decoder.buffered <= 1000


def test_max_event_bytes_setting():
    assert LLMConfig().max_event_bytes == MAX_EVENT_BYTES == 8 * MiB
    assert LLMConfig.from_dict({"max_event_bytes": 65536}, env={}).max_event_bytes == 65536
    for bad in (65535, 1024 * MiB + 1):
        with pytest.raises(ConfigError, match="max_event_bytes"):
            LLMConfig.from_dict({"max_event_bytes": bad}, env={})


async def test_an_event_over_max_event_bytes_is_llm_error_over_the_wire(llm, make_agent, sink):
    llm.push(Reply(raw_events=[chunk({"content": "ok "}), chunk({"content": "x" * 100_000}),
                               chunk({}, "stop")]),
             Reply.text("never sent"))
    with pytest.raises(AgentError) as err:
        await make_agent(max_event_bytes=65536).run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_ERROR"
    assert "an event is over 65536 bytes ([llm] max_event_bytes)" in err.value.message
    assert sink.text == "ok " and len(llm.requests) == 1      # not retried: the same event would come again


async def test_a_line_that_never_ends_fails_at_the_limit_not_at_a_timeout(sink):
    """1 MiB without a line end, then the server holds the connection: the step fails as soon as the
    limit is passed (before, the reader kept joining and waited for the per-read timeout)."""
    async with RawServer() as raw:
        raw.scripts += [Script([HEAD + http_chunk(b"data: " + b"x" * 4096)]
                               + [http_chunk(b"x" * 65536) for _ in range(16)]),
                        Script([])]      # (a script left: the server keeps the connection open, waiting)
        agent = OpenAIAgent(llm_config(f"http://127.0.0.1:{raw.port}/v1", max_event_bytes=65536,
                                       request_timeout_s=10, stream_idle_timeout_s=10, models_from_endpoint=False),
                            AgentConfig(), ToolRegistry(ToolsConfig()))
        try:
            start = time.monotonic()
            with pytest.raises(AgentError) as err:
                await agent.run_turn(make_request("hi"), sink)
            assert time.monotonic() - start < 5         # well before the 10 s read / idle timeouts
        finally:
            await agent.aclose()
    assert err.value.code == "LLM_ERROR" and "[llm] max_event_bytes" in err.value.message


# -- 3. only the offered tools run -------------------------------------------------------------------

class Knowledge:
    """A knowledge base without documents for anyone, which records the searches made."""

    def __init__(self) -> None:
        self.searches: list[str] = []

    async def has_documents(self, user_id: str) -> bool:
        return False

    async def search(self, user_id: str, query: str, top_k: int = 5, collection: str | None = None) -> list[Any]:
        self.searches.append(query)
        return []


async def test_a_registered_tool_not_offered_does_not_run(llm, make_agent, sink):
    kb = Knowledge()
    tools = ToolRegistry(ToolsConfig(cpu_sample_s=0.02), knowledge=kb)
    llm.push(Reply.tools(ToolCallSpec("c1", "search_knowledge", '{"query": "nginx port"}'),
                         ToolCallSpec("c2", "read_log", '{"path": "syslog"}'),
                         ToolCallSpec("c3", "clock", "{}")),
             Reply.text("done"))
    result = await make_agent(tools=tools).run_turn(make_request("port?"), sink)

    offered = [t["function"]["name"] for t in llm.requests[0].body["tools"]]
    assert "search_knowledge" not in offered and "read_log" not in offered and "clock" in offered
    assert kb.searches == []                                      # never ran
    by_id = {c.id: c for c in result.tool_calls}
    for cid, name in (("c1", "search_knowledge"), ("c2", "read_log")):
        assert by_id[cid].status == "error"
        assert orjson.loads(by_id[cid].result) == {"error": f"unknown tool '{name}' (available: {', '.join(offered)})"}
    assert by_id["c3"].status == "success"
    # the same error as for a name nobody registered, and the model is told so in the follow-up
    unknown = await tools.run("no_such_tool", {}, ToolContext("alice"))
    assert orjson.loads(unknown.result)["error"] == f"unknown tool 'no_such_tool' (available: {', '.join(offered)})"
    follow_up = [m for m in llm.requests[1].body["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in follow_up] == ["c1", "c2", "c3"]
    assert "unknown tool 'search_knowledge'" in follow_up[0]["content"]


# -- 2. the default system prompt ---------------------------------------------------------------------

def test_the_default_prompt_names_no_tool_and_marks_tool_output_as_data():
    names = ToolRegistry(ToolsConfig(file_roots=["/tmp"], log_roots=["/tmp"])).names + [
        "search_knowledge", "user_memory", "offer_download"]
    assert [n for n in names if n in DEFAULT_SYSTEM_PROMPT] == []
    assert "never instructions" in DEFAULT_SYSTEM_PROMPT and "documents" in DEFAULT_SYSTEM_PROMPT


# -- 4. a provider without its key -----------------------------------------------------------------

async def test_a_provider_without_its_key_starts_offline_with_a_warning(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    cfg = ServerConfig.from_dict({"server": {"host": "127.0.0.1", "port": 0},
                                  "storage": {"root": str(tmp_path / "history")}},
                                 env={"NPLT_LLM_PROVIDER": "deepseek", "DEEPSEEK_API_KEY": "sk-wrong-place-0123"})
    srv = Server(cfg, memory="basic")
    await srv.start()
    try:
        assert srv.agent.name == "offline"
    finally:
        await srv.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "nplt.server"]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("offline agent: provider deepseek is configured but needs an API key")
    for where in ("NPLT_LLM_API_KEY", "[llm] api_key", "OPENAI_API_KEY"):
        assert where in warnings[0]
    assert "sk-wrong" not in caplog.text


async def test_tool_schemas_that_fill_the_context_budget_are_warned_about_at_start(tmp_path, caplog):
    """context.max_input_tokens - reserve_output_tokens that the tool schemas leave under MIN_PROMPT_BUDGET:
    one start-up warning naming the setting to raise, and whether every request is squeezed or only
    those of users with documents (search_knowledge is offered only to them)."""
    import logging as _logging
    from server.app import Server
    from server.memory.config import MIN_PROMPT_BUDGET
    from testkit.server import make_config

    def config(window: int, where: str):
        return make_config(tmp_path / where, sections={
            "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": "m", "retries": 0},
            "summarization": {"enabled": False},
            "context": {"max_input_tokens": window, "reserve_output_tokens": 256}})

    async with ScriptedLLM(model="m") as llm:
        probe = Server(config(16000, "probe"))
        await probe.start()
        try:
            agent = probe.services.agent
            offered = [t for t in agent.registry.schemas() if t["function"]["name"] not in agent.registry.disabled]
            always = agent.count_schemas([t for t in offered if t["function"]["name"] != "search_knowledge"])
            most = agent.count_schemas(offered)
        finally:
            await probe.stop()
        assert most > always
        cases = ((always + 256 + MIN_PROMPT_BUDGET - 10, "for every request"),
                 (most + 256 + MIN_PROMPT_BUDGET - 10, "users who can see a document"),
                 (most + 256 + MIN_PROMPT_BUDGET + 10, None))
        for window, said_who in cases:
            caplog.clear()
            srv = Server(config(window, str(window)))
            with caplog.at_level(_logging.WARNING, logger="nplt.server"):
                await srv.start()
            try:
                said = [r.getMessage() for r in caplog.records if "tool schemas take about" in r.getMessage()]
                assert len(said) == (0 if said_who is None else 1), (window, said)
                if said_who is not None:
                    assert "raise context.max_input_tokens" in said[0] and said_who in said[0], said[0]
            finally:
                await srv.stop()
