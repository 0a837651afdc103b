"""Fast reading of a streamed chat completion: raw SSE bytes to plain dict chunks.

The openai SDK builds a typed pydantic object per SSE chunk, which caps a stream at a few thousand
chunks per second. The agent instead opens the stream through the SDK's public raw-response API
(``client.chat.completions.with_streaming_response.create(..., stream=True)``: same auth, base_url,
timeouts, and non-2xx statuses still raised as ``APIStatusError`` subclasses on entry) and reads the
body here: bytes are split into SSE events and each ``data:`` payload is decoded with orjson.

Errors are mapped like the SDK's own stream: a read timeout (the per-read timeout, i.e. a stalled
stream) becomes ``openai.APITimeoutError``, a broken connection ``StreamInterrupted`` (an
``openai.APIConnectionError``), an ``{"error": ...}`` event ``openai.APIError`` with the server's
message, undecodable data a ValueError (orjson.JSONDecodeError).
"""
from __future__ import annotations

import asyncio
import ssl
from typing import Any, AsyncIterator

import openai
import orjson

try:                                 # the HTTP library the installed openai SDK is built on
    import httpx2 as _http
except ImportError:                  # pragma: no cover - openai releases built on httpx
    import httpx as _http            # type: ignore[no-redef]

DONE = b"[DONE]"
DRAIN_AFTER_DONE_S = 0.1   # after [DONE], wait this long at most for the body's end (keeps the connection reusable)
_TRANSPORT_ERRORS = (_http.RequestError, ssl.SSLError)


class StreamInterrupted(openai.APIConnectionError):
    """The connection failed after the response started (mid-stream), not while connecting."""


class SSEDecoder:
    """Incremental Server-Sent Events decoder: bytes in, one ``data`` payload (bytes) per event out.

    Lines end with LF, CRLF or CR; several ``data:`` lines of one event are joined with LF; comments
    and the ``event``/``id``/``retry`` fields are ignored (chat completion streams do not use them).
    """

    __slots__ = ("_rest", "_data")

    def __init__(self) -> None:
        self._rest = b""                 # an incomplete last line
        self._data: list[bytes] = []     # data lines of the event being read

    def feed(self, chunk: bytes) -> list[bytes]:
        """The payloads of the events completed by ``chunk``."""
        buf = self._rest + chunk if self._rest else chunk
        held = b""
        if b"\r" in buf:
            if buf.endswith(b"\r"):      # maybe the first half of a CRLF split across reads
                buf, held = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._rest = lines.pop() + held
        return self._lines(lines)

    def flush(self) -> list[bytes]:
        """At the end of the body: the last line and event even without their terminators."""
        rest, self._rest = self._rest.rstrip(b"\r"), b""
        out = self._lines([rest] if rest else [])
        if self._data:
            out.append(b"\n".join(self._data))
            self._data = []
        return out

    def _lines(self, lines: list[bytes]) -> list[bytes]:
        out: list[bytes] = []
        data = self._data
        for line in lines:
            if not line:                          # blank line: dispatch the event
                if data:
                    out.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data.clear()
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value[:1] == b" " else value)
        return out


def _stream_error(chunk: dict[str, Any], request: Any) -> openai.APIError:
    error = chunk["error"]
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str) or not message:
        message = "An error occurred during streaming"
    return openai.APIError(message, request, body=error)


def _decode(payloads: list[bytes], request: Any) -> tuple[list[dict[str, Any]], bool]:
    """(the JSON object chunks of ``payloads``, whether ``[DONE]`` was reached); an error event raises."""
    batch: list[dict[str, Any]] = []
    for payload in payloads:
        if payload.startswith(DONE):
            return batch, True
        chunk = orjson.loads(payload)
        if type(chunk) is dict:
            if chunk.get("error"):
                raise _stream_error(chunk, request)
            batch.append(chunk)
    return batch, False


async def iter_chunks(response: Any) -> AsyncIterator[list[dict[str, Any]]]:
    """The chunks of a streamed completion, one list per network read, up to ``[DONE]``.

    ``response`` is the ``AsyncAPIResponse`` of ``with_streaming_response``; the caller closes it.
    """
    request = response.http_request
    decoder = SSEDecoder()
    body = response.iter_bytes()
    done = False
    try:
        try:
            async for raw in body:
                batch, done = _decode(decoder.feed(raw), request)
                if batch:
                    yield batch
                if done:
                    break
            else:
                batch, done = _decode(decoder.flush(), request)
                if batch:
                    yield batch
        except _http.TimeoutException as e:
            raise openai.APITimeoutError(request=request) from e
        except _TRANSPORT_ERRORS as e:
            raise StreamInterrupted(message="The connection was lost mid-stream.", request=request) from e
        if done:
            await _drain(body)
    finally:
        await body.aclose()


async def _drain(body: AsyncIterator[bytes]) -> None:
    """Read what follows ``[DONE]`` (normally just the end of the chunked body), briefly."""
    try:
        async with asyncio.timeout(DRAIN_AFTER_DONE_S):
            async for _ in body:
                pass
    except (TimeoutError, *_TRANSPORT_ERRORS):
        pass   # the answer is complete: a slow or broken tail only costs connection reuse
