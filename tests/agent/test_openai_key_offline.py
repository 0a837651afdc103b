"""A stray OPENAI_API_KEY (a developer's shell often exports one) never switches the offline-by-default
server to api.openai.com: the key is used only once a model endpoint is chosen (NPLT_LLM_PROVIDER,
NPLT_LLM_BASE_URL, [llm] provider or base_url). The start-up log says which agent runs and why, with a
WARNING when the key is set but ignored."""
from __future__ import annotations

import logging

import pytest

from protocol import MsgType
from server.agent.config import LLMConfig
from server.agent.factory import build_agent
from server.agent.offline import OfflineAgent
from server.agent.openai_agent import OpenAIAgent
from server.app import Server
from server.config import ServerConfig
from server.tools import ToolRegistry, ToolsConfig
from testkit.server import V3Client

KEY = "sk-stray-0123456789abcdef"
IGNORED = ("offline agent: no model endpoint configured; OPENAI_API_KEY is set but ignored until "
           "NPLT_LLM_PROVIDER or NPLT_LLM_BASE_URL is set")


def test_the_key_alone_leaves_the_agent_offline():
    cfg = LLMConfig.from_dict({}, env={"OPENAI_API_KEY": KEY})
    assert cfg.api_key is None and not cfg.usable
    assert cfg.startup_note() == (logging.WARNING, IGNORED)
    assert isinstance(build_agent(cfg, None, ToolRegistry(ToolsConfig())), OfflineAgent)
    assert LLMConfig.from_dict({}, env={}).startup_note()[0] == logging.INFO      # nothing set: no warning


@pytest.mark.parametrize("d,env,chosen_by", [
    ({}, {"NPLT_LLM_PROVIDER": "openai"}, "NPLT_LLM_PROVIDER, OPENAI_API_KEY"),
    ({}, {"NPLT_LLM_PROVIDER": "deepseek"}, "NPLT_LLM_PROVIDER, OPENAI_API_KEY"),
    ({}, {"NPLT_LLM_BASE_URL": "https://llm.example/v1"}, "NPLT_LLM_BASE_URL, OPENAI_API_KEY"),
    ({"provider": "openai"}, {}, "[llm] provider, OPENAI_API_KEY"),
    ({"base_url": "https://llm.example/v1"}, {}, "[llm] base_url, OPENAI_API_KEY"),
])
def test_the_key_is_used_once_an_endpoint_is_chosen(d, env, chosen_by):
    cfg = LLMConfig.from_dict(d, env={"OPENAI_API_KEY": KEY, **env})
    assert cfg.api_key == KEY and cfg.usable
    assert cfg.startup_note() == (logging.INFO, f"model agent: chosen by {chosen_by}")
    assert isinstance(build_agent(cfg, None, ToolRegistry(ToolsConfig())), OpenAIAgent)


def test_explicit_keys_still_choose_the_model_alone_and_win_over_openai_api_key():
    for d, env, chosen_by in (({}, {"NPLT_LLM_API_KEY": "sk-nplt"}, "NPLT_LLM_API_KEY"),
                              ({"api_key": "sk-nplt"}, {}, "[llm] api_key")):
        cfg = LLMConfig.from_dict(d, env={"OPENAI_API_KEY": KEY, **env})
        assert cfg.api_key == "sk-nplt" and cfg.usable
        assert cfg.startup_note() == (logging.INFO, f"model agent: chosen by {chosen_by}")


async def test_a_server_with_a_stray_key_answers_offline_and_says_why(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    cfg = ServerConfig.from_dict({"server": {"host": "127.0.0.1", "port": 0},
                                  "storage": {"root": str(tmp_path / "history")}},
                                 env={"OPENAI_API_KEY": KEY})
    srv = Server(cfg, memory="basic")                       # the agent from the config, as nplt-server builds it
    host, port = await srv.start()
    try:
        assert srv.agent.name == "offline"
        c = await V3Client.connect((host, port))
        r = await c.call(MsgType.CHAT_TEXT, text="show disk usage")
        end = (await c.turn_events(r["turn_id"]))[-1]
        assert end.type == MsgType.TURN_END and "sys_monitor" in str(end.body["message"]["tool_calls"])
        await c.close()
    finally:
        await srv.stop()
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "nplt.server"] \
        == [IGNORED]
