"""Pure helpers of the OpenAI agent: delta assembly, retry policy, retry-after parsing."""
from __future__ import annotations

import random
from email.utils import format_datetime
from datetime import datetime, timedelta, timezone

import httpx2
import openai
import pytest

from server.agent.llm_support import RetryPolicy, Usage, is_retryable, retry_after, retry_detail
from server.agent.tool_calls import ToolCallAssembler


def delta(index=None, id=None, name=None, arguments=None):
    """A streamed tool-call delta as decoded from JSON (absent fields are null or missing)."""
    return {"index": index, "id": id, "function": {"name": name, "arguments": arguments}}


def test_assembler_by_index_interleaved():
    a = ToolCallAssembler()
    a.add([delta(0, "c0", "clock", ""), delta(1, "c1", "processes", '{"li')])
    a.add([delta(1, arguments='mit": 2}'), delta(0, arguments="{}")])
    assert [(c.id, c.name, c.arguments) for c in a.calls()] == [("c0", "clock", "{}"),
                                                                  ("c1", "processes", '{"limit": 2}')]


def test_assembler_without_index_and_with_repeated_names():
    a = ToolCallAssembler()
    a.add([delta(id="a", name="clock", arguments="{")])
    a.add([delta(name="clock", arguments="}")])
    a.add([delta(id="b", name="sys_monitor", arguments='{"metric":"cpu"}')])
    assert [(c.id, c.name, c.arguments) for c in a.calls()] == [("a", "clock", "{}"),
                                                                 ("b", "sys_monitor", '{"metric":"cpu"}')]


def test_assembler_generates_missing_ids():
    a = ToolCallAssembler()
    a.add([delta(0, None, "clock", "{}")])
    [call] = a.calls()
    assert call.id.startswith("call_") and len(call.id) > 8


def _status_error(status: int, headers: dict[str, str]) -> openai.APIStatusError:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx2.Response(status, headers=headers, request=request)
    return openai.APIStatusError("x", response=response, body=None)


def test_retry_after_forms():
    assert retry_after(_status_error(429, {"retry-after-ms": "250"})) == 0.25
    assert retry_after(_status_error(429, {"retry-after": "3"})) == 3.0
    when = datetime.now(timezone.utc) + timedelta(seconds=30)
    assert 25 < retry_after(_status_error(429, {"retry-after": format_datetime(when, usegmt=True)})) <= 30
    assert retry_after(_status_error(429, {})) is None
    assert retry_after(ValueError()) is None


def test_retryable_classification():
    assert is_retryable(_status_error(429, {})) and is_retryable(_status_error(503, {}))
    assert not is_retryable(_status_error(400, {})) and not is_retryable(_status_error(401, {}))
    req = httpx2.Request("POST", "http://127.0.0.1/")
    assert is_retryable(openai.APIConnectionError(request=req))
    assert not is_retryable(openai.APITimeoutError(request=req))


def test_backoff_grows_with_jitter_and_is_capped():
    policy = RetryPolicy(retries=5, backoff_s=1.0, max_delay_s=5.0, rng=random.Random(7))
    delays = [policy.delay(n, None) for n in range(5)]
    for n, d in enumerate(delays):
        assert min(5.0, 0.5 * 2 ** n) <= d <= min(5.0, 2 ** n)
    assert policy.delay(0, 60.0) == 5.0 and policy.delay(0, 0.3) == 0.3


def test_usage_totals():
    u = Usage()
    u.add({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5})
    u.add(None)
    u.add({"prompt_tokens": "many", "completion_tokens": None, "total_tokens": 1, "extra": {"cached": 1}})
    assert u.to_dict() == {"llm_calls": 3, "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 6}
    assert Usage().to_dict() == {"llm_calls": 0}


@pytest.mark.parametrize("delay, shown", [(0.0, "0"), (0.01, "0"), (0.2, "0.2"), (1.0, "1"), (1.26, "1.3"),
                                          (9.99, "10"), (12.4, "12"), (20.0, "20")])
def test_retry_detail_format(delay, shown):
    assert retry_detail(2, 3, delay, "HTTP 429") == f"retrying 2/3 in {shown} s (HTTP 429)"


def test_agent_errors_carry_protocol_error_codes():
    from protocol import ErrorCode
    from server.agent.base import AgentError
    assert AgentError(ErrorCode.LLM_TIMEOUT, "slow").code is ErrorCode.LLM_TIMEOUT
    assert AgentError("LLM_ERROR", "down").code is ErrorCode.LLM_ERROR    # (a code read back as text)
    with pytest.raises(ValueError):
        AgentError("LLM_BROKE", "a typo is a bug, not a new code")
