"""BasicMemory: a minimal stand-in for server.memory.MemoryManager, used only when asked for.

It does NOT summarize or recall: the context is only the system prompt and the new message, and the
context metadata says ``"memory": "basic"``. The server always wires the real MemoryManager; tests
(and benchmarks) that must not depend on the memory layer ask for this one with ``memory="basic"``
(see server.wiring).
"""
from __future__ import annotations

from typing import Any

from server.agent.base import BuiltContext
from server.agent.config import DEFAULT_SYSTEM_PROMPT
from storage.models import ChatMessage


class BasicMemory:
    """System prompt + new message; no summaries, no recall, search delegated to the store."""

    def __init__(self, store: Any, system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> None:
        self.store = store
        self.system_prompt = system_prompt

    async def build_context(self, session_id: str, user_id: str, new_message: ChatMessage,
                            model: str, reserve_tokens: int = 0) -> BuiltContext:
        """``reserve_tokens`` (the agent's tool schemas) is only recorded: there is no budget here."""
        record = await self.store.get(session_id)
        system = self.system_prompt if record.system_prompt is None else record.system_prompt
        messages = [{"role": "system", "content": system}, {"role": "user", "content": new_message.content}]
        meta = {"memory": "basic", "turns_kept": 0, "turns_dropped": 0, "summary_used": False,
                "recalled_turns": 0, "tool_schema_tokens": max(0, reserve_tokens)}
        return BuiltContext(messages=messages, metadata=meta)

    async def after_turn(self, session_id: str, user_id: str, answer: ChatMessage | None = None) -> None:
        return None

    async def search(self, user_id: str, query: str, *, session_id: str | None = None,
                     k: int = 5) -> list[dict]:
        hits = await self.store.search(user_id, query, session_id=session_id, limit=k)
        return [h.to_dict() for h in hits]
