"""Helpers of the OpenAI agent: tool-call delta assembly, usage totals, retry policy, error mapping.

Error messages name the endpoint host and the HTTP status, never the API key (it is scrubbed from
anything the server echoes back).
"""
from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import openai
import orjson

from protocol import ErrorCode
from server.agent.base import AgentError
from server.agent.chat_stream import (MalformedStream, StreamEnded, StreamInterrupted, StreamStalled,
                                     UnexpectedContentType)
from server.tools.registry import new_call_id

LLM_ERROR, LLM_TIMEOUT = ErrorCode.LLM_ERROR, ErrorCode.LLM_TIMEOUT


@dataclass(slots=True)
class AssembledCall:
    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


class ToolCallAssembler:
    """Rebuilds tool calls from streamed deltas: id and name usually come first, arguments in pieces.

    Deltas are keyed by ``index``; a server that omits it gets a new slot whenever a new id appears.
    """

    def __init__(self) -> None:
        self._slots: dict[int, AssembledCall] = {}
        self._last: int | None = None

    def add(self, deltas: list[Any]) -> None:
        """Merge the ``tool_calls`` list of one streamed delta (plain dicts, as decoded from JSON)."""
        for tc in deltas:
            if not isinstance(tc, dict):
                continue
            index = tc.get("index")
            tc_id = tc.get("id")
            if not isinstance(index, int):
                if self._last is None or (tc_id and self._slots[self._last].id and tc_id != self._slots[self._last].id):
                    index = len(self._slots)
                else:
                    index = self._last
            slot = self._slots.setdefault(index, AssembledCall(index))
            self._last = index
            if tc_id and isinstance(tc_id, str):
                slot.id = tc_id
            fn = tc.get("function")
            if isinstance(fn, dict):
                name = fn.get("name")
                if name and isinstance(name, str):
                    # Most servers send the name once; a few repeat it in every delta.
                    slot.name = name if not slot.name or slot.name == name else slot.name + name
                arguments = fn.get("arguments")
                if arguments:
                    # Off-spec non-string arguments are kept as JSON text rather than failing the turn.
                    slot.arguments += arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()

    def calls(self) -> list[AssembledCall]:
        """The calls in index order; missing ids get a stable generated one."""
        out = []
        for index in sorted(self._slots):
            slot = self._slots[index]
            if not slot.id:
                slot.id = new_call_id()
            out.append(slot)
        return [c for c in out if c.name]

    def __bool__(self) -> bool:
        return bool(self._slots)


@dataclass(slots=True)
class Usage:
    """Token usage summed over the LLM calls of a turn."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    llm_calls: int = 0
    reported: bool = False

    def add(self, usage: dict[str, Any] | None) -> None:
        """Count one LLM call and its ``usage`` object (a dict as decoded from JSON; None: not reported)."""
        self.llm_calls += 1
        if not isinstance(usage, dict):
            return
        self.reported = True
        self.prompt_tokens += _count(usage.get("prompt_tokens"))
        self.completion_tokens += _count(usage.get("completion_tokens"))
        self.total_tokens += _count(usage.get("total_tokens"))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"llm_calls": self.llm_calls}
        if self.reported:
            d.update(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                     total_tokens=self.total_tokens)
        return d


def _count(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


@dataclass(slots=True)
class RetryPolicy:
    retries: int
    backoff_s: float
    max_delay_s: float
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based): retry-after, else backoff with jitter."""
        if retry_after is not None:
            return min(max(0.0, retry_after), self.max_delay_s)
        base = self.backoff_s * (2 ** attempt)
        return min(self.max_delay_s, base * (0.5 + self.rng.random() / 2))


def retry_detail(attempt: int, retries: int, delay: float, reason: str) -> str:
    """The status detail of a retry: ``retrying 2/3 in 1 s (HTTP 429)`` (docs/agent.md)."""
    seconds = f"{delay:.0f}" if delay >= 10 else f"{delay:.1f}".rstrip("0").rstrip(".")
    return f"retrying {attempt}/{retries} in {seconds} s ({reason})"


def retry_after(exc: BaseException) -> float | None:
    """Seconds from ``retry-after-ms`` / ``retry-after`` (number or HTTP date), when present."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return float(ms) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())


def is_retryable(exc: BaseException) -> bool:
    """429, 5xx and connection failures are retried; timeouts and other statuses are not."""
    if isinstance(exc, openai.APITimeoutError):
        return False
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code == 429 or exc.status_code >= 500
    return isinstance(exc, openai.APIConnectionError)


def endpoint_host(base_url: str) -> str:
    return urlparse(base_url).netloc or base_url


def _scrub(text: str, secret: str | None, limit: int = 300) -> str:
    if secret:
        text = text.replace(secret, "***")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def _status_detail(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(body.get("message"), str):
            return body["message"]
    return exc.message


def to_agent_error(exc: BaseException, base_url: str, timeout_s: float, secret: str | None,
                   attempts: int = 1) -> AgentError:
    """Map an openai exception to AgentError(LLM_TIMEOUT | LLM_ERROR) with a safe, precise message."""
    error = _to_agent_error(exc, base_url, timeout_s, secret, attempts)
    error.attempts = attempts
    return error


def _to_agent_error(exc: BaseException, base_url: str, timeout_s: float, secret: str | None,
                    attempts: int) -> AgentError:
    host = endpoint_host(base_url)
    tries = f" (after {attempts} attempts)" if attempts > 1 else ""
    if isinstance(exc, StreamStalled):
        return AgentError(LLM_TIMEOUT, f"the model endpoint {host} stopped sending mid-stream: nothing came "
                                         f"for {timeout_s:g} s{tries}")
    if isinstance(exc, (openai.APITimeoutError, TimeoutError)):
        return AgentError(LLM_TIMEOUT, f"the model endpoint {host} did not respond within {timeout_s:g} s{tries}")
    if isinstance(exc, UnexpectedContentType):
        return AgentError(LLM_ERROR, f"the model endpoint {host} answered {_scrub(exc.message, secret)}"
                                       " (is base_url the API, not a web page or proxy?)")
    if isinstance(exc, MalformedStream):
        return AgentError(LLM_ERROR, f"the model endpoint {host} sent a malformed stream: "
                                       f"{_scrub(exc.message, secret)}")
    if isinstance(exc, openai.APIStatusError):
        detail = _scrub(_status_detail(exc), secret)
        hint = ""
        if exc.status_code in (401, 403):
            hint = " (check the API key: NPLT_LLM_API_KEY)"
        elif exc.status_code == 404:
            hint = " (check the model name and base_url)"
        return AgentError(LLM_ERROR, f"the model endpoint {host} returned HTTP {exc.status_code}{hint}: "
                                       f"{detail}{tries}")
    if isinstance(exc, StreamEnded):
        return AgentError(LLM_ERROR, f"the stream from the model endpoint {host} ended before the answer was "
                                       f"complete (no finish_reason nor [DONE]){tries}")
    if isinstance(exc, StreamInterrupted):
        return AgentError(LLM_ERROR, f"the connection to the model endpoint {host} was lost mid-answer{tries}")
    if isinstance(exc, openai.APIConnectionError):
        return AgentError(LLM_ERROR, f"cannot connect to the model endpoint {host}{tries}")
    if isinstance(exc, openai.APIError):
        return AgentError(LLM_ERROR, f"the model endpoint {host} reported an error: "
                                       f"{_scrub(exc.message, secret)}{tries}")
    return AgentError(LLM_ERROR, f"unexpected failure talking to the model endpoint {host}: {type(exc).__name__}")
