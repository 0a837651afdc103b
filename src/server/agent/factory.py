"""build_agent: the LLM agent when a model endpoint is configured, else the offline agent."""
from __future__ import annotations

import logging

from server.agent.base import Agent
from server.agent.config import AgentConfig, LLMConfig
from server.agent.offline import OfflineAgent
from server.agent.openai_agent import OpenAIAgent
from server.agent.llm_support import endpoint_host, url_secrets
from server.tools import ToolRegistry

log = logging.getLogger(__name__)


def build_agent(llm_cfg: LLMConfig, agent_cfg: AgentConfig, tools: ToolRegistry) -> Agent:
    """OpenAIAgent when an API key, or a keyless local provider/base_url, is configured; else OfflineAgent."""
    if llm_cfg.usable:
        agent = OpenAIAgent(llm_cfg, agent_cfg, tools)
        for value in url_secrets(agent.base_url):    # the base_url's password, ?api-key=...: never in a tool result
            tools.add_secret(value)
        # the host and port only: never the base_url's user info, path or query
        log.info("agent: %s at %s, model %s", agent.name, endpoint_host(agent.base_url), agent.default_model)
        return agent
    return OfflineAgent(agent_cfg, tools)      # (the server logs why: LLMConfig.startup_note)
