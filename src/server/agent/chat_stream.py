"""Fast reading of a streamed chat completion: raw SSE bytes to plain dict chunks.

The openai SDK builds a typed pydantic object per SSE chunk, which caps a stream at a few thousand
chunks per second. The agent instead opens the stream through the SDK's public raw-response API
(``client.chat.completions.with_streaming_response.create(..., stream=True)``: same auth, base_url,
timeouts, and non-2xx statuses still raised as ``APIStatusError`` subclasses on entry) and reads the
body here: bytes are split into SSE events and each ``data:`` payload is decoded with orjson.

Errors are mapped like the SDK's own stream: a read timeout (the per-read timeout, i.e. a stalled
stream) becomes ``StreamStalled`` (an ``openai.APITimeoutError``), a broken connection ``StreamInterrupted`` (an
``openai.APIConnectionError``), an ``{"error": ...}`` event ``openai.APIError`` with the server's
message. Faults the SDK would let pass are errors too: an event over ``[llm] max_event_bytes``
``EventTooLarge`` (a ``MalformedStream``, raised before the excess is buffered), a body that ends before ``[DONE]``
raises ``StreamEnded`` (a ``StreamInterrupted``; the reader accepts it only when a finish_reason
came), a 200 response of another declared type than ``text/event-stream`` (an HTML portal page,
say) ``UnexpectedContentType``, and an event whose data is not JSON ``MalformedStream``. An event
orjson refuses only for its ``usage`` numbers (``1e400``, an integer beyond 64 bits: valid JSON)
is read with the standard library instead: usage is bookkeeping and never fails an answer.
"""
from __future__ import annotations

import asyncio
import json
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
WRONG_BODY_PEEK = 2048     # bytes of a non-SSE body read to find an error message in it
MAX_EVENT_BYTES = 8 * 1024 * 1024   # default bound on one SSE event ([llm] max_event_bytes)
_TRANSPORT_ERRORS = (_http.RequestError, ssl.SSLError)


class StreamInterrupted(openai.APIConnectionError):
    """The connection failed after the response started (mid-stream), not while connecting."""


class StreamStalled(openai.APITimeoutError):
    """No byte of the body came within the read timeout, after the response had started."""


class StreamEnded(StreamInterrupted):
    """The body ended cleanly but before ``[DONE]``: the answer may be cut short."""


class UnexpectedContentType(openai.APIError):
    """A 2xx response to a streamed request whose body is not ``text/event-stream``."""

    def __init__(self, content_type: str, request: Any, detail: str | None = None) -> None:
        super().__init__(f"HTTP 200 with content type {content_type or 'none'} instead of an event stream"
                         + (f": {detail}" if detail else ""), request, body=None)
        self.content_type = content_type


class MalformedStream(openai.APIError):
    """An SSE event whose data is neither JSON nor ``[DONE]``."""


class EventTooLarge(MalformedStream):
    """An SSE event (or a line of one) longer than ``[llm] max_event_bytes``: the step fails."""


class _Oversize(Exception):
    """Raised by ``SSEDecoder`` (which has no request at hand); ``iter_chunks`` turns it into EventTooLarge."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(size, limit)
        self.size, self.limit = size, limit


class SSEDecoder:
    """Incremental Server-Sent Events decoder: bytes in, one ``data`` payload (bytes) per event out.

    Lines end with LF, CRLF or CR; several ``data:`` lines of one event are joined with LF; comments
    and the ``event``/``id``/``retry`` fields are ignored (chat completion streams do not use them).
    Linear in the bytes fed: each read is scanned for line ends once, and the pieces of an incomplete
    line are kept in a list and joined once, when its end comes (joining the held part to every read
    made a 16 MB line take 11 s, blocking the event loop). ``max_event_bytes`` bounds what is held for
    one event: its ``data:`` lines and a line not yet ended, as received (``data:`` included, line ends
    not); more raises ``_Oversize`` before it is buffered.
    """

    __slots__ = ("_parts", "_held", "_cr", "_data", "_data_size", "max_event_bytes")

    def __init__(self, max_event_bytes: int | None = None) -> None:
        self._parts: list[bytes] = []    # the pieces of an incomplete last line
        self._held = 0                   # their total length
        self._cr = False                 # the last read ended with CR: a LF opening the next one ends nothing
        self._data: list[bytes] = []     # data lines of the event being read
        self._data_size = 0              # their total length
        self.max_event_bytes = max_event_bytes

    @property
    def buffered(self) -> int:
        """Bytes held for the event being read (its data lines and an incomplete line)."""
        return self._held + self._data_size

    def feed(self, chunk: bytes) -> list[bytes]:
        """The payloads of the events completed by ``chunk``."""
        if self._cr and chunk[:1] == b"\n":         # the second half of a CRLF split across reads
            chunk, self._cr = chunk[1:], False
        if not chunk:
            return []
        self._cr = False
        if b"\r" in chunk:
            self._cr = chunk[-1:] == b"\r"              # a last CR ends its line now (as a lone CR would)
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = chunk.find(b"\n")
        if end < 0:                                    # no line end: hold the piece, unjoined
            self._hold(chunk)
            return []
        first = chunk[:end]
        if self._parts:
            self._check(len(first))
            self._parts.append(first)
            first = b"".join(self._parts)
            self._parts, self._held = [], 0
        lines = chunk[end + 1:].split(b"\n")
        rest = lines.pop()
        lines.insert(0, first)
        out = self._lines(lines)
        if rest:
            self._hold(rest)
        return out

    def _hold(self, piece: bytes) -> None:
        self._check(len(piece))
        self._parts.append(piece)
        self._held += len(piece)

    def _check(self, more: int) -> None:
        limit = self.max_event_bytes
        if limit is not None and self._held + self._data_size + more > limit:
            raise _Oversize(self._held + self._data_size + more, limit)

    def flush(self) -> list[bytes]:
        """At the end of the body: the last line and event even without their terminators."""
        rest = b"".join(self._parts)
        self._parts, self._held, self._cr = [], 0, False
        out = self._lines([rest] if rest else [])
        if self._data:
            out.append(b"\n".join(self._data))
            self._data, self._data_size = [], 0
        return out

    def _lines(self, lines: list[bytes]) -> list[bytes]:
        out: list[bytes] = []
        data = self._data
        for line in lines:
            if not line:                          # blank line: dispatch the event
                if data:
                    out.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data.clear()
                    self._data_size = 0
            elif line.startswith(b"data:"):
                self._check(len(line))
                self._data_size += len(line)
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
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            chunk = _beyond_orjson(payload)
            if chunk is None:
                raise MalformedStream(f"a stream event is not JSON: {payload[:80].decode('utf-8', 'replace')!r}",
                                      request, body=None) from None
        if type(chunk) is dict:
            if chunk.get("error"):
                raise _stream_error(chunk, request)
            batch.append(chunk)
    return batch, False


def _beyond_orjson(payload: bytes) -> dict[str, Any] | None:
    """A chunk that orjson refuses only because of its ``usage`` (numbers out of its range, such as
    ``1e400`` or an integer beyond 64 bits), read with the standard library; None for anything else.
    The rest of the chunk goes through orjson once more, so its text is what orjson accepts (a lone
    surrogate still fails the stream; an out-of-range number there reads as null): only the usage,
    which the agent reads as bookkeeping (``llm_support.Usage``), may hold odd numbers."""
    try:
        chunk = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    if type(chunk) is not dict or "usage" not in chunk:
        return None
    usage = chunk.pop("usage")
    try:
        chunk = orjson.loads(orjson.dumps(chunk))
    except (orjson.JSONEncodeError, orjson.JSONDecodeError):
        return None
    chunk["usage"] = usage
    return chunk


async def iter_chunks(response: Any, max_event_bytes: int = MAX_EVENT_BYTES) -> AsyncIterator[list[dict[str, Any]]]:
    """The chunks of a streamed completion, one list per network read, up to ``[DONE]``.

    ``response`` is the ``AsyncAPIResponse`` of ``with_streaming_response``; the caller closes it.
    Raises ``StreamEnded`` after the last chunk when the body ended without ``[DONE]``, and
    ``EventTooLarge`` as soon as one event holds more than ``max_event_bytes`` (``[llm] max_event_bytes``).
    """
    request = response.http_request
    decoder = SSEDecoder(max_event_bytes)
    body = response.iter_bytes()
    done = False
    try:
        try:
            content_type = response.headers.get("content-type", "")
            if content_type and not content_type.lower().startswith("text/event-stream"):   # none: try SSE
                raise UnexpectedContentType(content_type.split(";")[0].strip(), request,
                                            await _error_message(body))
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
        except _Oversize as e:
            raise EventTooLarge(f"an event is over {e.limit} bytes ([llm] max_event_bytes); the stream was "
                                f"stopped after {e.size} bytes of it", request, body=None) from None
        except _http.TimeoutException as e:
            raise StreamStalled(request=request) from e
        except _TRANSPORT_ERRORS as e:
            raise StreamInterrupted(message="The connection was lost mid-stream.", request=request) from e
        if not done:
            raise StreamEnded(message="The stream ended before [DONE].", request=request)
        await _drain(body)
    finally:
        await body.aclose()


async def _error_message(body: AsyncIterator[bytes]) -> str | None:
    """The ``error.message`` of a short JSON body, if it is one (a few servers answer errors with 200)."""
    head = b""
    async for raw in body:
        head += raw
        if len(head) >= WRONG_BODY_PEEK:
            return None
    try:
        obj = orjson.loads(head)
    except orjson.JSONDecodeError:
        return None
    error = obj.get("error") if isinstance(obj, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    return message[:200] if isinstance(message, str) and message else None


async def _drain(body: AsyncIterator[bytes]) -> None:
    """Read what follows ``[DONE]`` (normally just the end of the chunked body), briefly."""
    try:
        async with asyncio.timeout(DRAIN_AFTER_DONE_S):
            async for _ in body:
                pass
    except (TimeoutError, *_TRANSPORT_ERRORS):
        pass   # the answer is complete: a slow or broken tail only costs connection reuse
