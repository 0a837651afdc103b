"""Error answers of the model endpoint (review s32), through the real openai client and the scripted
endpoint over loopback: no part of the API key comes back in another letter case, and a 400 that is not
about stream_options is sent once only."""
from __future__ import annotations

import pytest

from server.agent.base import AgentError
from server.agent.config import AgentConfig, LLMConfig
from server.agent.llm_support import KEY_FRAGMENT_CHARS, scrub_key
from server.agent.openai_agent import OpenAIAgent
from testkit.scripted_llm import Reply

from .conftest import make_request

MIXED_KEY = "sk-Proj-AbCdEfGh0123IjKlMnOp4567QrStUv"


def _fragments(text: str, key: str, n: int = KEY_FRAGMENT_CHARS) -> list[str]:
    """The runs of ``n`` characters of ``key`` that ``text`` holds, in any letter case."""
    text, key = text.lower(), key.lower()
    return [key[i:i + n] for i in range(len(key) - n + 1) if key[i:i + n] in text]


@pytest.fixture
async def mixed_key_agent(llm, registry):
    cfg = LLMConfig.from_dict({"base_url": llm.base_url, "model": "scripted-model", "request_timeout_s": 5.0,
                               "retries": 0}, env={"NPLT_LLM_API_KEY": MIXED_KEY})
    agent = OpenAIAgent(cfg, AgentConfig(), registry)
    yield agent
    await agent.aclose()


@pytest.mark.parametrize("echo", [MIXED_KEY.lower(), MIXED_KEY.upper(), MIXED_KEY.swapcase(),
                                  MIXED_KEY.lower()[3:20], MIXED_KEY.upper()[10:]])
async def test_a_401_echoing_the_key_in_another_case_shows_none_of_it(llm, mixed_key_agent, sink, echo):
    llm.push(Reply.fail(401, f"Incorrect API key provided: {echo}. You can find your API key at x."))
    with pytest.raises(AgentError) as err:
        await mixed_key_agent.run_turn(make_request("hi"), sink)
    assert llm.requests[0].headers["authorization"] == f"Bearer {MIXED_KEY}"    # the key did go out
    message = err.value.message
    assert "HTTP 401" in message and "Incorrect API key provided: ***" in message
    assert _fragments(message, MIXED_KEY) == []


def test_scrub_key_ignores_letter_case():
    key = MIXED_KEY
    assert scrub_key(f"a {key.lower()} b {key.upper()} c", key) == "a *** b *** c"
    assert scrub_key(f"prefix {key[:12].upper()}...", key) == "prefix ***..."
    assert scrub_key("sk-proj is a prefix, ABCDEFG too", key) == "sk-proj is a prefix, ABCDEFG too"   # < 8
    assert scrub_key("tiny key ABC", "abc") == "tiny key ***"


@pytest.mark.parametrize("message", ["This model does not support function calling",
                                     "registry.ollama.ai/library/gemma:2b does not support tools",
                                     "invalid value for temperature: 7"])
async def test_a_400_not_about_stream_options_is_sent_once(llm, make_agent, sink, message):
    llm.push(Reply.fail(400, message), Reply.text("never sent"))
    agent = make_agent(retries=0)
    with pytest.raises(AgentError) as err:
        await agent.run_turn(make_request("hi"), sink)
    assert err.value.code == "LLM_ERROR" and "HTTP 400" in err.value.message and message in err.value.message
    assert len(llm.requests) == 1 and llm.pending == 1
    assert "stream_options" in llm.requests[0].body and agent._stream_usage is True


@pytest.mark.parametrize("message", ["Unrecognized request argument supplied: stream_options",
                                     "stream_options.include_usage: unknown field",
                                     "Extra inputs are not permitted"])
async def test_a_400_refusing_stream_options_is_sent_again_without_it(llm, make_agent, sink, message):
    llm.push(Reply.fail(400, message), Reply.text("fine"))
    agent = make_agent(retries=0)
    result = await agent.run_turn(make_request("hi"), sink)
    assert result.content == "fine" and len(llm.requests) == 2
    assert "stream_options" in llm.requests[0].body and "stream_options" not in llm.requests[1].body
    assert agent._stream_usage is False
