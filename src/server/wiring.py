"""Builds the runtime parts from the config: tools, agent and memory (docs/architecture.md, Wiring).

tools(search=memory.search) -> agent(tools) -> memory(agent): the tools' search is bound late so the
cycle resolves. Tests may ask for BasicMemory (system prompt + new message only) with ``memory="basic"``.
The tools are told the server's own paths (``protected_paths``), which they never read.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from server.agent.factory import build_agent
from server.basic_memory import BasicMemory
from server.cli import default_log_file
from server.config import ServerConfig
from server.memory import MemoryManager
from server.memory.user_files import JsonUserMemoryStore
from server.memory.user_store import DocUserMemoryStore
from server.tools import ToolRegistry
from server.tools.paths import Protected


def protected_paths(config: ServerConfig) -> tuple[Protected, ...]:
    """Everything the server keeps or writes, which no tool may read even under a file or log root:
    the history directory (with knowledge/, uploads/, user_memory/, logs/ and the WAL), a separate
    user-memory directory, the log file and its rotated copies, the TLS key and the config file."""
    data = os.path.abspath(config.storage.root)
    out = [Protected(data, "storage.root"),
           Protected(os.path.join(data, "knowledge"), "the knowledge base"),   # as server.services puts them
           Protected(os.path.join(data, "uploads"), "the uploads in progress")]
    um = config.memory.user_memory.root
    if um:
        out.append(Protected(os.path.abspath(um), "user_memory.root"))
    log_file = default_log_file(config)
    if log_file:
        log_file = os.path.abspath(log_file)
        out.append(Protected(log_file, "the server log file"))
        out += [Protected(f"{log_file}.{i}", "the server log file") for i in range(1, config.server.log_backups + 1)]
    if config.server.tls_key:
        out.append(Protected(os.path.abspath(config.server.tls_key), "server.tls_key"))
    if config.config_file:
        out.append(Protected(os.path.abspath(config.config_file), "the server's config file"))
    # one entry per tree: those inside another add nothing
    return tuple(p for p in out if not any(q is not p and _within(p.path, q.path) for q in out))


def _within(path: str, parent: str) -> bool:
    return path != parent and path.startswith(parent.rstrip("/") + "/")


def build_memory(config: ServerConfig, store: Any, agent: Any, notify: Callable[..., Any]) -> Any:
    """The MemoryManager (summaries, recall, context budget, long-term user memory: in PostgreSQL when
    the history is, so every node shares it, else JSON files in ``user_memory.root``, by default
    ``<storage.root>/user_memory``)."""
    um = config.memory.user_memory
    user_store = None
    if um.enabled and getattr(store, "link", None) is not None:
        from server.memory.user_store_pg import PgUserDocs   # (not imported on the JSON backend)
        user_store = DocUserMemoryStore(PgUserDocs(store.link), um.max_items, um.max_users_cached)
    elif um.enabled:
        root = um.root or os.path.join(config.storage.root, "user_memory")
        user_store = JsonUserMemoryStore(root, um.max_items, um.max_users_cached)
    return MemoryManager(config.memory, store, agent, notify, config.agent.system_prompt, user_store=user_store)


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

    async def remembered(user_id: str) -> list[Any] | None:
        user_memory = getattr(holder["memory"], "user_memory", None)   # (None: turned off)
        return None if user_memory is None else await user_memory.list(user_id)

    if agent is None:
        # (long-term memory turned off by config: no user_memory tool, and the offline agent says so)
        tools = ToolRegistry(config.tools, search=search, knowledge=knowledge, offers=offers,
                             memory_items=remembered if config.memory.user_memory.enabled else None,
                             protected=protected_paths(config))
        agent = build_agent(config.llm, config.agent, tools)
    if memory == "basic":  # explicitly requested (tests): no summaries, no recall
        memory = BasicMemory(store, config.agent.system_prompt)
    elif memory is None:
        memory = build_memory(config, store, agent, notify)
    holder["memory"] = memory
    counter = getattr(memory, "counter", None)
    if counter is not None and hasattr(agent, "counter"):
        agent.counter = counter        # the agent fits a turn's tool steps with the prompt's own counter
    return agent, memory
