"""Read-only operations tools for the agents: sys_monitor, processes, network_check, read_log,
history_search, clock. See docs/agent.md."""
from server.tools.config import ToolsConfig
from server.tools.registry import ToolContext, ToolRegistry

__all__ = ["ToolContext", "ToolRegistry", "ToolsConfig"]
