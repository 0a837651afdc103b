"""Builds the runtime parts from the config: tools, agent and memory (docs/architecture.md, Wiring).

tools(search=memory.search) -> agent(tools) -> memory(agent): the tools' search is bound late so the
cycle resolves. Tests may ask for BasicMemory (system prompt + new message only) with ``memory="basic"``.
"""
from __future__ import annotations

from typing import Any, Callable

from server.basic_memory import DEFAULT_SYSTEM_PROMPT, BasicMemory



def system_prompt_of(config: Any) -> str:
    agent_cfg = getattr(config, "agent", None)
    return getattr(agent_cfg, "system_prompt", None) or DEFAULT_SYSTEM_PROMPT


def build_memory(config: Any, store: Any, agent: Any, notify: Callable[..., Any]) -> Any:
    """The MemoryManager (summaries, recall, context budget)."""
    from server.memory import MemoryManager
    return MemoryManager(config.memory, store, agent, notify, system_prompt_of(config))


def build_runtime(config: Any, store: Any, notify: Callable[..., Any], agent: Any = None,
                  memory: Any = None) -> tuple[Any, Any]:
    """(agent, memory); the given ones are used as they are (tests pass an echo agent).

    ``memory="basic"`` selects BasicMemory even when server.memory is available.
    """
    holder: dict[str, Any] = {"memory": memory}

    async def search(*args: Any, **kwargs: Any) -> list[Any]:
        return await holder["memory"].search(*args, **kwargs)

    if agent is None:
        from server.agent.factory import build_agent
        from server.tools import ToolRegistry
        tools = ToolRegistry(config.tools, search=search)
        agent = build_agent(config.llm, config.agent, tools)
    if memory == "basic":  # explicitly requested (tests): no summaries, no recall
        memory = BasicMemory(store, system_prompt_of(config))
    elif memory is None:
        memory = build_memory(config, store, agent, notify)
    holder["memory"] = memory
    return agent, memory
