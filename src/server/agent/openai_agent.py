"""OpenAIAgent: a streamed, tool-calling agent for any OpenAI-compatible chat endpoint.

Per step: stream a completion (text deltas relayed as they arrive, tool-call deltas assembled),
run the step's tool calls concurrently, append the assistant message and the tool results, loop.
After ``max_iterations`` steps one last call without tool use asks for an answer with what it has.
Each follow-up request fits the turn's own tool steps into the context budget left after the built
context (``TurnPrompt``: this turn's oldest results are cut first); when even that cannot fit, the
loop ends the same way, with finish reason ``context_budget``. Every request (the last one with
``tool_choice: "none"`` too) also carries the ``tools`` schemas: ``tool_schema_tokens(user_id)``
counts them, and the memory layer reserves that much of the window before it builds the context, so
its ``budget_tokens`` is what is left for the messages.
The SDK's own retries are off (``max_retries=0``) and one policy retries here instead: 429, 5xx,
connection errors and streams cut before any text, with exponential backoff and jitter
(``retry-after`` honoured, capped), as long as no text of the step has been relayed yet. The SDK's
policy cannot do this: it retries only until the response headers arrive (not a stream cut after
them) and has no hook to report a retry, while each retry here is reported through the sink as a
status detail ``retrying N/M in D s (REASON)`` (docs/agent.md).
A stream is an answer only when it ends with a finish_reason or ``[DONE]``: a cut stream, a 200
that is not an event stream, malformed SSE and a stall are LLM_ERROR / LLM_TIMEOUT (chat_stream).
Each request is bounded in time (``StepClock``): ``step_timeout_s`` in all, and no more than
``stream_idle_timeout_s`` without progress (keep-alive comments and empty deltas reset only the
per-read ``request_timeout_s``), else LLM_TIMEOUT. A step whose answer is no answer is LLM_ERROR: a
``content_filter`` finish, or a final step with no text (cut by ``length``, empty, or tool calls
sent to the last request, which allows none).
Streams are opened through the SDK's raw-response API and decoded by ``chat_stream`` into plain
dicts (the SDK's typed chunk objects would cap a stream at a few thousand chunks per second).
``messages`` and ``tools`` go in ``extra_body`` (the SDK's documented way to add JSON fields): they
are plain JSON already, and the SDK's TypedDict transform of them cost ~5 ms of event-loop CPU per
call (7 -> 1.7 ms per request with 20 messages and 6 tools); the JSON sent is the same.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, TypeVar

import openai
import orjson

from server.agent.base import AgentError, IncompleteAnswer, TurnRequest, TurnResult, TurnSink
from server.agent.chat_stream import MalformedStream, StreamEnded, StreamInterrupted, iter_chunks
from server.agent.config import AgentConfig, LLMConfig
from server.agent.llm_support import (LLM_ERROR, RetryPolicy, StepClock, TurnPrompt, Usage, endpoint_host,
                                      is_retryable, rejects_stream_options, retry_after, retry_detail,
                                      to_agent_error)
from server.agent.intents import is_chinese
from server.agent.tool_calls import AssembledCall, ToolCallAssembler
from server.agent.model_catalog import ModelCatalog, ids_of
from server.agent.toolexec import CallRequest, run_tool_step
from server.agent.transcript import wire_arguments
from server.agent.knowledge_answer import record_model_route
from server.memory.tokens import ApproxTokenCounter, TokenCounter
from server.tools import ToolContext, ToolRegistry

log = logging.getLogger(__name__)
T = TypeVar("T")

# The instruction of the last request (``tool_choice: "none"``) after max_iterations / the context budget.
# It is the latest user message the model sees, and models answer in its language: it says to answer in
# the language the conversation asked for (a system prompt's "Always answer in French", a remembered "answer
# in Chinese"), else in the language of the user's question; a Chinese question (Han characters and no kana:
# ``final_prompt``) gets it in Chinese, a Japanese one the English wording. It stays a user message: several chat templates (Mistral, Gemma, ...) refuse a system
# message anywhere but first.
FINAL_ANSWER_PROMPT = ("The tool-call limit for this request has been reached. Do not call any more tools: "
                       "answer now with the information gathered so far, and say what is still unknown. "
                       "Answer in the language the conversation asked for, else in the language of the user's question.")
BUDGET_ANSWER_PROMPT = ("The results of further tool calls would not fit the context window of this request. Do not "
                        "call any more tools: answer now with the information gathered so far, and say what is "
                        "still unknown. Answer in the language the conversation asked for, else in the language of the "
                        "user's question.")
FINAL_ANSWER_PROMPT_ZH = ("本次请求的工具调用次数已达上限。请不要再调用任何工具：现在就根据已获得的信息回答，并说明哪些情况仍不清楚。"
                          "用对话要求的语言回答；没有要求时用中文回答。")
BUDGET_ANSWER_PROMPT_ZH = ("更多工具调用的结果已放不进本次请求的上下文窗口。请不要再调用任何工具：现在就根据已获得的信息回答，"
                           "并说明哪些情况仍不清楚。用对话要求的语言回答；没有要求时用中文回答。")
NO_KEY_PLACEHOLDER = "no-key"   # the SDK insists on a key; keyless local servers ignore it
SCHEMA_COUNTS_CACHED = 8        # token counts of distinct tool-schema lists kept (a user sees one of a few)
QUESTION_LANGUAGE_CHARS = 2000  # the start of the user message whose language the last instruction follows
_KANA = re.compile(r"[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")   # hiragana, katakana (Japanese, not Chinese)
#: a non-streamed completion ending so is not an answer: ``complete`` raises IncompleteAnswer
INCOMPLETE_FINISH_REASONS = ("length", "content_filter")


@dataclass(slots=True)
class StepResult:
    text: str = ""
    calls: list[AssembledCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    ignored_calls: bool = False    # tool-call deltas came in a step that allows none (tool_choice "none")


@dataclass(slots=True)
class _TurnText:
    """Text relayed so far in the turn, whether the current step relayed any, and where each step's
    own text is in it (``spans``: [step, start, end], the separator put before a later step's text left out)."""
    parts: list[str] = field(default_factory=list)
    step_started: bool = False
    call_ids: set[str] = field(default_factory=set)    # tool-call ids used so far (kept unique)
    step: int = 0
    chars: int = 0
    span_start: int = 0
    spans: list[list[int]] = field(default_factory=list)

    def text(self) -> str:
        return "".join(self.parts)


class OpenAIAgent:
    """The LLM-backed agent. ``name`` is the provider profile (or "openai-compatible")."""

    offline = False

    def __init__(self, llm: LLMConfig, agent: AgentConfig, tools: ToolRegistry,
                 client: openai.AsyncOpenAI | None = None, counter: TokenCounter | None = None) -> None:
        self.llm = llm
        self.cfg = agent
        self.registry = tools
        self.name = llm.provider or "openai-compatible"
        self.default_model = llm.effective_model
        self.base_url = llm.effective_base_url
        self._key = llm.api_key
        self._retry = RetryPolicy(llm.retries, llm.retry_backoff_s, llm.retry_max_delay_s)
        self._stream_usage = True    # cleared when the endpoint rejects stream_options
        # counts this turn's tool steps against the context budget (the memory layer's counter fits)
        self.counter: TokenCounter = counter or ApproxTokenCounter()
        self._schema_tokens: dict[str, int] = {}        # a tool-schema list (as JSON) -> its tokens
        self._schema_counter: TokenCounter = self.counter     # the counter they were counted with
        self.client = client or openai.AsyncOpenAI(
            base_url=self.base_url, api_key=llm.api_key or NO_KEY_PLACEHOLDER,
            timeout=llm.request_timeout_s, max_retries=0)
        self.catalog = ModelCatalog(llm.all_models(), self._list_models if llm.models_from_endpoint else None,
                                    ttl_s=llm.models_refresh_s, timeout_s=llm.models_timeout_s)
        self.catalog.offered()   # built on the running loop: the first fetch starts now, not at the first query
        tools.add_secret(llm.api_key)

    def __repr__(self) -> str:
        return f"OpenAIAgent(name={self.name!r}, host={endpoint_host(self.base_url)!r}, model={self.default_model!r})"

    def models(self) -> list[str]:
        """The configured models, then those the endpoint lists (cached; refreshed in the background)."""
        return self.catalog.offered()

    async def _list_models(self) -> list[str]:
        try:
            return ids_of(await self.client.models.list())
        except openai.OpenAIError as e:     # the catalog logs the failure: name the host and status, scrubbed
            raise to_agent_error(e, self.base_url, self.llm.models_timeout_s, self._key) from None

    async def aclose(self) -> None:
        self.registry.close()          # the tools' threads: queued calls cancelled, none waited for
        await self.catalog.aclose()
        await self.client.close()

    async def tool_schema_tokens(self, user_id: str) -> int:
        """The tokens of the ``tools`` every request of ``user_id``'s turn carries (the schemas
        ``schemas_for`` offers, counted with the prompt's counter; cached per distinct list). The
        memory layer reserves them before it fits the context (docs/memory.md, "Budget")."""
        return self.count_schemas(await self.registry.schemas_for(user_id))

    def count_schemas(self, tools: list[dict[str, Any]]) -> int:
        """The tokens of ``tools`` as sent: compact UTF-8 JSON, as the SDK serializes the body."""
        if not tools:
            return 0
        if self._schema_counter is not self.counter:        # (the server wires in the memory layer's counter)
            self._schema_tokens.clear()
            self._schema_counter = self.counter
        text = orjson.dumps(tools).decode()
        n = self._schema_tokens.get(text)
        if n is None:
            if len(self._schema_tokens) >= SCHEMA_COUNTS_CACHED:
                self._schema_tokens.clear()
            n = self._schema_tokens[text] = self.counter.count(text)
        return n

    # -- turns -------------------------------------------------------------------------------------

    async def run_turn(self, req: TurnRequest, sink: TurnSink) -> TurnResult:
        model = req.model or self.default_model
        prompt = TurnPrompt(req.context, self.counter)
        tools = await self.registry.schemas_for(req.user_id)
        offered = [t["function"]["name"] for t in tools]     # the only tools this turn's calls may run
        ctx = ToolContext(req.user_id, req.session_id)
        turn, usage, calls = _TurnText(), Usage(), []
        finish, steps, last = "stop", 0, None
        for step in range(self.cfg.max_iterations):
            messages = prompt.messages()
            if messages is None:     # this turn's results no longer fit, even cut: answer with what fits
                finish, last = "context_budget", (final_prompt("context_budget", req.user_message.content),
                                                  "context budget reached; answering")
                break
            steps += 1
            turn.step = step
            detail = None if step == 0 else f"step {step + 1}"
            await sink.status("thinking", detail)
            res = await self._step(model, messages, tools, "auto", sink, turn, detail)
            usage.add(res.usage)
            self._check_answer(res)
            if not res.calls:
                finish = "length" if res.finish_reason == "length" else "stop"
                break
            done = await run_tool_step(self.registry, sink, self._call_requests(res.calls, offered),
                                       ctx, step, self.cfg.tool_timeout_s)
            calls.extend(done)
            # counting up to max_calls_per_step results of max_result_chars (~10 ms): off the loop
            await asyncio.to_thread(prompt.add_step, _assistant_message(res),
                                    [{"role": "tool", "tool_call_id": d.id, "content": d.result} for d in done])
        else:
            finish, last = "max_iterations", (final_prompt("max_iterations", req.user_message.content),
                                              "tool-call limit reached; answering")
        if last is not None:
            steps += 1
            turn.step = steps - 1
            text, detail = last
            await sink.status("thinking", detail)
            messages = prompt.messages({"role": "user", "content": text})
            res = await self._step(model, messages, tools, "none", sink, turn, detail)
            usage.add(res.usage)
            self._check_answer(res)
        metadata: dict[str, Any] = {"model": model, "agent": self.name, "steps": steps}
        call_steps = {c.step for c in calls}
        if any(step in call_steps for step, _, _ in turn.spans):   # text said before tool calls: where it was said
            metadata["step_text"] = turn.spans
        record_model_route(req.context.metadata, metadata, calls, turn.text(), req.context.messages)
        return TurnResult(content=turn.text(), tool_calls=calls, usage=usage.to_dict(), finish_reason=finish,
                          metadata=metadata)

    def _check_answer(self, res: StepResult) -> None:
        """Provider faults are errors the user sees, never answers: a step the endpoint's content filter
        stopped, and an answer step (no tool calls to run) without text: cut by ``length`` (a reasoning
        model that spent max_tokens thinking), tool calls sent where none are allowed (the last
        request, ``tool_choice: "none"``), or nothing at all (only usage, empty choices)."""
        host = endpoint_host(self.base_url)
        if res.finish_reason == "content_filter":
            raise AgentError(LLM_ERROR, f"the model endpoint {host} withheld the answer: its content filter stopped "
                                        "it (finish_reason content_filter)")
        if res.calls or res.text.strip():
            return
        if res.finish_reason == "length":
            raise AgentError(LLM_ERROR, f"the model endpoint {host} stopped at the "
                                        f"max_tokens limit ({self.llm.max_tokens}) before writing any answer "
                                        "(a reasoning model may have spent it thinking): raise [llm] max_tokens")
        if res.ignored_calls:
            raise AgentError(LLM_ERROR, f"the model endpoint {host} answered the last request, which allows no "
                                        "more tool calls (tool_choice \"none\"), with tool calls and no text")
        reason = res.finish_reason if isinstance(res.finish_reason, str) else "none"
        raise AgentError(LLM_ERROR, f"the model endpoint {host} sent an empty answer: no text and no tool call "
                                    f"(finish_reason {reason})")

    def _call_requests(self, calls: list[AssembledCall], offered: list[str]) -> list[CallRequest]:
        """The step's calls to run: only tools of ``offered`` (the ``tools`` the requests of this turn
        carry). Any other name is refused as an unknown tool, with the error the registry gives a name it
        does not know, and is never looked up: a tool registered but not offered (search_knowledge for
        a user without documents, read_log without log roots) does not run. A name over
        ``max_tool_name_chars`` (cut to it by the assembler) says so. The turn goes on."""
        limit = self.llm.max_tool_name_chars
        allowed = set(offered)
        out = []
        for c in calls:
            error = None
            if c.name_chars > limit:
                error = (f"unknown tool: the name sent is {c.name_chars} characters long, over the {limit} a tool "
                         f"name may have (available: {', '.join(offered)})")
            elif c.name not in allowed:
                error = self.registry.unknown_tool(c.name, offered)
            out.append(CallRequest(c.id, c.name, c.arguments, error))
        return out

    async def complete(self, messages: list[dict[str, Any]], model: str | None = None) -> str:
        """One non-streamed completion without tools (summaries, the memory's distillation). An
        answer the endpoint did not finish (``finish_reason`` ``length``: cut at max_tokens;
        ``content_filter``: withheld) raises ``IncompleteAnswer`` (an LLM_ERROR AgentError carrying
        the finish reason and the text), never returns as if whole."""
        async def call() -> Any:
            async with StepClock(self.llm.stream_idle_timeout_s, self.llm.step_timeout_s).bounded():
                return await self.client.chat.completions.create(
                    model=model or self.default_model, messages=[], temperature=self.llm.temperature,
                    max_tokens=self.llm.max_tokens, extra_body={"messages": messages})
        resp = await self._with_retries(call, lambda: True)
        choices = getattr(resp, "choices", None)
        if not isinstance(choices, list):    # e.g. an HTML page answered with 200: the SDK hands back text
            raise to_agent_error(openai.APIError("HTTP 200 with a body that is not a chat completion", None,
                                                 body=None), self.base_url, self.llm.request_timeout_s, self._key)
        if not choices:
            return ""
        content = choices[0].message.content or ""
        reason = getattr(choices[0], "finish_reason", None)
        if reason in INCOMPLETE_FINISH_REASONS:
            host = endpoint_host(self.base_url)
            why = (f"stopped it at the max_tokens limit ({self.llm.max_tokens}): raise [llm] max_tokens"
                   if reason == "length" else "withheld it: its content filter stopped it")
            raise IncompleteAnswer(reason, content, f"the model endpoint {host} did not finish the answer: it {why} "
                                                    f"(finish_reason {reason})")
        return content

    # -- one LLM call ------------------------------------------------------------------------------

    async def _step(self, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                    tool_choice: str, sink: TurnSink, turn: _TurnText, detail: str | None = None) -> StepResult:
        turn.step_started = False
        body: dict[str, Any] = {"messages": messages}
        if tools:
            body["tools"], body["tool_choice"] = tools, tool_choice
        kwargs: dict[str, Any] = {"model": model, "messages": [], "temperature": self.llm.temperature,
                                  "max_tokens": self.llm.max_tokens, "stream": True, "extra_body": body}

        async def attempt() -> StepResult:
            async with StepClock(self.llm.stream_idle_timeout_s, self.llm.step_timeout_s).bounded() as clock:
                async with contextlib.AsyncExitStack() as stack:
                    response = await self._open_stream(stack, kwargs)
                    clock.progress()           # the response started: the idle limit runs from here
                    return await self._consume(response, sink, turn, tool_choice != "none", clock)
        # Retrying after text went out would repeat it to the user: only retry a silent step.
        return await self._with_retries(attempt, lambda: not turn.step_started, sink, detail)

    async def _open_stream(self, stack: contextlib.AsyncExitStack, kwargs: dict[str, Any]) -> Any:
        """Send the request; the raw streamed response (closed by ``stack``). Non-2xx raises APIStatusError."""
        create = self.client.chat.completions.with_streaming_response.create
        if not self._stream_usage:
            return await stack.enter_async_context(create(**kwargs))
        try:
            return await stack.enter_async_context(create(**kwargs, stream_options={"include_usage": True}))
        except openai.APIStatusError as e:
            if not rejects_stream_options(e):
                raise
            # Some compatible servers reject stream_options: retry once without it and remember.
            response = await stack.enter_async_context(create(**kwargs))
            self._stream_usage = False
            log.info("endpoint %s rejects stream_options; usage will not be streamed", endpoint_host(self.base_url))
            return response

    async def _consume(self, response: Any, sink: TurnSink, turn: _TurnText, want_tools: bool,
                       clock: StepClock) -> StepResult:
        """Relay the text deltas of one streamed completion (one ``sink.delta`` per chunk), assemble tool calls."""
        result = StepResult()
        assembler = ToolCallAssembler(self.llm.max_tool_name_chars, self.llm.max_tool_call_id_chars)
        step_text: list[str] = []
        try:
            await self._read(response, sink, turn, result, assembler, step_text, clock)
        except StreamEnded:
            if result.finish_reason is None:
                raise
            # a finish_reason came: the answer is whole, only the [DONE] line is missing (lenient servers)
        result.text = "".join(step_text)
        if turn.step_started:
            turn.spans.append([turn.step, turn.span_start, turn.chars])
        result.ignored_calls = bool(assembler) and not want_tools
        if want_tools:
            result.calls = assembler.calls(turn.call_ids)
            for c in result.calls:
                if not c.name:     # nothing to run and nothing valid to send back: a malformed reply
                    raise MalformedStream(f"tool call {c.index} (id {c.id!r}) has no function name",
                                          response.http_request, body=None)
        return result

    async def _read(self, response: Any, sink: TurnSink, turn: _TurnText, result: StepResult,
                    assembler: ToolCallAssembler, step_text: list[str], clock: StepClock) -> None:
        async with contextlib.aclosing(iter_chunks(response, self.llm.max_event_bytes)) as batches:
            async for batch in batches:
                progress = False
                for chunk in batch:
                    usage = chunk.get("usage")
                    if usage:
                        result.usage = usage
                    for choice in chunk.get("choices") or ():
                        if type(choice) is not dict or choice.get("index") not in (0, None):
                            continue
                        delta = choice.get("delta")
                        if type(delta) is dict:
                            content = delta.get("content")
                            if content and type(content) is str:
                                progress = True
                                text = content
                                if not turn.step_started:
                                    turn.step_started = True
                                    await sink.status("generating")
                                    if turn.parts and not turn.parts[-1].endswith("\n"):
                                        text = "\n\n" + content
                                    turn.span_start = turn.chars + len(text) - len(content)
                                turn.parts.append(text)
                                turn.chars += len(text)
                                step_text.append(content)
                                await sink.delta(text)
                            if delta.get("tool_calls"):
                                progress = True
                                assembler.add(delta["tool_calls"])
                            elif not progress and _reasoning(delta):    # a reasoning model thinking aloud
                                progress = True
                        if choice.get("finish_reason"):
                            progress = True
                            result.finish_reason = choice["finish_reason"]
                if progress:
                    clock.progress()

    async def _with_retries(self, fn: Callable[[], Awaitable[T]], may_retry: Callable[[], bool],
                            sink: TurnSink | None = None, detail: str | None = None) -> T:
        """``fn`` under the retry policy; each retry is logged and, with a sink, reported as a
        ``thinking`` status whose detail is ``retry_detail(...)``; ``detail`` is restored after the wait."""
        attempt = 0
        while True:
            try:
                return await fn()
            except (openai.APIError, TimeoutError) as e:
                if attempt < self._retry.retries and is_retryable(e) and may_retry():
                    delay = self._retry.delay(attempt, retry_after(e))
                    attempt += 1
                    log.warning("LLM call to %s failed (%s); retry %d/%d in %.2fs", endpoint_host(self.base_url),
                                _short(e), attempt, self._retry.retries, delay)
                    if sink is not None:
                        await sink.status("thinking", retry_detail(attempt, self._retry.retries, delay, _short(e)))
                    await asyncio.sleep(delay)
                    if sink is not None:
                        await sink.status("thinking", detail)
                    continue
                raise to_agent_error(e, self.base_url, self.llm.request_timeout_s, self._key, attempt + 1) from None
            except (openai.OpenAIError, ValueError) as e:   # ValueError: undecodable stream data
                raise to_agent_error(e, self.base_url, self.llm.request_timeout_s, self._key, attempt + 1) from None


def final_prompt(finish: str, question: str) -> str:
    """The instruction of the last request after ``finish`` (``max_iterations`` or ``context_budget``),
    in Chinese for a Chinese ``question`` (the user message of the turn: Han characters and no kana, so a
    Japanese question is not told to be answered in Chinese)."""
    head = question[:QUESTION_LANGUAGE_CHARS]
    zh = is_chinese(head) and not _KANA.search(head)
    if finish == "context_budget":
        return BUDGET_ANSWER_PROMPT_ZH if zh else BUDGET_ANSWER_PROMPT
    return FINAL_ANSWER_PROMPT_ZH if zh else FINAL_ANSWER_PROMPT


def _assistant_message(res: StepResult) -> dict[str, Any]:
    """The step's assistant message for the follow-up request; arguments that are not a JSON object
    (cut at max_tokens) go as ``transcript.wire_arguments`` makes them (strict servers reject them)."""
    return {"role": "assistant", "content": res.text or None,
            "tool_calls": [{"id": c.id, "type": "function",
                            "function": {"name": c.name, "arguments": wire_arguments(c.arguments)}}
                           for c in res.calls]}


def _reasoning(delta: dict[str, Any]) -> bool:
    """Whether a delta carries reasoning text (``reasoning_content``: DeepSeek, vLLM; ``reasoning``:
    Ollama, OpenRouter): progress of a reasoning model, which may think for minutes before its answer."""
    for key in ("reasoning_content", "reasoning"):
        value = delta.get(key)
        if value and type(value) is str:
            return True
    return False


def _short(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    if status:
        return f"HTTP {status}"
    if isinstance(exc, StreamInterrupted):     # after the response started (StreamEnded: a clean cut)
        return "stream cut"
    if isinstance(exc, openai.APIConnectionError):
        return "connection failed"
    return type(exc).__name__

