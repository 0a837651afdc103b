"""A scripted OpenAI-compatible HTTP server on 127.0.0.1:0 for agent tests (asyncio streams only).

Each test queues replies; every request takes the next one. Streamed replies are sent as SSE
(``text/event-stream``) with chunked transfer encoding, non-streamed ones as JSON with
Content-Length. Every request is recorded (method, path, headers, JSON body, arrival time).

Provider faults: ``Reply.fail`` (any status, e.g. 429 with ``retry-after``), ``Reply.stalled``
(hangs mid-stream), ``Reply.cut_stream`` (the body ends, or with ``abrupt`` the connection drops, before
finish_reason and [DONE]), ``Reply.html`` (HTTP 200 with a text/html page), ``Reply.malformed``
(an SSE event that is not JSON), and ``ToolCallSpec.huge`` (megabytes of tool arguments).
``GET /v1/models`` lists ``models`` (``models_stall`` makes it hang, ``models_status`` fail).

    async with ScriptedLLM() as llm:
        llm.push(Reply.text("Hel", "lo"), Reply.error(429, headers={"retry-after": "0.1"}))
        client = AsyncOpenAI(base_url=llm.base_url, api_key="k")
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 429: "Too Many Requests",
           500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}


@dataclass
class ToolCallSpec:
    """One tool call the scripted model makes; ``arguments`` is sent in ``pieces`` chunks."""
    id: str
    name: str
    arguments: str
    pieces: int = 3

    @classmethod
    def huge(cls, id: str, name: str, size: int, pieces: int = 64) -> ToolCallSpec:
        """A call whose JSON arguments are about ``size`` bytes (one long string field)."""
        return cls(id, name, '{"metric": "memory", "note": "' + "x" * max(0, size - 32) + '"}', pieces)


@dataclass
class Reply:
    """One scripted HTTP reply: an error, or a completion streamed as chunks."""
    status: int = 200
    chunks: list[dict[str, Any]] = field(default_factory=list)   # chat.completion.chunk "choices[0]" deltas
    finish_reason: str | None = "stop"
    usage: dict[str, int] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    error: str = ""
    stall: bool = False            # send headers + chunks, then hang until the server stops
    raw_events: list[str] | None = None   # SSE data lines sent verbatim (overrides chunks)
    cut: str | None = None         # "clean": the body ends without finish/[DONE]; "abrupt": the socket closes
    body: bytes | None = None      # a non-SSE 200 body (with ``content_type``), e.g. an HTML page
    content_type: str = "text/html; charset=utf-8"

    @classmethod
    def text(cls, *pieces: str, finish_reason: str = "stop", usage: dict[str, int] | None = None) -> Reply:
        chunks = [{"role": "assistant", "content": ""}] + [{"content": p} for p in pieces]
        return cls(chunks=chunks, finish_reason=finish_reason, usage=usage)

    @classmethod
    def tools(cls, *calls: ToolCallSpec, text: str = "", usage: dict[str, int] | None = None) -> Reply:
        """Tool calls as real servers stream them: id and name first, then the arguments in pieces."""
        chunks: list[dict[str, Any]] = [{"role": "assistant", "content": text or None}]
        for index, call in enumerate(calls):
            chunks.append({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                           "function": {"name": call.name, "arguments": ""}}]})
            step = max(1, -(-len(call.arguments) // max(1, call.pieces)))
            for start in range(0, len(call.arguments), step):
                chunks.append({"tool_calls": [{"index": index,
                                               "function": {"arguments": call.arguments[start:start + step]}}]})
        return cls(chunks=chunks, finish_reason="tool_calls", usage=usage)

    @classmethod
    def fail(cls, status: int, message: str = "scripted failure", headers: dict[str, str] | None = None) -> Reply:
        return cls(status=status, error=message, headers=dict(headers or {}))

    @classmethod
    def cut_stream(cls, *pieces: str, abrupt: bool = False) -> Reply:
        """Every piece, then the stream stops with neither finish_reason nor [DONE]."""
        reply = cls.text(*pieces)
        reply.cut = "abrupt" if abrupt else "clean"
        return reply

    @classmethod
    def html(cls, page: str = "<html><body><h1>Welcome to the captive portal</h1></body></html>") -> Reply:
        """HTTP 200 with an HTML page instead of a completion (a proxy or portal in the way)."""
        return cls(body=page.encode())

    @classmethod
    def malformed(cls, *pieces: str, bad: str = '{"choices": [{"delta": {"content": "x"') -> Reply:
        """Every piece as valid chunks, then an SSE event whose data is not JSON."""
        reply = cls.text(*pieces)
        reply.raw_events = [json.dumps({"id": "chatcmpl-scripted", "object": "chat.completion.chunk",
                                        "choices": [{"index": 0, "delta": d, "finish_reason": None}]})
                            for d in reply.chunks] + [bad]
        return reply

    @classmethod
    def stalled(cls, *pieces: str) -> Reply:
        reply = cls.text(*pieces)
        reply.stall = True
        return reply


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float


class ScriptedLLM:
    """The server. Use as an async context manager; ``base_url`` ends in ``/v1``."""

    def __init__(self, model: str = "scripted-model") -> None:
        self.model = model
        self.models: list[str] = [model]      # what GET /v1/models lists
        self.models_stall = False             # GET /v1/models hangs until the server stops
        self.models_status = 200
        self.requests: list[Recorded] = []
        self.model_requests: list[Recorded] = []
        self._queue: deque[Reply] = deque()
        self._server: asyncio.base_events.Server | None = None
        self._stopping = asyncio.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        self._changed = asyncio.Condition()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def push(self, *replies: Reply) -> None:
        self._queue.extend(replies)

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def wait_requests(self, n: int, timeout: float = 10.0) -> None:
        """Wait until at least ``n`` requests have arrived."""
        async with asyncio.timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(lambda: len(self.requests) >= n)

    async def __aenter__(self) -> ScriptedLLM:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stopping.set()
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    # -- HTTP ------------------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while not self._stopping.is_set():
                request = await self._read_request(reader)
                if request is None:
                    break
                listing = request.method == "GET" and request.path.endswith("/models")
                async with self._changed:
                    # kept apart: ``requests`` (and ``_respond``, which subclasses time) are completions
                    (self.model_requests if listing else self.requests).append(request)
                    self._changed.notify_all()
                keep = await (self._list_models(writer) if listing else self._respond(request, writer))
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _read_request(self, reader: asyncio.StreamReader) -> Recorded | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        body = json.loads(raw) if raw else {}
        return Recorded(method, path, headers, body, time.monotonic())

    async def _list_models(self, writer: asyncio.StreamWriter) -> bool:
        if self.models_stall:
            await self._stopping.wait()
            return False
        if self.models_status != 200:
            await self._send_json(writer, self.models_status, {"error": {"message": "no models here"}})
            return True
        await self._send_json(writer, 200, {"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "scripted"} for m in self.models]})
        return True

    async def _respond(self, req: Recorded, writer: asyncio.StreamWriter) -> bool:
        if not req.path.endswith("/chat/completions"):
            await self._send_json(writer, 404, {"error": {"message": f"no route {req.path}", "type": "not_found"}})
            return True
        if not self._queue:
            await self._send_json(writer, 500, {"error": {"message": "script exhausted", "type": "server_error"}})
            return True
        reply = self._queue.popleft()
        if reply.body is not None:
            head = ["HTTP/1.1 200 OK", f"content-length: {len(reply.body)}"]
            if reply.content_type:                 # "": no content-type header at all
                head.append(f"content-type: {reply.content_type}")
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + reply.body)
            await writer.drain()
            return True
        if reply.status != 200:
            await self._send_json(writer, reply.status, {"error": {"message": reply.error, "type": "scripted"}},
                                  reply.headers)
            return True
        if not req.body.get("stream"):
            await self._send_json(writer, 200, self._completion(reply))
            return True
        return await self._send_stream(writer, req, reply)

    async def _send_json(self, writer: asyncio.StreamWriter, status: int, obj: Any,
                         extra: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        head = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}", "content-type: application/json",
                f"content-length: {len(data)}"] + [f"{k}: {v}" for k, v in (extra or {}).items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        await writer.drain()

    async def _send_stream(self, writer: asyncio.StreamWriter, req: Recorded, reply: Reply) -> bool:
        head = ["HTTP/1.1 200 OK", "content-type: text/event-stream", "transfer-encoding: chunked",
                "cache-control: no-cache"] + [f"{k}: {v}" for k, v in reply.headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        events = reply.raw_events if reply.raw_events is not None else self._events(req, reply)
        for i, event in enumerate(events):
            if (reply.stall or reply.cut) and i == len(events) - 1 and reply.raw_events is None:
                break   # stalled or cut: never send the final chunk nor [DONE]
            await self._chunk(writer, f"data: {event}\n\n".encode())
        if reply.cut == "clean":
            await self._chunk(writer, b"")       # a well-formed end of the body, but no finish nor [DONE]
            return True
        if reply.cut == "abrupt":
            return False                         # the connection closes in the middle of the body
        if reply.stall:
            await self._stopping.wait()
            return False
        await self._chunk(writer, b"data: [DONE]\n\n")
        await self._chunk(writer, b"")
        return True

    @staticmethod
    async def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await writer.drain()

    def _base(self) -> dict[str, Any]:
        return {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": self.model}

    def _events(self, req: Recorded, reply: Reply) -> list[str]:
        out = []
        for delta in reply.chunks:
            out.append(json.dumps({**self._base(), "choices": [{"index": 0, "delta": delta,
                                                                 "finish_reason": None}]}))
        out.append(json.dumps({**self._base(), "choices": [{"index": 0, "delta": {},
                                                             "finish_reason": reply.finish_reason}]}))
        include_usage = (req.body.get("stream_options") or {}).get("include_usage")
        if reply.usage and include_usage:
            out.append(json.dumps({**self._base(), "choices": [], "usage": reply.usage}))
        return out

    def _completion(self, reply: Reply) -> dict[str, Any]:
        """The non-streamed form of a reply (text and tool calls merged)."""
        text = "".join(c.get("content") or "" for c in reply.chunks)
        calls: dict[int, dict[str, Any]] = {}
        for c in reply.chunks:
            for tc in c.get("tool_calls") or ():
                slot = calls.setdefault(tc["index"], {"id": "", "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return {"id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
                "model": self.model, "usage": reply.usage,
                "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}]}


class StreamedOnlyLLM(ScriptedLLM):
    """A scripted server whose script is for the streamed requests (the turns) only: anything else
    (a title, a summary) is answered ``side_text`` without taking a reply or being recorded."""

    def __init__(self, model: str = "scripted-model", side_text: str = "A summary.") -> None:
        super().__init__(model)
        self.side_text = side_text

    async def _respond(self, req: Recorded, writer: asyncio.StreamWriter) -> bool:
        if not req.body.get("stream"):
            self.requests.remove(req)
            self._queue.appendleft(Reply.text(self.side_text))
        return await super()._respond(req, writer)
