"""Prompt assembly: system prompt, summary, recalled excerpts, recent turns, new message -- within budget.

Turns are the unit everywhere: a turn is a stored user message plus the messages answering it,
expanded with ``server.agent.transcript.history_to_openai`` (an assistant message with
``tool_calls`` is always followed by its tool results). ``sanitize`` then guarantees the pairing on
whatever comes out: a tool result without its call, or a call without its result, is never emitted.

A turn that ended without an answer (the endpoint failed, the turn was cancelled or interrupted)
is replayed with a short placeholder answer (``NO_ANSWER_TEXTS``), and a partial answer with
``CUT_OFF_NOTE`` appended (``expand_message``), so user and assistant messages keep alternating
(strict chat templates reject two user messages in a row) and the model knows the answer is
missing or incomplete; ``assemble`` gives any window turn still without an answer ``NO_ANSWER``.

The window turns' tool results together hold at most ``WINDOW_RESULTS_SHARE`` of the message budget
(beyond it they are cut, oldest first, even when the prompt would fit), so that a follow-up turn that
calls tools has room for its own results.
Over budget, the assembler gives up, in order: what the summary holds beyond ``SUMMARY_SHARE`` of
the budget (its tail), the middle of the window turns' oversize user and assistant texts (more than
``WINDOW_TEXT_SHARE`` of the budget: the longest first, never below ``WINDOW_TEXT_MIN_TOKENS``,
marked with ``WINDOW_TEXT_CUT_NOTE``), the window turns' tool results (cut, oldest turn first, each
keeping its call id, marked with ``WINDOW_CUT_NOTE``), whole oldest turns, recalled excerpts (lowest
rank first), long-term memory items (lowest rank first), the rest of the summary's tail, the new
message's tail (with a note), and last the system prompt's tail.
The budget is what the window leaves for the messages: what every request carries besides them (the
agent's tool schemas, ``reserve``) is taken off first, never below ``MIN_PROMPT_BUDGET``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from server.agent.base import BuiltContext
from server.agent.transcript import history_to_openai
from storage.models import ChatMessage, SummaryRecord

from server.memory.config import MIN_PROMPT_BUDGET
from server.memory.tokens import TokenCounter, message_tokens, splits_at_whitespace, truncate_to_tokens

TRUNCATION_NOTE = "\n[message truncated to fit the model's context window]"
SUMMARY_TRIMMED_NOTE = "\n[summary truncated to fit the context window]"
MEMORY_HEADER = ("What this user told you in earlier sessions (long-term memory; it may be outdated, "
                 "the current conversation wins):")
RECALL_HEADER = ("Excerpts recalled from earlier in this conversation (older turns, for reference; "
                 "they may be outdated):")
# the answer of a turn that ended early, as replayed in later prompts (``expand_message``)
ENDED_EARLY = ("error", "cancelled", "interrupted")          # the finish reasons of a turn that ended early
NO_ANSWER_TEXTS = {"error": "[no answer: the model endpoint failed]",       # LLM_ERROR, LLM_TIMEOUT
                   "cancelled": "[no answer: the turn was cancelled]",
                   "interrupted": "[no answer: the turn was interrupted]"}
NO_ANSWER_FAILED = "[no answer: the turn failed]"            # any other error code (e.g. INTERNAL)
NO_ANSWER = "[no answer]"                                    # a window turn with no stored answer at all
CUT_OFF_NOTE = "\n[answer cut off]"                          # after the text of a partial answer
# a window turn's tool result cut to fit the budget (the agent's own steps use the same wording)
WINDOW_CUT_NOTE = "[... cut to fit the context budget: {n} more characters]"
# the share of the message budget the window turns' tool results may hold together: beyond it they
# are cut (oldest first) even when the prompt would fit, so a follow-up that calls tools has room
# for its own results (the agent fits them into what the prompt leaves, docs/agent.md)
WINDOW_RESULTS_SHARE = 0.5
# a window turn's user or assistant text cut to fit the budget: its head and tail kept, this in between
WINDOW_TEXT_CUT_NOTE = "[... {n} characters cut here to fit the context budget ...]"
# a window turn's user or assistant text holding more than this share of the message budget is
# oversize (a pasted log, a very long answer): over budget, the oversize texts are cut (the longest
# first, all to one level) before any whole turn is dropped, so the other turns, small older ones
# included, stay. (Before, one such text larger than the budget dropped every window turn.) Shorter
# texts are never cut: when the window is full of them, the oldest turns go whole, as before.
WINDOW_TEXT_SHARE = 0.5
# an oversize text is never cut below this many tokens: when the texts at this size still do not
# fit, the oldest turns go whole
WINDOW_TEXT_MIN_TOKENS = 256
# the share of the message budget the summary may hold when the prompt is over budget: what it holds
# beyond it (its tail) goes before any window turn is cut or dropped (a summary stored before
# summarization.max_summary_tokens, or a long extractive one, could otherwise push every turn out)
SUMMARY_SHARE = 0.25


@dataclass(slots=True)
class Turn:
    """One turn ready for the prompt."""
    messages: list[dict[str, Any]]
    ids: list[int]
    tokens: int = 0


@dataclass(slots=True)
class Excerpt:
    """One recalled turn or long-term memory item, already formatted (``tokens``: its count, when known)."""
    ids: list[Any]                   # message ids (a recalled turn) or [item id] (a memory item)
    text: str
    tokens: int | None = None


@dataclass(slots=True)
class Parts:
    """Everything the assembler may put in a prompt."""
    system_prompt: str
    new_message: str
    summary: SummaryRecord | None = None
    excerpts: list[Excerpt] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)          # oldest first
    flags: dict[str, Any] = field(default_factory=dict)      # extra metadata (e.g. summary_fallback)
    memory: list[Excerpt] = field(default_factory=list)      # long-term user memory items, best first


def in_prompt(m: ChatMessage) -> bool:
    """False for what never goes to the model: messages superseded by a regenerate or an edit
    (docs/server.md, "Regenerate and edit") and failed answers with nothing in them."""
    meta = m.metadata
    return not (meta.get("superseded") or (meta.get("error") and not m.content and not m.tool_calls))


def ended_early(m: ChatMessage) -> bool:
    """True for an assistant message stored by a turn that did not finish: failed, cancelled or
    interrupted (its content, possibly empty, is what was streamed before)."""
    meta = m.metadata
    return m.role == "assistant" and (meta.get("finish_reason") in ENDED_EARLY or bool(meta.get("error"))
                                      or bool(meta.get("interrupted")))


def no_answer_text(m: ChatMessage) -> str:
    """The placeholder that stands for the missing answer of ``m`` (a turn that ended early)."""
    meta = m.metadata
    if meta.get("error") or meta.get("finish_reason") == "error":
        code = str(meta.get("error") or "")
        return NO_ANSWER_TEXTS["error"] if not code or code.startswith("LLM_") else NO_ANSWER_FAILED
    reason = "interrupted" if meta.get("interrupted") else meta.get("finish_reason")
    return NO_ANSWER_TEXTS.get(str(reason), NO_ANSWER)


def expand_message(m: ChatMessage) -> list[dict[str, Any]]:
    """One stored message as prompt messages: ``history_to_openai`` then ``sanitize``; nothing for a
    superseded message. The answer of a turn that ended early (``ended_early``) always ends in an
    assistant text: its partial text with ``CUT_OFF_NOTE``, or the ``no_answer_text`` placeholder
    (after its tool steps, if any)."""
    if m.metadata.get("superseded"):
        return []
    if not ended_early(m):
        return sanitize(history_to_openai([m])) if in_prompt(m) else []
    out = sanitize(history_to_openai([m]))
    last = out[-1] if out else None
    if last is not None and last.get("role") == "assistant" and not last.get("tool_calls") and last.get("content"):
        out[-1] = {**last, "content": last["content"] + CUT_OFF_NOTE}
    else:
        out.append({"role": "assistant", "content": no_answer_text(m)})
    return out


def has_answer(messages: list[dict[str, Any]]) -> bool:
    """True unless ``messages`` (one turn) start with a user message and do not end with an assistant
    text (the answer): such a turn would put two user messages in a row, or a tool result right
    before the next question."""
    if not messages or messages[0].get("role") != "user":
        return True
    last = messages[-1]
    return last.get("role") == "assistant" and not last.get("tool_calls")


def group_turns(messages: list[ChatMessage]) -> list[list[ChatMessage]]:
    """Split ascending messages at each user message (leading non-user messages form their own group)."""
    groups: list[list[ChatMessage]] = []
    for m in messages:
        if m.role == "user" or not groups:
            groups.append([m])
        else:
            groups[-1].append(m)
    return groups


def sanitize(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep only complete tool-call groups: each assistant ``tool_calls`` entry followed by its result.

    Calls without a result are removed from their assistant message (which is dropped when nothing
    remains); tool messages that do not answer the immediately preceding assistant message are dropped.
    """
    out: list[dict[str, Any]] = []
    i, n = 0, len(messages)
    while i < n:
        m = messages[i]
        role = m.get("role")
        if role == "tool":                       # not right after its assistant message: orphan
            i += 1
            continue
        if role != "assistant" or not m.get("tool_calls"):
            out.append(m)
            i += 1
            continue
        calls: list[dict[str, Any]] = []
        wanted: set[str] = set()
        for c in m["tool_calls"]:                # the first call of each id
            if isinstance(c, dict) and c.get("id") and c["id"] not in wanted:
                calls.append(c)
                wanted.add(c["id"])
        results: dict[str, dict[str, Any]] = {}
        i += 1
        while i < n and messages[i].get("role") == "tool":
            tid = messages[i].get("tool_call_id")
            if tid in wanted and tid not in results:
                results[tid] = messages[i]
            i += 1
        kept = [c for c in calls if c["id"] in results]
        if kept:
            out.append({**m, "tool_calls": kept})
            out.extend(results[c["id"]] for c in kept)
        elif m.get("content"):
            out.append({k: v for k, v in m.items() if k != "tool_calls"})
    return out


def build_turns(messages: list[ChatMessage], counter: TokenCounter) -> list[Turn]:
    """Stored messages -> prompt turns (empty ones skipped), token counts filled in; each message is
    expanded by ``expand_message``."""
    turns = []
    for group in group_turns(messages):
        expanded = sanitize([x for m in group for x in expand_message(m)])
        if expanded:
            turns.append(Turn(expanded, [m.id for m in group],
                              sum(message_tokens(counter, x) for x in expanded)))
    return turns


def recent_turns(messages: list[ChatMessage], n: int, counter: TokenCounter) -> tuple[list[Turn], int]:
    """The newest ``n`` non-empty turns (oldest first) and how many older groups were left out.

    Only those turns are expanded, so a long unsummarized session costs O(n) per prompt.
    """
    groups = group_turns(messages)
    out: list[Turn] = []
    i = len(groups)
    while i > 0 and len(out) < n:
        i -= 1
        out.extend(build_turns(groups[i], counter))
    out.reverse()
    return out, i


def summary_message(summary: SummaryRecord, text: str | None = None) -> dict[str, Any]:
    body = summary.text if text is None else text
    return {"role": "system", "content": f"Summary of the earlier conversation (messages "
                                         f"{summary.covers_from_id}-{summary.covers_to_id}):\n{body}"}


def memory_message(items: list[Excerpt]) -> dict[str, Any]:
    return {"role": "system", "content": MEMORY_HEADER + "\n" + "\n".join(e.text for e in items)}


def recall_message(excerpts: list[Excerpt]) -> dict[str, Any]:
    return {"role": "system", "content": RECALL_HEADER + "\n" + "\n".join(e.text for e in excerpts)}


class _Prompt:
    """The current selection; each part's tokens are counted once (memoized) however often it is re-priced.

    ``stable``: a memo kept by the caller across prompts for the parts that rarely change (the
    system prompt and the summary message), keyed like the per-prompt one.
    """

    def __init__(self, parts: Parts, counter: TokenCounter, stable: dict[tuple[str, str], int] | None) -> None:
        self.counter = counter
        self.system = parts.system_prompt
        self.summary = parts.summary
        self.summary_text = parts.summary.text if parts.summary else None
        self.excerpts = list(parts.excerpts)
        self.memory = list(parts.memory)
        self.turns = list(parts.turns)
        self.new = parts.new_message
        self.base = counter.count_messages([])
        self._memo: dict[tuple[str, str], int] = {}
        self._stable = stable if stable is not None else self._memo
        self.additive = splits_at_whitespace(counter)

    def messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.system:
            out.append({"role": "system", "content": self.system})
        if self.memory:
            out.append(memory_message(self.memory))
        if self.summary is not None and self.summary_text:
            out.append(summary_message(self.summary, self.summary_text))
        if self.excerpts:
            out.append(recall_message(self.excerpts))
        for t in self.turns:
            out.extend(t.messages)
        out.append({"role": "user", "content": self.new})
        return out

    def _tokens(self, message: dict[str, Any], stable: bool = False) -> int:
        memo = self._stable if stable else self._memo
        key = (message["role"], message["content"])     # str hashes are cached: lookups stay cheap
        n = memo.get(key)
        if n is None:
            n = memo[key] = message_tokens(self.counter, message)
        return n

    def summary_tokens(self) -> int:
        """The tokens of the summary message (0 without one)."""
        if self.summary is None or not self.summary_text:
            return 0
        return self._tokens(summary_message(self.summary, self.summary_text), True)

    def estimate(self) -> int:
        n = self.base + sum(t.tokens for t in self.turns) + self.summary_tokens()
        if self.system:
            n += self._tokens({"role": "system", "content": self.system}, True)
        if self.excerpts:
            if self.additive and all(e.tokens is not None for e in self.excerpts):
                # the header message's tokens plus each excerpt's: they are joined at newlines
                n += self._tokens({"role": "system", "content": RECALL_HEADER}, True) + \
                    sum(e.tokens or 0 for e in self.excerpts)
            else:
                n += self._tokens(recall_message(self.excerpts))
        if self.memory:
            n += self._tokens(memory_message(self.memory))
        return n + self._tokens({"role": "user", "content": self.new})


def _shrink(counter: TokenCounter, text: str, excess: int, note: str) -> str:
    """``text`` cut by at least ``excess`` tokens (plus room for ``note``), note appended; "" if nothing fits."""
    room = counter.count(text) - excess - counter.count(note) - 1
    if room <= 0:
        return ""
    return truncate_to_tokens(counter, text, room) + note


def _answered(turn: Turn, counter: TokenCounter) -> Turn:
    """``turn`` itself, or a copy ending in the ``NO_ANSWER`` placeholder when it has no answer
    (``has_answer``): e.g. an unanswered user message, or a turn expanded without ``expand_message``."""
    if has_answer(turn.messages):
        return turn
    filler = {"role": "assistant", "content": NO_ANSWER}
    return Turn([*turn.messages, filler], turn.ids, turn.tokens + message_tokens(counter, filler))


def _cut_result(counter: TokenCounter, message: dict[str, Any], excess: int) -> tuple[dict[str, Any], int] | None:
    """A tool result about ``excess`` tokens shorter (its head kept, ``WINDOW_CUT_NOTE`` appended, its
    ``tool_call_id`` kept) and the change in tokens (negative); None when that would not make it shorter."""
    content = message.get("content")
    if not isinstance(content, str) or not content:
        return None
    tokens = message_tokens(counter, message)
    empty = message_tokens(counter, {**message, "content": ""})
    keep = tokens - empty - excess - counter.count(WINDOW_CUT_NOTE.format(n=len(content))) - 1
    part = truncate_to_tokens(counter, content, keep) if keep > 0 else ""
    note = WINDOW_CUT_NOTE.format(n=len(content) - len(part))
    shorter = {**message, "content": f"{part}\n{note}" if part else note}
    n = message_tokens(counter, shorter)
    return (shorter, n - tokens) if n < tokens else None


def cut_middle(counter: TokenCounter, text: str, max_tokens: int, note: str = WINDOW_TEXT_CUT_NOTE) -> str:
    """``text`` in about ``max_tokens`` tokens: its head and its tail (half the room each) with
    ``note`` (``{n}``: the characters cut) on a line of its own in between; ``text`` when it fits."""
    if counter.count(text) <= max_tokens:
        return text
    marker = note.format(n=len(text))
    room = max_tokens - counter.count(marker) - 2
    if room <= 0:
        return marker
    head = truncate_to_tokens(counter, text, room - room // 2)
    tail = truncate_to_tokens(counter, text[len(head):], room // 2, keep_end=True)
    return f"{head}\n{note.format(n=len(text) - len(head) - len(tail))}\n{tail}"


def oversize_tokens(budget: int) -> int:
    """A window text counting more than this many tokens is oversize (``WINDOW_TEXT_SHARE``)."""
    return max(WINDOW_TEXT_MIN_TOKENS, int(budget * WINDOW_TEXT_SHARE))


def _text_tokens(counter: TokenCounter, message: dict[str, Any], over: int) -> int:
    """The tokens of a user or assistant message's text when it is oversize (more than ``over``), else 0."""
    content = message.get("content")
    if message.get("role") not in ("user", "assistant") or not isinstance(content, str) or 4 * len(content) <= over:
        return 0                                  # (a token is at least one UTF-8 byte: the count is no more)
    n = counter.count(content)
    return n if n > over else 0


def _fully_cut_tokens(counter: TokenCounter, turn: Turn, over: int) -> int:
    """The tokens of ``turn`` with every tool result cut down to its marker (where that is shorter)
    and every oversize text (more than ``over`` tokens) to about ``WINDOW_TEXT_MIN_TOKENS``."""
    n = turn.tokens
    for m in turn.messages:
        content = m.get("content")
        if m.get("role") == "tool" and isinstance(content, str) and content:
            gain = message_tokens(counter, m) - message_tokens(
                counter, {**m, "content": WINDOW_CUT_NOTE.format(n=len(content))})
            n -= max(0, gain)
        elif (size := _text_tokens(counter, m, over)):
            n -= size - WINDOW_TEXT_MIN_TOKENS
    return n


def _results_tokens(counter: TokenCounter, turns: list[Turn]) -> int:
    """The tokens of the tool results in ``turns``."""
    return sum(message_tokens(counter, m) for t in turns for m in t.messages if m.get("role") == "tool")


class _ResultCutter:
    """Cuts the window turns' tool results, one cut per call: oldest turn first, in order within a
    turn; each cut takes what the results are over their share (``WINDOW_RESULTS_SHARE``) or the
    prompt is over the budget at that moment, and a result is cut as far as it goes before the next.
    Before them (over budget), ``cut_texts`` cuts the middle of the oversize user and assistant texts
    (more than ``oversize_tokens(budget)``), all to one level.

    ``drop_first`` first drops the oldest turns that must go even with every result and oversize
    text cut, so only the turns that stay are cut (and the newest of them last)."""

    def __init__(self, p: _Prompt, budget: int) -> None:
        self.p = p
        self.over = oversize_tokens(budget)
        self.turn = 0
        self.pos = 0
        self.cuts = [0] * len(p.turns)              # results cut per kept turn (dropped with its turn)
        self.partial: tuple[dict[str, Any], int] | None = None   # the result under the cursor, cut partly:
        #                                                          (its whole message, the tokens it gave up)
        # per kept turn: the texts cut so far, {index in the turn: (the whole message, its text's tokens)}
        self.texts: list[dict[int, tuple[dict[str, Any], int]]] = [{} for _ in p.turns]
        self.level: int | None = None               # the tokens every oversize text is cut to (None: none cut)

    def drop_first(self, total: int, budget: int) -> int:
        """Drop the fewest oldest turns without which the prompt (estimated at ``total``) fits once
        the rest have every result and oversize text cut; how many were dropped."""
        turns = self.p.turns
        least = [_fully_cut_tokens(self.p.counter, t, self.over) for t in turns]
        need = total - sum(t.tokens for t in turns) + sum(least)
        k = 0
        while k < len(turns) and need > budget:
            need -= least[k]
            k += 1
        del turns[:k], self.cuts[:k], self.texts[:k]
        return k

    def text_cuts(self) -> list[int]:
        """How many texts are cut in each kept turn."""
        return [len(t) for t in self.texts]

    def cut_texts(self, excess: int) -> bool:
        """Cut the oversize user and assistant texts of the window turns to one lower level, the
        highest that saves about ``excess`` tokens, never below ``WINDOW_TEXT_MIN_TOKENS`` (each
        keeps its head and tail, ``cut_middle``); False when none can be cut further."""
        counter, turns = self.p.counter, self.p.turns
        if self.level == WINDOW_TEXT_MIN_TOKENS:     # every oversize text is down to the floor already
            return False
        found: list[tuple[int, int, dict[str, Any], int]] = []      # (turn, index, whole message, its tokens)
        for ti, t in enumerate(turns):
            for mi, m in enumerate(t.messages):
                got = self.texts[ti].get(mi)
                if got is not None:
                    found.append((ti, mi, *got))
                elif (size := _text_tokens(counter, m, self.over)):
                    found.append((ti, mi, m, size))
        if not found:
            return False
        now = min(self.level, max(f[3] for f in found)) if self.level is not None else max(f[3] for f in found)

        def saved(level: int) -> int:                # what lowering every text from ``now`` to ``level`` saves
            return sum(min(n, now) - min(n, level) for *_, n in found)

        lo, hi = WINDOW_TEXT_MIN_TOKENS, now          # the highest level that saves ``excess`` (or the floor)
        if hi <= lo:
            return False
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if saved(mid) >= excess:
                lo = mid
            else:
                hi = mid - 1
        level = lo                                   # (< now: ``excess`` is at least 1)
        self.level = level
        changed = False
        for ti, mi, whole, n in found:
            if n <= level:
                continue
            t = turns[ti]
            old = t.messages[mi]
            shorter = {**whole, "content": cut_middle(counter, whole["content"], level)}
            if shorter == old:
                continue
            messages = list(t.messages)
            messages[mi] = shorter
            turns[ti] = Turn(messages, t.ids, t.tokens + message_tokens(counter, shorter) - message_tokens(counter, old))
            self.texts[ti][mi] = (whole, n)
            changed = True
        return changed

    def cut(self, excess: int) -> bool:
        """Cut the result at the cursor, or the next one that can be made shorter, by about ``excess``
        tokens; False when none is left. A result cut only partly (its head kept) stays under the
        cursor: a later call cuts it further, from its whole content, before the next is touched (the
        share's cut, then the budget's, may both fall on it)."""
        turns = self.p.turns
        counter = self.p.counter
        while self.turn < len(turns):
            t = turns[self.turn]
            while self.pos < len(t.messages):
                i = self.pos
                m = t.messages[i]
                if m.get("role") == "tool":
                    whole, gone = self.partial if self.partial is not None else (m, 0)
                    got = _cut_result(counter, whole, excess + gone)
                    if got is not None and got[1] < -gone:          # shorter than it is now
                        messages = list(t.messages)
                        messages[i] = got[0]
                        turns[self.turn] = Turn(messages, t.ids, t.tokens + got[1] + gone)
                        if self.partial is None:
                            self.cuts[self.turn] += 1
                        if got[0]["content"] == WINDOW_CUT_NOTE.format(n=len(whole["content"])):
                            self.pos, self.partial = i + 1, None    # down to its marker: done
                        else:
                            self.partial = (whole, -got[1])
                        return True
                self.pos = i + 1
                self.partial = None
            self.turn += 1
            self.pos = 0
        return False

    def drop_oldest(self) -> None:
        """The oldest turn goes whole (only once no result can be cut: the cursor is past the end)."""
        self.p.turns.pop(0)
        self.cuts.pop(0)
        self.texts.pop(0)
        self.turn = max(0, self.turn - 1)


def message_budget(budget: int, reserve: int) -> tuple[int, bool]:
    """The tokens the messages may use when every request also carries ``reserve`` tokens besides
    them (the tool schemas), and whether that hit the floor: never below ``MIN_PROMPT_BUDGET`` (nor
    above ``budget``), so schemas that leave less than that make the request larger than the window
    rather than leave no room for the new message."""
    room = budget - max(0, reserve)
    floor = min(budget, MIN_PROMPT_BUDGET)
    return (room, False) if room >= floor else (floor, True)


def assemble(parts: Parts, counter: TokenCounter, budget: int,
             stable: dict[tuple[str, str], int] | None = None, reserve: int = 0) -> BuiltContext:
    """The prompt for one turn, with its metadata: at most ``budget`` tokens (by ``counter``) less
    ``reserve``, the tokens each request carries besides the messages (``message_budget``).

    ``stable``: optional memo of message tokens kept across calls (see ``_Prompt``). With an
    ``additive`` counter the estimate is exact, so the whole prompt is not counted again.
    """
    budget, floored = message_budget(budget, reserve)
    parts = replace(parts, turns=[_answered(t, counter) for t in parts.turns])
    p = _Prompt(parts, counter, stable)
    cutter = _ResultCutter(p, budget)
    exact = bool(getattr(counter, "additive", False))
    dropped = recall_dropped = memory_dropped = 0
    flags = {"summary_trimmed": False, "message_truncated": False, "system_truncated": False}
    note_only = TRUNCATION_NOTE.strip()
    total = p.estimate()
    if total > budget and p.summary is not None and p.summary_text:    # the summary's share goes first
        beyond = min(total - budget, p.summary_tokens() - int(budget * SUMMARY_SHARE))
        if beyond > 0:                      # (cut by ``beyond``, the note included: down to its share at most)
            room = counter.count(p.summary_text) - beyond - counter.count(SUMMARY_TRIMMED_NOTE)
            p.summary_text = truncate_to_tokens(counter, p.summary_text, room) + SUMMARY_TRIMMED_NOTE \
                if room > 0 else ""
            flags["summary_trimmed"] = True
            total = p.estimate()
    if p.turns and total > budget:          # turns that cannot stay however their results and texts are cut
        dropped = cutter.drop_first(total, budget)
    cap = int(budget * WINDOW_RESULTS_SHARE)            # the window's results beyond their share go first
    held = _results_tokens(counter, p.turns)            # counted once; each cut's change is in Turn.tokens
    while held > cap:
        before = sum(t.tokens for t in p.turns)
        if not cutter.cut(held - cap):
            break
        held -= before - sum(t.tokens for t in p.turns)
    while True:
        total = p.estimate()
        if total <= budget:
            if not exact:
                total = counter.count_messages(p.messages())     # exact for non-additive counters
            if total <= budget:
                break
        excess = max(1, total - budget)
        if cutter.cut_texts(excess):                     # the middle of the oversize texts, before any result
            continue
        if cutter.cut(excess):                           # a window turn's tool result, before any turn
            continue
        if p.turns:
            cutter.drop_oldest()
            dropped += 1
        elif p.excerpts:
            p.excerpts.pop()
            recall_dropped += 1
        elif p.memory:
            p.memory.pop()
            memory_dropped += 1
        elif p.summary_text:
            p.summary_text = _shrink(counter, p.summary_text, excess, SUMMARY_TRIMMED_NOTE)
            flags["summary_trimmed"] = True
        elif p.new != note_only:
            p.new = _shrink(counter, p.new, excess, TRUNCATION_NOTE) or note_only
            flags["message_truncated"] = True
        elif p.system:
            p.system = _shrink(counter, p.system, excess, "")
            flags["system_truncated"] = True
        else:                                            # nothing left to give up
            break
    msgs = p.messages()
    meta = {
        "memory": "memory",
        "turns_kept": len(p.turns),
        "turns_dropped": dropped,
        "summary_used": p.summary.covers_to_id if p.summary is not None and p.summary_text else None,
        "recalled": [e.ids[0] for e in p.excerpts],
        "recall_dropped": recall_dropped,
        "memory_items": [e.ids[0] for e in p.memory],
        "memory_dropped": memory_dropped,
        "prompt_tokens_estimate": total,
        "budget_tokens": budget,                         # for the messages: the tool schemas are reserved
        "tool_schema_tokens": max(0, reserve),
        **flags,
        **parts.flags,
    }
    if any(cutter.cuts):                                 # kept turns whose tool results were cut
        meta["window_results_cut"] = {"count": sum(cutter.cuts), "turns": sum(1 for n in cutter.cuts if n)}
    if any(texts := cutter.text_cuts()):                 # kept turns whose user or assistant texts were cut
        meta["window_texts_cut"] = {"count": sum(texts), "turns": sum(1 for n in texts if n)}
    if floored:                                          # the schemas leave less than MIN_PROMPT_BUDGET
        meta["budget_floored"] = True
    return BuiltContext(messages=msgs, metadata=meta)
