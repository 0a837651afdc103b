"""The memory layer: rolling summaries, recall of older turns, and the context builder (docs/memory.md)."""
from server.memory.config import MemoryConfig
from server.memory.manager import MemoryManager
from server.memory.tokens import ApproxTokenCounter, TokenCounter

__all__ = ["ApproxTokenCounter", "MemoryConfig", "MemoryManager", "TokenCounter"]
