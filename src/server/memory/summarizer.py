"""Rolling summaries: when to summarize, where to cut, and how to produce the text.

After a turn, the messages not yet covered by the latest summary are checked against the
triggers (OR'ed). The cut keeps the ``keep`` most recent messages verbatim and only falls at a
user-message boundary, so a turn -- and with it every tool call and its result -- is never split.
The new summary folds the previous summary with the newly covered messages (the transcript part
trimmed to ``trim_tokens_to_summarize``, most recent part kept), so nothing summarized before can
fall out. A model summary over ``max_summary_tokens``, or any exception of the model call (an
answer cut at its output limit included), is a failed summary: the previous one stays. With an
offline agent (or none) the extractive summarizer writes it instead, in a worker thread (it reads
only its arguments).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Sequence

from storage.models import ChatMessage, SummaryRecord, now_iso

from server.memory.config import ContextConfig, SummarizationConfig, Threshold
from server.memory.context import build_turns, cut_middle, in_prompt
from server.memory.extractive import extractive_summary
from server.memory.tokens import TokenCounter, truncate_to_tokens

EXTRACTIVE_MODEL = "extractive"
MAX_TOOL_RESULT_CHARS = 500       # per tool result in the transcript sent to the summarizer
# the request asks for at most max_summary_tokens / this many words: well within the limit (a word is
# one to two tokens), and within the summary request's default output limit ([llm] max_tokens 1024)
TOKENS_PER_WORD_ASKED = 4
# a previous summary over this many times max_summary_tokens (stored before that limit existed) goes
# into the request cut in the middle (head and tail kept), so the request stays bounded
PREVIOUS_SUMMARY_FACTOR = 4
PREVIOUS_CUT_NOTE = "[... {n} characters of the previous summary cut here ...]"


class SummaryFailed(Exception):
    """The summarizer produced nothing usable (the caller changes nothing)."""


class NothingToSummarize(Exception):
    """Every message of the plan is one the model never sees (superseded) and there is no previous
    summary to carry over: nothing is stored, and it is no failure (the next cut reaches live ones)."""


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


def fires(config: SummarizationConfig, context: ContextConfig, n_messages: int, tokens: int) -> bool:
    """True when any trigger fires on ``n_messages`` uncovered messages worth ``tokens``."""
    for t in config.trigger:
        if t.type == "messages" and n_messages >= t.value:
            return True
        if t.type in ("tokens", "fraction") and tokens >= _tokens_limit(t, context):
            return True
    return False


def cut_at(config: SummarizationConfig, context: ContextConfig, roles: Sequence[str], costs: Sequence[int]) -> int:
    """``cut_index`` on the messages' roles: how many leading messages to cover (0: none)."""
    n = len(roles)
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
            if roles[-1] != "user":              # the end is a boundary once the last turn finished
                return i
        elif roles[i] == "user":
            return i
    return 0


def cut_index(config: SummarizationConfig, context: ContextConfig, messages: list[ChatMessage],
              costs: list[int]) -> int:
    """How many leading messages to cover: the largest user-message boundary leaving ``keep`` verbatim."""
    return cut_at(config, context, [m.role for m in messages], costs)


def plan_cut(config: SummarizationConfig, context: ContextConfig, roles: Sequence[str], costs: Sequence[int],
             total: int | None = None) -> int:
    """How many leading uncovered messages a summary would cover now (0: no trigger or no boundary)."""
    if not config.enabled or not roles:
        return 0
    if not fires(config, context, len(roles), sum(costs) if total is None else total):
        return 0
    return cut_at(config, context, roles, costs)


def plan(config: SummarizationConfig, context: ContextConfig, previous: SummaryRecord | None,
         uncovered: list[ChatMessage], counter: TokenCounter, costs: list[int] | None = None) -> Plan | None:
    """What to summarize now, or None (no trigger fired, or no boundary to cut at).

    ``costs``: ``message_costs(uncovered, counter)`` when the caller has them already.
    """
    if not config.enabled or not uncovered:
        return None
    if costs is None:
        costs = message_costs(uncovered, counter)
    i = plan_cut(config, context, [m.role for m in uncovered], costs)
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
    if max_tokens is None:
        return "\n".join(b for b in (render(m) for m in messages) if b)
    kept: list[str] = []
    used = 0
    for m in reversed(messages):             # newest first: older messages are rendered only if they fit
        block = render(m)
        if not block:
            continue
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
    """The one-shot chat request that produces the new rolling summary (it asks for at most about
    ``max_summary_tokens // TOKENS_PER_WORD_ASKED`` words: a longer answer is refused)."""
    words = max(1, config.max_summary_tokens // TOKENS_PER_WORD_ASKED)
    body = (f"Previous summary:\n{previous.strip() or '(none)'}\n\n"
            f"New messages to fold into the summary:\n{text}\n\n"
            f"Write the updated summary now, in at most about {words} words (drop the least important "
            "details to stay within that).")
    return [{"role": "system", "content": config.summary_prompt}, {"role": "user", "content": body}]


async def summarize(p: Plan, config: SummarizationConfig, counter: TokenCounter, agent: Any,
                    model: str | None) -> SummaryRecord:
    """Produce the new rolling summary for ``p``; raises SummaryFailed on an error (any exception of
    ``agent.complete``, e.g. an answer cut at the output limit), an empty text, or a model summary
    over ``max_summary_tokens``.
    What never reaches the model (superseded messages, empty error answers: ``context.in_prompt``)
    is not summarized either; the summary still covers their ids. With none of the others, the
    previous summary is carried over to the new range (no model call), or ``NothingToSummarize``."""
    previous = p.previous.text if p.previous is not None else ""
    covered = [m for m in p.covered if in_prompt(m)]
    if not covered:                      # only superseded messages: nothing new to fold in
        if p.previous is None:
            raise NothingToSummarize(f"messages {p.covered[0].id}-{p.covers_to_id} were all superseded")
        return SummaryRecord(text=p.previous.text, covers_from_id=p.covers_from_id, covers_to_id=p.covers_to_id,
                             created_at=now_iso(), model=p.previous.model)
    extractive = agent is None or getattr(agent, "offline", False)
    if extractive:                       # pure CPU, proportional to the text: off the loop
        text, used_model = await asyncio.to_thread(extractive_summary, previous, covered), EXTRACTIVE_MODEL
    else:
        room = PREVIOUS_SUMMARY_FACTOR * config.max_summary_tokens
        req = request_messages(config, cut_middle(counter, previous, room, PREVIOUS_CUT_NOTE),
                               transcript(covered, counter, config.trim_tokens_to_summarize))
        try:
            text = await agent.complete(req, model)
        except Exception as exc:        # any LLM failure: nothing changes, the caller counts it
            raise SummaryFailed(f"{type(exc).__name__}: {exc}") from exc
        used_model = model or getattr(agent, "default_model", "") or ""
    if not isinstance(text, str) or not text.strip():
        raise SummaryFailed("the summarizer returned an empty text")
    if not extractive and (n := counter.count(text.strip())) > config.max_summary_tokens:
        # (the extractive summary is bounded by its section caps instead)
        raise SummaryFailed(f"the summary counts {n} tokens, over summarization.max_summary_tokens "
                            f"({config.max_summary_tokens})")
    return SummaryRecord(text=text.strip(), covers_from_id=p.covers_from_id, covers_to_id=p.covers_to_id,
                         created_at=now_iso(), model=used_model)
