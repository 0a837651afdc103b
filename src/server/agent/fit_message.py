"""Fit a turn's assistant message into the store's ``max_message_bytes`` (issue 15, item 4).

A model may call a tool with megabytes of arguments, and a tool result or an answer may be long. The
store refuses a message whose JSON is over ``max_message_bytes`` (MESSAGE_TOO_LARGE), which lost the
whole turn. ``fit_assistant_message`` returns the message cut to fit instead, the way history pages
are cut to fit ``max_message_size`` (``server.fit``): the longest texts lose the most (one common
cap), each cut is marked in the text itself, and the metadata says ``"truncated": true``. The texts
are the answer, each call's result, and each call's arguments as JSON; cut arguments become
``{"truncated": true, "partial": "<the JSON text, cut and marked>"}``. Calls are dropped from the end (``"tool_calls_dropped": n``) only
when even empty texts cannot fit; the texts left are then fitted again from their full length (the
room of the dropped calls is theirs). Pure: the inputs are not changed.

Why a store failed is named by ``server.errors.failure_of`` (the store's own code).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import orjson

from storage.models import ChatMessage, ToolCall, now_iso

MARK = "\n[... cut to fit max_message_bytes: {n} more characters]"
SLACK = 64                 # bytes kept free: the real id and timestamp may be longer than the stand-ins
_ID_STAND_IN = 10 ** 12
_ROUNDS = 12


@dataclass(slots=True)
class FittedMessage:
    content: str
    tool_calls: list[ToolCall]
    metadata: dict[str, Any]
    cut: bool = False


def encoded_size(content: str, calls: list[ToolCall], metadata: dict[str, Any]) -> int:
    """Bytes of the message's JSON as the store encodes it (with a stand-in id and timestamp)."""
    msg = ChatMessage(id=_ID_STAND_IN, role="assistant", content=content, timestamp=now_iso(),
                      tool_calls=calls, metadata=metadata)
    return len(orjson.dumps(msg.to_dict()))


def _cap(weights: list[int], need: int) -> int:
    """The largest cap C with sum(max(0, w - C)) >= need."""
    ordered = sorted(weights, reverse=True)
    total = 0
    for k, w in enumerate(ordered, 1):
        total += w
        cap = (total - need) // k
        nxt = ordered[k] if k < len(ordered) else 0
        if cap >= nxt:
            return max(0, cap)
    return 0


def _bytes(text: str) -> int:
    return len(orjson.dumps(text)) - 2


class _Texts:
    """The cuttable texts of a message: [content, args JSON of each call..., result of each call...]."""

    def __init__(self, content: str, calls: list[ToolCall]) -> None:
        self.calls = calls
        self.full = [content] + [orjson.dumps(c.arguments).decode() for c in calls] + [c.result for c in calls]
        self.reset()

    def reset(self) -> None:
        """Every text whole again (before fitting with fewer calls)."""
        self.kept = [len(t) for t in self.full]

    def text(self, i: int) -> str:
        full, kept = self.full[i], self.kept[i]
        return full if kept >= len(full) else full[:kept] + MARK.format(n=len(full) - kept)

    def build(self, n_calls: int) -> tuple[str, list[ToolCall]]:
        n = len(self.calls)
        calls = []
        for j, call in enumerate(self.calls[:n_calls]):
            a, r = 1 + j, 1 + n + j
            args = call.arguments if self.kept[a] >= len(self.full[a]) else {"truncated": True,
                                                                             "partial": self.text(a)}
            calls.append(dataclasses.replace(call, arguments=args, result=self.text(r)))
        return self.text(0), calls


def _calls_that_fit(texts: _Texts, meta: dict[str, Any], budget: int) -> int:
    """How many calls (from the first) fit in ``budget`` with every text empty: all of them, or the
    most that do (``meta["tool_calls_dropped"]`` set), found by bisection (a model may send
    thousands of calls: dropping one at a time re-encoded the message thousands of times)."""
    n = len(texts.calls)

    def fits(k: int) -> bool:
        if k < n:
            meta["tool_calls_dropped"] = n - k
        else:
            meta.pop("tool_calls_dropped", None)
        texts.kept = [0] * len(texts.full)
        try:
            return encoded_size(*texts.build(k), meta) <= budget
        finally:
            texts.reset()

    if fits(n):
        return n
    lo, hi = 0, n - 1          # the answer is in lo..hi: the most calls whose empty form fits (0 if none)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    fits(lo)                   # leaves meta["tool_calls_dropped"] for lo
    return lo


def fit_assistant_message(content: str, calls: list[ToolCall], metadata: dict[str, Any],
                          limit: int) -> FittedMessage:
    """The message as given when its JSON fits in ``limit`` bytes, else cut to fit (see module doc)."""
    calls = list(calls)
    budget = limit - SLACK
    if encoded_size(content, calls, metadata) <= budget:
        return FittedMessage(content, calls, metadata)
    meta = {**metadata, "truncated": True}
    texts = _Texts(content, calls)
    n_calls = _calls_that_fit(texts, meta, budget)
    while True:
        for _ in range(_ROUNDS):
            new_content, new_calls = texts.build(n_calls)
            size = encoded_size(new_content, new_calls, meta)
            if size <= budget:
                return FittedMessage(new_content, new_calls, meta, cut=True)
            live = [0] + [1 + j for j in range(n_calls)] + [1 + len(calls) + j for j in range(n_calls)]
            weights = {i: _bytes(texts.full[i][:texts.kept[i]]) for i in live}
            if not any(weights.values()):
                break
            marks = (len(MARK) + 12) * len(live)
            cap = _cap(list(weights.values()), size - budget + marks)
            for i, w in weights.items():
                if w > cap:
                    texts.kept[i] = texts.kept[i] * cap // w
        if n_calls == 0:      # nothing left to cut: the metadata alone is over the limit
            return FittedMessage(*texts.build(0), meta, cut=True)
        n_calls -= 1
        meta["tool_calls_dropped"] = len(calls) - n_calls
        texts.reset()

