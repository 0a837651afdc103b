"""[llm]/[agent] config sections, provider profiles, key resolution and build_agent."""
from __future__ import annotations

import pytest

from server.agent.config import DEFAULT_SYSTEM_PROMPT, PROVIDERS, AgentConfig, LLMConfig
from server.agent.factory import build_agent
from server.agent.offline import OfflineAgent
from server.agent.openai_agent import OpenAIAgent
from server.config_base import ConfigError
from server.tools import ToolRegistry, ToolsConfig


def test_defaults_without_anything_are_unusable():
    cfg = LLMConfig.from_dict({}, env={})
    assert cfg.api_key is None and not cfg.usable
    assert cfg.effective_model == "gpt-4o-mini" and cfg.effective_base_url == "https://api.openai.com/v1"


@pytest.mark.parametrize("name,url,model", [
    ("deepseek", "https://api.deepseek.com/v1", "deepseek-chat"),
    ("zhipu", "https://open.bigmodel.cn/api/paas/v4", "glm-4-flash"),
    ("ollama", "http://127.0.0.1:11434/v1", "qwen2.5:7b"),
    ("vllm", "http://127.0.0.1:8000/v1", "Qwen/Qwen2.5-7B-Instruct"),
    ("openai", "https://api.openai.com/v1", "gpt-4o-mini"),
])
def test_provider_profiles_from_two_env_vars(name, url, model):
    cfg = LLMConfig.from_dict({}, env={"NPLT_LLM_PROVIDER": name.upper(), "NPLT_LLM_API_KEY": "sk-abcdefgh"})
    assert (cfg.provider, cfg.effective_base_url, cfg.effective_model) == (name, url, model)
    assert cfg.usable and cfg.all_models()[0] == model
    assert PROVIDERS[name].base_url == url


def test_key_resolution_order():
    assert LLMConfig.from_dict({"api_key": "from-file"}, env={"NPLT_LLM_API_KEY": "nplt", "OPENAI_API_KEY": "oa"}
                               ).api_key == "nplt"
    assert LLMConfig.from_dict({"api_key": "from-file"}, env={"OPENAI_API_KEY": "oa"}).api_key == "from-file"
    assert LLMConfig.from_dict({}, env={"OPENAI_API_KEY": "oa-key"}).api_key is None    # no endpoint chosen
    assert LLMConfig.from_dict({}, env={"OPENAI_API_KEY": "oa-key", "NPLT_LLM_PROVIDER": "openai"}).api_key == "oa-key"


def test_env_overrides_and_keyless_local_servers():
    cfg = LLMConfig.from_dict({"model": "a"}, env={"NPLT_LLM_MODEL": "b", "NPLT_LLM_BASE_URL": "http://localhost:9/v1/"})
    assert cfg.model == "b" and cfg.base_url == "http://localhost:9/v1" and cfg.keyless and cfg.usable
    ollama = LLMConfig.from_dict({"provider": "ollama"}, env={})
    assert ollama.api_key is None and ollama.usable
    deepseek_no_key = LLMConfig.from_dict({"provider": "deepseek"}, env={})
    assert not deepseek_no_key.usable


def test_repr_never_shows_the_key():
    cfg = LLMConfig.from_dict({"api_key": "sk-very-secret-value"}, env={})
    assert "sk-very-secret-value" not in repr(cfg) and "sk-very-secret-value" not in str(cfg)
    assert "api_key=<set>" in repr(cfg)


@pytest.mark.parametrize("d,path", [
    ({"provider": "anthropic"}, "llm.provider"),
    ({"base_url": "ftp://x"}, "llm.base_url"),
    ({"temperature": 3}, "llm.temperature"),
    ({"retries": -1}, "llm.retries"),
    ({"models": "gpt"}, "llm.models"),
    ({"modle": "x"}, "llm.modle"),
])
def test_llm_config_errors(d, path):
    with pytest.raises(ConfigError) as err:
        LLMConfig.from_dict(d, env={})
    assert err.value.path == path


def test_agent_config():
    cfg = AgentConfig.from_dict({})
    assert cfg.max_iterations == 6 and cfg.system_prompt == DEFAULT_SYSTEM_PROMPT
    assert "read-only" in cfg.system_prompt and "Chinese or English" in cfg.system_prompt
    assert AgentConfig.from_dict({"max_iterations": 3, "stream_chunk_chars": 5}).stream_chunk_chars == 5
    for bad, path in [({"max_iterations": 0}, "agent.max_iterations"), ({"system_prompt": " "}, "agent.system_prompt"),
                      ({"tool_timeout_s": "x"}, "agent.tool_timeout_s"), ({"nope": 1}, "agent.nope")]:
        with pytest.raises(ConfigError) as err:
            AgentConfig.from_dict(bad)
        assert err.value.path == path


async def test_build_agent_chooses_by_configuration():
    tools = ToolRegistry(ToolsConfig())
    offline = build_agent(LLMConfig.from_dict({}, env={}), AgentConfig(), tools)
    assert isinstance(offline, OfflineAgent) and offline.offline and offline.models() == ["offline"]
    online = build_agent(LLMConfig.from_dict({"provider": "deepseek"}, env={"NPLT_LLM_API_KEY": "sk-12345678"}),
                         AgentConfig(), tools)
    local = build_agent(LLMConfig.from_dict({"provider": "ollama"}, env={}), AgentConfig(), tools)
    try:
        assert isinstance(online, OpenAIAgent) and online.name == "deepseek" and not online.offline
        assert online.models() == ["deepseek-chat", "deepseek-reasoner"]
        assert isinstance(local, OpenAIAgent) and local.base_url == "http://127.0.0.1:11434/v1"
    finally:
        await online.aclose()
        await local.aclose()
