"""The raw SSE path of the OpenAI agent: the decoder, and the agent against hand-framed HTTP on loopback.

The raw server below writes exact bytes (line endings, several events per write, dropped connections),
which the scripted LLM server does not vary.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import orjson
import pytest

from server.agent.base import AgentError
from server.agent.chat_stream import SSEDecoder
from server.agent.config import AgentConfig
from server.agent.openai_agent import OpenAIAgent
from server.tools import ToolRegistry, ToolsConfig
from testkit.scripted_llm import Reply

from .conftest import RecordingSink, llm_config, make_request

STREAM = (b": keep-alive comment\n\n"
          b"data: {\"a\": 1}\n\n"
          b"event: message\nid: 7\nretry: 100\ndata:{\"b\": 2}\n\n"
          b"data: first line\ndata:  second line\n\n"
          b"data: [DONE]\n\n")
EXPECTED = [b'{"a": 1}', b'{"b": 2}', b"first line\n second line", b"[DONE]"]


def decode_in_pieces(stream: bytes, cuts: list[int]) -> list[bytes]:
    decoder, out, start = SSEDecoder(), [], 0
    for cut in cuts + [len(stream)]:
        out += decoder.feed(stream[start:cut])
        start = cut
    return out + decoder.flush()


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_decoder_same_events_for_every_split_point(eol):
    stream = STREAM.replace(b"\n", eol)
    assert decode_in_pieces(stream, []) == EXPECTED
    for cut in range(1, len(stream)):
        assert decode_in_pieces(stream, [cut]) == EXPECTED, cut
    assert decode_in_pieces(stream, list(range(1, len(stream)))) == EXPECTED    # one byte per read


def test_decoder_flushes_an_unterminated_last_event_only_at_the_end():
    decoder = SSEDecoder()
    assert decoder.feed(b"data: {\"x\": 1}\n\ndata: [DONE]") == [b'{"x": 1}']
    assert decoder.feed(b"") == []
    assert decoder.flush() == [b"[DONE]"]
    assert decoder.flush() == []


# -- a raw HTTP/1.1 server on loopback ----------------------------------------------------------

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(delta: dict | None = None, finish: str | None = None, usage: dict | None = None, eol: bytes = b"\n") -> bytes:
    obj: dict = {"id": "c", "object": "chat.completion.chunk", "model": "m",
                 "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + orjson.dumps(obj) + eol + eol


@dataclass
class Script:
    writes: list[bytes]
    drop: bool = False       # close the connection after the writes (mid-body)


@dataclass
class RawServer:
    scripts: list[Script] = field(default_factory=list)
    connections: int = 0
    requests: int = 0
    port: int = 0
    _writers: set = field(default_factory=set)

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            while self.scripts:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                              if line.startswith(b"content-length:"))
                await reader.readexactly(length)
                self.requests += 1
                script = self.scripts.pop(0)
                for data in script.writes:
                    writer.write(data)
                    await writer.drain()
                if script.drop:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()


@pytest.fixture
async def raw():
    async with RawServer() as server:
        yield server


@pytest.fixture
async def raw_agent(raw):
    # models_from_endpoint off: the raw server answers completions only, and these tests count connections
    agent = OpenAIAgent(llm_config(f"http://127.0.0.1:{raw.port}/v1", retries=1, models_from_endpoint=False),
                        AgentConfig(),
                        ToolRegistry(ToolsConfig()))
    yield agent
    await agent.aclose()


async def test_crlf_events_many_per_write_relayed_one_delta_per_chunk(raw, raw_agent, sink):
    pieces = [f"w{i} " for i in range(300)] + ["中文", ""]
    body = b"".join(event({"content": p}, eol=b"\r\n") for p in pieces)
    tail = event(finish="stop", usage={"prompt_tokens": 5, "completion_tokens": 300, "total_tokens": 305},
                 eol=b"\r\n") + b"data: [DONE]\r\n\r\n"
    raw.scripts.append(Script([HEAD + http_chunk(body[:len(body) // 2]), http_chunk(body[len(body) // 2:]),
                               http_chunk(tail) + b"0\r\n\r\n"]))
    result = await raw_agent.run_turn(make_request("hi"), sink)
    assert sink.of("delta") == pieces[:-1]          # every non-empty content delta, unmerged, in order
    assert result.content == "".join(pieces)
    assert result.usage == {"llm_calls": 1, "prompt_tokens": 5, "completion_tokens": 300, "total_tokens": 305}


async def test_connection_is_reused_after_done(raw, raw_agent):
    for i in range(3):
        raw.scripts.append(Script([HEAD + http_chunk(event({"content": f"answer {i}"})),
                                   http_chunk(event(finish="stop") + b"data: [DONE]\n\n"), b"0\r\n\r\n"]))
    for i in range(3):
        assert (await raw_agent.run_turn(make_request("q"), RecordingSink())).content == f"answer {i}"
    assert raw.requests == 3 and raw.connections == 1


async def test_dropped_connection_after_text_is_llm_error_without_retry(raw, raw_agent, sink):
    raw.scripts += [Script([HEAD + http_chunk(event({"content": "partial"}))], drop=True),
                    Script([HEAD + http_chunk(event({"content": "again"}) + b"data: [DONE]\n\n") + b"0\r\n\r\n"])]
    with pytest.raises(AgentError) as err:
        await raw_agent.run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_ERROR"
    assert err.value.message == f"the connection to the model endpoint 127.0.0.1:{raw.port} was lost mid-answer"
    assert sink.text == "partial" and raw.requests == 1


async def test_dropped_connection_before_text_is_retried(raw, raw_agent, sink):
    raw.scripts += [Script([HEAD + http_chunk(event({"role": "assistant"}))], drop=True),
                    Script([HEAD + http_chunk(event({"content": "recovered"}) + b"data: [DONE]\n\n") + b"0\r\n\r\n"])]
    assert (await raw_agent.run_turn(make_request("hi"), sink)).content == "recovered"
    assert raw.requests == 2 and raw.connections == 2


# -- stream contents through the scripted server ------------------------------------------------

def chunk(delta: dict, finish: str | None = None, **extra) -> str:
    return json.dumps({"id": "c", "object": "chat.completion.chunk", "model": "m", **extra,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


async def test_error_event_after_text_fails_the_turn_without_retry(llm, make_agent, sink):
    llm.push(Reply(raw_events=[chunk({"content": "Half an ans"}),
                               json.dumps({"error": {"message": "upstream reset", "code": "503"}})]),
             Reply.text("never"))
    with pytest.raises(AgentError) as err:
        await make_agent().run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_ERROR" and "upstream reset" in err.value.message
    assert sink.text == "Half an ans" and len(llm.requests) == 1


async def test_undecodable_event_is_llm_error(llm, make_agent, sink):
    llm.push(Reply(raw_events=[chunk({"content": "ok"}), "{not json"]))
    with pytest.raises(AgentError) as err:
        await make_agent().run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_ERROR" and sink.text == "ok"


async def test_interleaved_tool_call_deltas_by_index_and_null_usage(llm, make_agent, sink):
    events = [chunk({"role": "assistant", "content": None}, usage=None),
              chunk({"tool_calls": [{"index": 1, "id": "c_b", "type": "function",
                                     "function": {"name": "clock", "arguments": ""}}]}, usage=None),
              chunk({"tool_calls": [{"index": 0, "id": "c_a", "type": "function",
                                     "function": {"name": "sys_monitor", "arguments": "{\"met"}}]}, usage=None),
              chunk({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}, usage=None),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": "ric\": \"load\"}"}}]}, usage=None),
              chunk({}, "tool_calls", usage={"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10})]
    llm.push(Reply(raw_events=events), Reply.text("Load is low."))
    result = await make_agent().run_turn(make_request("load?"), sink)

    assert [(c.id, c.tool_name, c.arguments, c.status) for c in result.tool_calls] == \
        [("c_a", "sys_monitor", {"metric": "load"}, "success"), ("c_b", "clock", {}, "success")]
    assert result.usage["prompt_tokens"] == 7 and result.usage["llm_calls"] == 2
    assert llm.requests[1].body["messages"][2]["tool_calls"] == [
        {"id": "c_a", "type": "function", "function": {"name": "sys_monitor", "arguments": "{\"metric\": \"load\"}"}},
        {"id": "c_b", "type": "function", "function": {"name": "clock", "arguments": "{}"}}]
