"""Builds the runtime parts from the config: tools, agent and memory (docs/architecture.md, Wiring).

tools(search=memory.search) -> agent(tools) -> memory(agent): the tools' search is bound late so the
cycle resolves. Tests may ask for BasicMemory (system prompt + new message only) with ``memory="basic"``.
"""
from __future__ import annotations

from typing import Any, Callable

from server.agent.factory import build_agent
from server.basic_memory import BasicMemory
from server.config import ServerConfig
from server.memory import MemoryManager
from server.tools import ToolRegistry


def build_memory(config: ServerConfig, store: Any, agent: Any, notify: Callable[..., Any]) -> Any:
    """The MemoryManager (summaries, recall, context budget)."""
    return MemoryManager(config.memory, store, agent, notify, config.agent.system_prompt)


def build_runtime(config: ServerConfig, store: Any, notify: Callable[..., Any], agent: Any = None,
                  memory: Any = None, knowledge: Any = None, offers: Any = None) -> tuple[Any, Any]:
    """(agent, memory); the given ones are used as they are (tests pass an echo agent).

    ``memory="basic"`` selects BasicMemory even when server.memory is available. ``knowledge`` (a
    ``server.tools.knowledge.KnowledgeSource``) adds the search_knowledge tool; ``offers`` is the
    offer_download tool's function (server.offers.OfferService.offer_in_session), None for no such tool.
    """
    holder: dict[str, Any] = {"memory": memory}

    async def search(*args: Any, **kwargs: Any) -> list[Any]:
        return await holder["memory"].search(*args, **kwargs)

    if agent is None:
        tools = ToolRegistry(config.tools, search=search, knowledge=knowledge, offers=offers)
        agent = build_agent(config.llm, config.agent, tools)
    if memory == "basic":  # explicitly requested (tests): no summaries, no recall
        memory = BasicMemory(store, config.agent.system_prompt)
    elif memory is None:
        memory = build_memory(config, store, agent, notify)
    holder["memory"] = memory
    return agent, memory
