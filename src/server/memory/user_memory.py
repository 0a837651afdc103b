"""Long-term user memory: durable facts and preferences of a user, learned from their turns and put
into the prompts of their *other* sessions when relevant (no tool call needed).

``learn`` distills the user messages of a finished turn (rules, or the summary model when one is
configured) into the user's ``UserMemoryStore``; ``choose`` picks what the next prompt gets:
every preference ("answer in Chinese") and the facts that share terms with the new message
(BM25 over the user's items, the recall engine; the message's ops nouns count in the other language
too, ``distill.other_language``: "生产数据库的主机是什么？" finds "The prod DB host is db-prod-43"),
best first, within ``user_memory.token_budget``.
Items from the current session are left out: that session's own history (window, summary,
recall) carries them. A newer statement about the same thing replaces the older one ("the DB host
is db-2" after "... is db-1"; ``distill.same_subject``, in English or Chinese), and a sentence
that takes something back ("Please forget that ...", "... is not db-1 anymore":
``distill.takes_back``) removes the items it names, of this user only, and is never kept itself. ``forget_messages`` takes back what was learned
from messages an edit supersedes, ``forget_session`` what was learned from a cleared or purged
session (``mark_forgetting`` first, so a crash in between cannot bring it back): an item another
session still states stays, and an item a withdrawn correction had replaced comes back
(``user_store.take_back``). ``learn`` skips messages of a session at or below its stored learned
position, so a forgotten item is never distilled again from the message it came from (after a
restart too).
"""
from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable

from server.memory.analyze import analyze
from server.memory.bm25 import BM25Index
from server.memory.config import UserMemoryConfig
from server.memory.context import Excerpt
from server.memory.distill import (distill_rules, other_language, retracts, same_subject,
                                   takes_back)
from server.memory.distill_model import SOURCE_RULES, distill_by_model
from server.memory.recall import format_time
from server.memory.tokens import TokenCounter, truncate_to_tokens
from server.memory.user_store import MemoryItem, Retraction, UserMemoryStore, new_item_id

MIN_ITEM_TOKENS = 8
INLINE_DISTILL_CHARS = 4000      # longer user messages are distilled in a worker thread
Titles = Callable[[list[str]], Awaitable[dict[str, str]]]    # session ids -> the titles of those that have one


def item_line(item: MemoryItem, title: str | None = None) -> str:
    """``- <text> (session "<title>", 2026-11-20 10:15 UTC)``: the session by its title
    (``titles.shown_title``), by its id when it has none."""
    where = f'"{title}"' if title else item.session_id
    return f"- {item.text} (session {where}, {format_time(item.created_at)})"


def item_subject(item: MemoryItem) -> str | None:
    """What an item is about, when a newer item about it replaces it, in either language
    (``distill.same_subject``: "The prod DB host is db-prod-43 now." replaces "生产数据库的主机是db-prod-42。")."""
    return same_subject(item.kind, item.text)


def retraction(session_id: str, message_id: int, taken: tuple[str, str]) -> Retraction:
    """The store's ``Retraction`` of a ``distill.takes_back`` entry of a message."""
    named = retracts(taken)
    return Retraction(session_id, message_id, lambda item: named(item.kind, item.text),
                      restorable=taken[0] != "forget")


def _distill(text: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    return distill_rules(text), takes_back(text)


class UserMemory:
    """See the module docstring. ``agent``/``model``: the summary model, when one is configured."""

    def __init__(self, config: UserMemoryConfig, store: UserMemoryStore, counter: TokenCounter,
                 agent: Any = None, model: str | None = None) -> None:
        self.config = config
        self.store = store
        self.counter = counter
        self.agent = agent
        self.model = model
        self._indexes: dict[str, tuple[tuple[str, ...], BM25Index]] = {}
        self._hidden: dict[str, int] = {}     # sessions being forgotten -> pending removals

    @property
    def uses_model(self) -> bool:
        return self.model is not None and self.agent is not None and not getattr(self.agent, "offline", True)

    def states_something(self, message: Any) -> bool | None:
        """Whether the rules distill anything from this user message, answered inline (microseconds),
        or None when that is not known without waiting (the summary model distills, or a long text
        is distilled in a worker thread)."""
        if self.uses_model or len(message.content) > INLINE_DISTILL_CHARS:
            return None
        return bool(distill_rules(message.content) or takes_back(message.content))

    async def learn(self, user_id: str, session_id: str, messages: list[Any]) -> list[MemoryItem]:
        """Distill the user messages among ``messages`` (ChatMessage) not distilled before (above the
        session's stored learned position) and store what is new, with the new position."""
        done = await self.store.learned(user_id, session_id)
        messages = [m for m in messages if m.id > done]
        if not messages:
            return []
        upto = max(m.id for m in messages)
        items: list[MemoryItem | Retraction] = []
        for m in messages:
            if m.role != "user" or not m.content.strip():
                continue
            source = SOURCE_RULES                # (the model's path says which one gave the items)
            if self.uses_model:
                taken = takes_back(m.content) if len(m.content) <= INLINE_DISTILL_CHARS else \
                    await asyncio.to_thread(takes_back, m.content)
                found, source = await distill_by_model(self.agent, self.model, m.content)
                # (what the message asks to forget, or says no longer holds, is not the model's to keep)
                named = [retracts(t) for t in taken]
                found = [(kind, text) for kind, text in found
                         if not takes_back(text) and not any(n(kind, text) for n in named)]
            elif len(m.content) > INLINE_DISTILL_CHARS:       # a pasted log: the regexes run off the loop
                found, taken = await asyncio.to_thread(_distill, m.content)
            else:
                found, taken = _distill(m.content)
            when = m.timestamp or datetime.now(timezone.utc).isoformat()
            items.extend(retraction(session_id, m.id, t) for t in taken)       # (before what it states anew)
            items.extend(MemoryItem(new_item_id(), kind, text, session_id, m.id, when, source)
                         for kind, text in found)
        if not items:
            return []
        added = await self.store.add(user_id, items, learned=(session_id, upto), key=item_subject)
        if added:
            self._indexes.pop(user_id, None)
        return added

    def _index(self, user_id: str, items: list[MemoryItem]) -> BM25Index:
        ids = tuple(i.id for i in items)
        cached = self._indexes.pop(user_id, None)
        if cached is None or cached[0] != ids:
            index = BM25Index()
            for item in items:
                index.add(item.id, analyze(item.text))
            cached = (ids, index)
        self._indexes[user_id] = cached
        while len(self._indexes) > self.config.max_users_cached:
            self._indexes.pop(next(iter(self._indexes)))
        return cached[1]

    async def choose(self, user_id: str, session_id: str, query: str,
                     titles: Titles | None = None) -> tuple[list[Excerpt], list[dict[str, Any]]]:
        """The items for this prompt (see the module docstring), formatted, within the budget, and what
        was left out of them before the prompt budget and why
        (``[{"ids": [item ids], "why": ...}]``, for the turn's trace). ``titles``: the titles of
        the sessions of the items kept (``SessionTitles.of``), to name each item's session by."""
        cfg = self.config
        items = [i for i in await self.store.list(user_id) if session_id not in i.sessions() and self._shown(i)]
        if not items or cfg.token_budget <= 0:
            return [], []
        by_id = {i.id: i for i in items}
        chosen = [i for i in reversed(items) if i.kind == "preference"]      # newest first
        terms = analyze(query) + analyze(other_language(query))   # (its ops nouns in the other language too)
        if terms:
            for item_id, _ in self._index(user_id, items).search(terms, len(items)):   # all: past k is recorded
                item = by_id[item_id]
                if item.kind != "preference":
                    chosen.append(item)
        out: list[Excerpt] = []
        remaining = cfg.token_budget
        over: list[str] = []
        named = await titles([i.session_id for i in chosen[: cfg.k]]) if titles is not None and chosen else {}
        for item in chosen[: cfg.k]:
            if over:
                over.append(item.id)
                continue
            line = item_line(item, named.get(item.session_id))
            n = self.counter.count(line)
            if n > remaining:
                if remaining < MIN_ITEM_TOKENS:
                    over.append(item.id)
                    continue
                line = truncate_to_tokens(self.counter, line, remaining - 1) + "…"
                n = self.counter.count(line)
            remaining -= n
            out.append(Excerpt([item.id], line, n))
        cut: list[dict[str, Any]] = []
        if over:
            cut.append({"ids": over, "why": f"over user_memory.token_budget ({cfg.token_budget} tokens)"})
        if len(chosen) > cfg.k:
            cut.append({"ids": [i.id for i in chosen[cfg.k:]], "why": f"past user_memory.k ({cfg.k} items)"})
        return out, cut

    async def list(self, user_id: str) -> list[MemoryItem]:
        """The user's items, without those of sessions being forgotten (as ``choose``): MEMORY_LIST
        and the ``user_memory`` tool never show what a clear is taking back."""
        return [i for i in await self.store.list(user_id) if self._shown(i)]

    def _shown(self, item: MemoryItem) -> bool:
        """Not only stated in sessions being forgotten."""
        return not self._hidden or any(s not in self._hidden for s in item.sessions())

    async def forget(self, user_id: str, item_id: str) -> bool:
        found = await self.store.forget(user_id, item_id)
        if found:
            self._indexes.pop(user_id, None)
        return found

    async def forget_messages(self, user_id: str, session_id: str, message_ids: list[int]) -> int:
        """Remove what was learned from these messages of ``session_id`` (an edit supersedes them)."""
        n = await self.store.forget_messages(user_id, session_id, message_ids)
        if n:
            self._indexes.pop(user_id, None)
        return n

    async def mark_forgetting(self, user_id: str, session_id: str) -> None:
        """Leave the session's items out of prompts at once and note durably that they are being
        forgotten (``forget_session`` ends it; a crash in between: the next start drops them)."""
        self.hide_session(session_id)
        try:
            await self.store.mark_forgetting(user_id, session_id)
        except BaseException:
            self.unhide_session(session_id)
            raise

    def unhide_session(self, session_id: str) -> None:
        left = self._hidden.get(session_id, 0) - 1
        if left > 0:
            self._hidden[session_id] = left
        else:
            self._hidden.pop(session_id, None)

    def hide_session(self, session_id: str) -> None:
        """Leave the session's items out of prompts until ``forget_session`` has removed them."""
        self._hidden[session_id] = self._hidden.get(session_id, 0) + 1

    async def forget_session(self, user_id: str, session_id: str, upto: int | None = None) -> int:
        """Remove everything learned from ``session_id`` (after ``hide_session``, if it was called);
        ``upto``: the highest message id the clear took back (``UserMemoryStore.forget_session``: a
        learning of a message at or below it that ends later adds nothing, on any node)."""
        try:
            n = await self.store.forget_session(user_id, session_id, upto)
        finally:
            self.unhide_session(session_id)
        if n:
            self._indexes.pop(user_id, None)
        return n

    async def close(self) -> None:
        self._indexes.clear()
        await self.store.close()
