"""Rolling summaries: when to summarize, where to cut, and how to produce the text.

After a turn, the messages not yet covered by the latest summary are checked against the
triggers (OR'ed). The cut keeps the ``keep`` most recent messages verbatim and only falls at a
user-message boundary, so a turn -- and with it every tool call and its result -- is never split.
The new summary folds the previous summary with the newly covered messages (the transcript part
trimmed to ``trim_tokens_to_summarize``, most recent part kept), so nothing summarized before can
fall out. With an offline agent (or none) the extractive summarizer writes it instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from storage.models import ChatMessage, SummaryRecord, now_iso

from .config import ContextConfig, SummarizationConfig, Threshold
from .context import build_turns
from .extractive import extractive_summary
from .tokens import TokenCounter, truncate_to_tokens

EXTRACTIVE_MODEL = "extractive"
MAX_TOOL_RESULT_CHARS = 500       # per tool result in the transcript sent to the summarizer


class SummaryFailed(Exception):
    """The summarizer produced nothing usable (the caller changes nothing)."""


@dataclass(slots=True)
class Plan:
    previous: SummaryRecord | None
    covered: list[ChatMessage]        # the messages the new summary adds (ascending)
    kept: list[ChatMessage]           # the messages that stay verbatim

    @property
    def covers_from_id(self) -> int:
        return self.previous.covers_from_id if self.previous is not None else self.covered[0].id

    @property
    def covers_to_id(self) -> int:
        return self.covered[-1].id


def message_costs(messages: list[ChatMessage], counter: TokenCounter) -> list[int]:
    """Prompt tokens of each stored message once expanded (tool calls and results included)."""
    costs = []
    for m in messages:
        turns = build_turns([m], counter)
        costs.append(sum(t.tokens for t in turns))
    return costs


def _tokens_limit(t: Threshold, context: ContextConfig) -> float:
    return t.value * context.window if t.type == "fraction" else t.value


def triggered(config: SummarizationConfig, context: ContextConfig, messages: list[ChatMessage],
              costs: list[int]) -> bool:
    """True when any trigger fires on the uncovered ``messages``."""
    total = sum(costs)
    for t in config.trigger:
        if t.type == "messages" and len(messages) >= t.value:
            return True
        if t.type in ("tokens", "fraction") and total >= _tokens_limit(t, context):
            return True
    return False


def cut_index(config: SummarizationConfig, context: ContextConfig, messages: list[ChatMessage],
              costs: list[int]) -> int:
    """How many leading messages to cover: the largest user-message boundary leaving ``keep`` verbatim."""
    n = len(messages)
    keep = config.keep
    if keep.type == "messages":
        target = n - int(keep.value)
    else:
        limit, acc, target = _tokens_limit(keep, context), 0.0, n
        while target > 0 and acc < limit:
            target -= 1
            acc += costs[target]
    for i in range(min(target, n), 0, -1):
        if i == n:
            if messages[-1].role != "user":      # the end is a boundary once the last turn finished
                return i
        elif messages[i].role == "user":
            return i
    return 0


def plan(config: SummarizationConfig, context: ContextConfig, previous: SummaryRecord | None,
         uncovered: list[ChatMessage], counter: TokenCounter) -> Plan | None:
    """What to summarize now, or None (no trigger fired, or no boundary to cut at)."""
    if not config.enabled or not uncovered:
        return None
    costs = message_costs(uncovered, counter)
    if not triggered(config, context, uncovered, costs):
        return None
    i = cut_index(config, context, uncovered, costs)
    if i <= 0:
        return None
    return Plan(previous, uncovered[:i], uncovered[i:])


def render(m: ChatMessage) -> str:
    """One stored message as transcript text for the summarizer."""
    lines = []
    for c in sorted(m.tool_calls, key=lambda c: c.step):
        result = " ".join((c.result or "").split())
        if len(result) > MAX_TOOL_RESULT_CHARS:
            result = result[:MAX_TOOL_RESULT_CHARS] + "…"
        lines.append(f"[tool {c.tool_name} {c.arguments} -> {c.status}] {result}")
    if m.content:
        lines.append(f"{m.role.capitalize()}: {m.content}")
    return "\n".join(lines)


def transcript(messages: list[ChatMessage], counter: TokenCounter, max_tokens: int | None) -> str:
    """The covered messages as text, trimmed to ``max_tokens`` keeping the most recent part."""
    blocks = [b for b in (render(m) for m in messages) if b]
    if max_tokens is None:
        return "\n".join(blocks)
    kept: list[str] = []
    used = 0
    for block in reversed(blocks):
        cost = counter.count(block) + 1
        if used + cost > max_tokens:
            room = max_tokens - used - 1
            if room > 0:
                kept.append(truncate_to_tokens(counter, block, room, keep_end=True))
            break
        kept.append(block)
        used += cost
    return "\n".join(reversed(kept))


def request_messages(config: SummarizationConfig, previous: str, text: str) -> list[dict[str, Any]]:
    """The one-shot chat request that produces the new rolling summary."""
    body = (f"Previous summary:\n{previous.strip() or '(none)'}\n\n"
            f"New messages to fold into the summary:\n{text}\n\n"
            "Write the updated summary now.")
    return [{"role": "system", "content": config.summary_prompt}, {"role": "user", "content": body}]


async def summarize(p: Plan, config: SummarizationConfig, counter: TokenCounter, agent: Any,
                    model: str | None) -> SummaryRecord:
    """Produce the new rolling summary for ``p``; raises SummaryFailed on an error or an empty text."""
    previous = p.previous.text if p.previous is not None else ""
    if agent is None or getattr(agent, "offline", False):
        text, used_model = extractive_summary(previous, p.covered), EXTRACTIVE_MODEL
    else:
        req = request_messages(config, previous, transcript(p.covered, counter, config.trim_tokens_to_summarize))
        try:
            text = await agent.complete(req, model)
        except Exception as exc:        # any LLM failure: nothing changes, the caller counts it
            raise SummaryFailed(f"{type(exc).__name__}: {exc}") from exc
        used_model = model or getattr(agent, "default_model", "") or ""
    if not isinstance(text, str) or not text.strip():
        raise SummaryFailed("the summarizer returned an empty text")
    return SummaryRecord(text=text.strip(), covers_from_id=p.covers_from_id, covers_to_id=p.covers_to_id,
                         created_at=now_iso(), model=used_model)
