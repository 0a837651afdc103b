"""Helpers of the OpenAI agent: the turn's prompt within the context budget, usage totals, the step
clock, retry policy, error mapping (tool-call deltas are assembled in ``server.agent.tool_calls``).

Error messages name the endpoint host and the HTTP status, never the API key (it and any run of
``KEY_FRAGMENT_CHARS`` or more characters of it, in any letter case, are scrubbed from anything the server
echoes back).
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import math
import random
import re
import string
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator
from urllib.parse import unquote, unquote_plus

import openai

from protocol import ErrorCode
from server.agent.base import AgentError, BuiltContext
from server.agent.chat_stream import (EventTooLarge, MalformedStream, StreamEnded, StreamInterrupted, StreamStalled,
                                     UnexpectedContentType)
from server.memory.tokens import TokenCounter, message_tokens, truncate_to_tokens
from server.tools.secrets import looks_like_secret_value, redact_shapes

LLM_ERROR, LLM_TIMEOUT = ErrorCode.LLM_ERROR, ErrorCode.LLM_TIMEOUT
KEY_FRAGMENT_CHARS = 8     # any run of this many characters of the API key is scrubbed from error texts
URL_SECRET_MIN_CHARS = 4   # a base_url's password or query value shorter than this is not scrubbed (url_secrets)
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)   # keeps every index
# a 400/422 that complains of a field it does not know without naming it: maybe stream_options (the
# error naming stream_options or include_usage is one too; any other 400 is not sent again)
UNKNOWN_FIELD_WORDS = ("unrecognized", "unknown field", "unknown parameter", "unknown argument", "extra field",
                       "extra input", "extra_forbidden", "unexpected field", "unexpected keyword",
                       "additional properties")
BUDGET_CUT_NOTE = "[... cut to fit the context budget: {n} more characters]"
MAX_USAGE_TOKENS = 2 ** 53 - 1   # a usage count above this (or not a finite number >= 0) is not counted


class TurnPrompt:
    """The messages of each request of one turn: the built context, then the turn's own tool steps
    (assistant message with ``tool_calls``, then its results), fitted into what the context budget
    (``metadata["budget_tokens"]``, from ``[context]``, the tool schemas every request carries
    already taken off by the memory layer) leaves after the built context.

    Over budget, this turn's tool results are shortened, oldest first, each keeping its
    ``tool_call_id`` and ending in ``BUDGET_CUT_NOTE``; the stored results stay whole. When even
    that cannot fit, ``messages()`` returns None (the agent ends the tool loop) and the final call
    (``messages(final)``) leaves out whole oldest steps, never an assistant message without its
    results. What was cut, and the largest prompt estimate sent, go to the context metadata as
    ``tool_exchange``. Without a budget in the metadata (no memory layer) nothing is fitted.
    """

    def __init__(self, context: BuiltContext, counter: TokenCounter) -> None:
        self.base = context.messages
        self.meta = context.metadata
        budget = context.metadata.get("budget_tokens")
        self.budget: int | None = budget if isinstance(budget, int) and not isinstance(budget, bool) else None
        self.counter = counter
        self.steps: list[list[tuple[dict[str, Any], int]]] = []    # per step: (message, its tokens)
        self._base_tokens: int | None = None
        self._cut: dict[str, None] = {}           # ids of the results cut (insertion-ordered set)
        self._dropped = 0
        self._requests = 0
        self._max_tokens = 0

    def add_step(self, assistant: dict[str, Any], results: list[dict[str, Any]]) -> None:
        """One tool step: the assistant message and its results (each counted once, here)."""
        count = (lambda m: message_tokens(self.counter, m)) if self.budget is not None else (lambda m: 0)
        self.steps.append([(m, count(m)) for m in (assistant, *results)])

    def messages(self, final: dict[str, Any] | None = None) -> list[dict[str, Any]] | None:
        """The next request's messages (``final``: the closing prompt of a last call without tools);
        None when this turn's steps do not fit even with every result cut (only without ``final``)."""
        tail = [final] if final is not None else []
        if not self.steps and not tail:
            return self.base                      # the first request: the context builder fitted it
        if self.budget is None:
            return [*self.base, *(m for step in self.steps for m, _ in step), *tail]
        if self._base_tokens is None:
            self._base_tokens = self.counter.count_messages(self.base)
        fixed = self._base_tokens + sum(message_tokens(self.counter, m) for m in tail)
        room = self.budget - fixed
        steps = [list(step) for step in self.steps]
        total = sum(n for step in steps for _, n in step)
        for step in steps:                        # this turn's results, oldest first
            for i in range(1, len(step)):
                if total <= room:
                    break
                shorter = self._shorten(*step[i], total - room)
                if shorter is not None:
                    total -= step[i][1] - shorter[1]
                    step[i] = shorter
                    self._cut[shorter[0]["tool_call_id"]] = None
        if total > room:
            if final is None:
                self._record(ended=True)
                return None
            dropped = 0
            while steps and total > room:         # the last call: leave out whole oldest steps
                total -= sum(n for _, n in steps.pop(0))
                dropped += 1
            self._dropped = max(self._dropped, dropped)
        self._requests += 1
        self._max_tokens = max(self._max_tokens, fixed + total)
        self._record()
        return [*self.base, *(m for step in steps for m, _ in step), *tail]

    def _shorten(self, message: dict[str, Any], tokens: int, excess: int) -> tuple[dict[str, Any], int] | None:
        """``message`` (a tool result of ``tokens``) about ``excess`` tokens shorter, marked, with its
        tokens; None when that would not make it shorter. Only a partial cut reads the content again."""
        content = message.get("content")
        if not isinstance(content, str):
            return None
        empty = {**message, "content": ""}
        note = BUDGET_CUT_NOTE.format(n=len(content))
        keep = tokens - message_tokens(self.counter, empty) - excess - self.counter.count(note) - 1
        part = truncate_to_tokens(self.counter, content, keep) if keep > 0 else ""
        note = BUDGET_CUT_NOTE.format(n=len(content) - len(part))
        shorter = {**message, "content": f"{part}\n{note}" if part else note}
        n = message_tokens(self.counter, shorter)
        return (shorter, n) if n < tokens else None

    def _record(self, ended: bool = False) -> None:
        record: dict[str, Any] = self.meta.get("tool_exchange") or {}
        record.update(follow_up_requests=self._requests, prompt_tokens_max=self._max_tokens, budget_tokens=self.budget)
        cut = []
        if self._cut:
            cut.append({"what": "tool results", "count": len(self._cut), "ids": list(self._cut),
                        "why": "over the prompt budget: this turn's results cut, oldest first"})
        if self._dropped:
            cut.append({"what": "tool steps", "count": self._dropped,
                        "why": "over the prompt budget even with every result cut: left out of the last call"})
        record["cut"] = cut
        if ended:
            record["ended"] = "the tool results no longer fit the prompt budget: answered without more tools"
        self.meta["tool_exchange"] = record


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
    """A usage count as reported; 0 for anything else (a string, a negative or non-finite number, an
    absurd one such as 1e308): usage is bookkeeping and never fails an answer or its storage."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    if isinstance(value, float) and not math.isfinite(value):
        return 0
    return int(value) if 0 <= value <= MAX_USAGE_TOKENS else 0


class StepTimeout(TimeoutError):
    """One model request ran out of time: ``kind`` "idle" (the stream stayed open without progress
    for ``seconds``, [llm] stream_idle_timeout_s) or "step" (the whole request took ``seconds``,
    [llm] step_timeout_s)."""

    def __init__(self, kind: str, seconds: float) -> None:
        super().__init__(f"{kind} limit of {seconds:g} s reached")
        self.kind = kind
        self.seconds = seconds


class StepClock:
    """The bounded time of one model request: ``step_s`` in all, and once the response has started
    (``progress()`` is first called) at most ``idle_s`` between two calls of ``progress()`` (the
    agent calls it for text, reasoning and tool-call deltas, never for keep-alive comments, empty
    chunks or usage). A stream that the per-read ``request_timeout_s`` never stops (it sends
    something every second) is ended by one of these.

    ``progress()`` only stores the time (it runs per network read): a timer looks at it when a
    limit may be due and then ends the ``bounded()`` block, which raises ``StepTimeout``.
    """

    def __init__(self, idle_s: float, step_s: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.idle_s, self.step_s = idle_s, step_s
        self.step_end = self.loop.time() + step_s
        self.last: float | None = None          # the last progress; None before the response started
        self.hit: str | None = None
        self._scope: asyncio.Timeout | None = None
        self._timer: asyncio.TimerHandle | None = None

    def progress(self) -> None:
        first = self.last is None
        self.last = self.loop.time()
        if first and self._scope is not None:     # the idle limit starts: it may be due before the step's
            self._arm()

    def _due(self) -> float:
        return self.step_end if self.last is None else min(self.last + self.idle_s, self.step_end)

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(self._due(), self._check)

    def _check(self) -> None:
        now = self.loop.time() + 0.001              # a timer may run a hair before its time
        if now >= self.step_end:
            self.hit = "step"
        elif self.last is not None and now >= self.last + self.idle_s:
            self.hit = "idle"
        else:
            self._timer = self.loop.call_at(self._due(), self._check)
            return
        assert self._scope is not None
        self._scope.reschedule(self.loop.time())    # ends the bounded() block with a TimeoutError

    @contextlib.asynccontextmanager
    async def bounded(self) -> AsyncIterator[StepClock]:
        """The block in which the limits hold; raises ``StepTimeout`` when one is reached."""
        try:
            async with asyncio.timeout(None) as scope:
                self._scope = scope
                self._arm()
                yield self
        except TimeoutError:
            if self.hit is None or self._scope is None or not self._scope.expired():
                raise
            raise StepTimeout(self.hit, self.idle_s if self.hit == "idle" else self.step_s) from None
        finally:
            if self._timer is not None:
                self._timer.cancel()


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


def rejects_stream_options(exc: openai.APIStatusError) -> bool:
    """Whether a 400/422 answer to a request with ``stream_options`` may mean it is not supported: the
    error names it (or ``include_usage``), or complains of a field it does not know (``UNKNOWN_FIELD_WORDS``:
    "Extra inputs are not permitted") and names no other cause (context length, tokens). Any other 400
    ("This model does not support function calling", a context-length error) is not sent again."""
    if exc.status_code not in (400, 422):
        return False
    text = f"{_status_detail(exc)} {exc.body}".lower()
    if "stream_options" in text or "include_usage" in text:
        return True
    return (any(word in text for word in UNKNOWN_FIELD_WORDS)
            and not any(word in text for word in ("context", "length", "too long", "token")))


def endpoint_host(base_url: str) -> str:
    """The endpoint as logs and error messages name it: its host and port only (``api.example.com``,
    ``127.0.0.1:8000``, ``[::1]:8000``), never the user info of the base_url (``svc:PASSWORD@``), its path
    or its query (``?api-key=...``): these reach every user (TURN_ERROR, the stored error_message) and
    the log. The authority ends at the first ``/ ? #``; the host follows its last ``@``; a port that is
    not a number (a password with a ``/`` in it split the URL there) is left out."""
    rest = base_url.split("://", 1)[1] if "://" in base_url else base_url
    authority = re.split(r"[/?#\\]", rest, maxsplit=1)[0]
    host = authority.rpartition("@")[2]
    if host.startswith("["):                       # IPv6: [addr] or [addr]:port
        addr, bracket, port = host.partition("]")
        if not bracket:
            return "(unnamed endpoint)"
        host, port = addr + "]", port[1:] if port.startswith(":") else ""
    else:
        host, _, port = host.partition(":")
    if not host:
        return "(unnamed endpoint)"
    return f"{host}:{port}" if port.isdigit() else host


def url_secrets(base_url: str | None) -> tuple[str, ...]:
    """The secrets a base_url may carry, as they are and percent-decoded: the password of its user info
    (``http://svc:PASSWORD@host``; the user name alone when there is no password and it looks like a key,
    ``https://KEY@host``) and the values of its query that look like secrets (``?api-key=VALUE``:
    ``looks_like_secret_value``, not ``api-version=2024-02-01``). Scrubbed from every error text naming the
    endpoint (``to_agent_error``) and, registered with the tools (``build_agent``), from every tool result.
    Values shorter than ``URL_SECRET_MIN_CHARS`` are left (scrubbing them would eat ordinary words)."""
    if not base_url:
        return ()
    rest = base_url.split("://", 1)[1] if "://" in base_url else base_url
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    found: list[str] = []
    userinfo, at, _ = authority.rpartition("@")
    if at:
        user, colon, password = userinfo.partition(":")
        if colon and password:
            found.append(password)
        elif looks_like_secret_value(unquote(user)):
            found.append(user)
    query = rest.partition("?")[2].partition("#")[0]
    for pair in query.split("&"):
        _, _, value = pair.partition("=")
        if looks_like_secret_value(unquote_plus(value)):
            found.append(value)
    out: list[str] = []
    for value in found:
        for form in (value, unquote(value), unquote_plus(value)):
            if len(form) >= URL_SECRET_MIN_CHARS and form not in out:
                out.append(form)
    return tuple(out)


def url_basic_credentials(base_url: str | None) -> tuple[str, ...]:
    """The base_url's user info as the HTTP client sends it, ``Authorization: Basic base64(user:password)``
    (the user name and password percent-decoded or as written), in the standard and the URL-safe base64
    alphabet, with and without its ``=`` padding; only when ``url_secrets`` finds a secret in the user
    info. An endpoint that echoes the request's headers (a 401 naming them) would otherwise hand the
    password, base64-encoded, to every user (TURN_ERROR, the stored ``error_message``, the CLI's
    stderr): scrubbed from every error text naming the endpoint (``to_agent_error``)."""
    if not base_url:
        return ()
    rest = base_url.split("://", 1)[1] if "://" in base_url else base_url
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    userinfo, at, _ = authority.rpartition("@")
    if not at or not url_secrets(f"http://{userinfo}@host"):
        return ()
    user, _, password = userinfo.partition(":")
    forms: list[str] = []
    for u in dict.fromkeys((user, unquote(user))):
        for p in dict.fromkeys((password, unquote(password))):
            raw = f"{u}:{p}".encode("utf-8", "surrogatepass")
            for encoded in (base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()):
                for form in (encoded, encoded.rstrip("=")):
                    if len(form) >= URL_SECRET_MIN_CHARS and form not in forms:
                        forms.append(form)
    return tuple(forms)


def scrub_key(text: str, secret: str | None) -> str:
    """``text`` with the key and every run of ``KEY_FRAGMENT_CHARS`` or more characters of it (a prefix
    an endpoint echoes, say) replaced by ``***``, in any letter case (an endpoint may echo the key lower-
    or upper-cased)."""
    if not secret or not text:
        return text
    key, low = secret.translate(_ASCII_LOWER), text.translate(_ASCII_LOWER)   # same length, same indexes
    n = min(KEY_FRAGMENT_CHARS, len(key))      # a key this short: only whole
    grams = {key[i:i + n] for i in range(len(key) - n + 1)}
    out, i, last = [], 0, 0
    while i <= len(low) - n:
        if low[i:i + n] not in grams:
            i += 1
            continue
        end = i + n                               # extend while it is still a part of the key
        while end < len(low) and low[i:end + 1] in key:
            end += 1
        out += [text[last:i], "***"]
        i = last = end
    return "".join(out) + text[last:] if out else text


def _scrub_text(text: str, secret: str | None, limit: int = 300, extra: tuple[str, ...] = ()) -> str:
    """``text`` for an error message: the key (``scrub_key``) and each of ``extra`` (the base_url's
    secrets, ``url_secrets`` and ``url_basic_credentials``) scrubbed, then anything shaped like a secret
    (``redact_shapes``: a ``Basic``/``Bearer`` credential the endpoint echoes, a URL's password, a
    private key...), whitespace folded, cut at ``limit`` characters."""
    for value in (secret, *extra):
        text = scrub_key(text, value)
    text = redact_shapes(text)
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
    # an endpoint may echo its URL (path, query), its user info, or the Basic header carrying that
    hidden = url_secrets(base_url) + url_basic_credentials(base_url)

    def _scrub(text: str, secret: str | None) -> str:
        return _scrub_text(text, secret, extra=hidden)

    if isinstance(exc, StepTimeout):
        if exc.kind == "idle":
            return AgentError(LLM_TIMEOUT, f"the model endpoint {host} kept the stream open but sent nothing of the "
                                             f"answer for {exc.seconds:g} s ([llm] stream_idle_timeout_s)")
        return AgentError(LLM_TIMEOUT, f"the model endpoint {host} did not finish its answer within "
                                         f"{exc.seconds:g} s ([llm] step_timeout_s)")
    if isinstance(exc, StreamStalled):
        return AgentError(LLM_TIMEOUT, f"the model endpoint {host} stopped sending mid-stream: nothing came "
                                         f"for {timeout_s:g} s{tries}")
    if isinstance(exc, (openai.APITimeoutError, TimeoutError)):
        return AgentError(LLM_TIMEOUT, f"the model endpoint {host} did not respond within {timeout_s:g} s{tries}")
    if isinstance(exc, UnexpectedContentType):
        return AgentError(LLM_ERROR, f"the model endpoint {host} answered {_scrub(exc.message, secret)}"
                                       " (is base_url the API, not a web page or proxy?)")
    if isinstance(exc, EventTooLarge):
        return AgentError(LLM_ERROR, f"the model endpoint {host} sent {_scrub(exc.message, secret)}")
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
