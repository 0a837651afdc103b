"""Keep what the server sends within ``max_message_size`` (docs/protocol.md §3, "Size").

A reply or event whose JSON would be over the limit is not dropped: history pages hold fewer
(older messages are left for the next page), list replies hold fewer items (``fit_items``: the
handler pages the rest, or marks the reply ``truncated``), and otherwise the longest text fields
(``content``, ``result``, ``text``, ``snippet``) are cut, each cut marked in the text itself, and the
body gets ``"truncated": true``. The stored messages are never changed. Exports are not cut (their
whole point is the full text): an export over the limit is refused with ``MESSAGE_TOO_LARGE``.
"""
from __future__ import annotations

import copy
from typing import Any

import orjson

CUTTABLE = frozenset({"content", "result", "text", "snippet"})
MARK = "\n[... cut by the server to fit max_message_size: {n} more characters]"
SLACK = 256                    # bytes kept free for the "re" id and the marks' digits


def _leaves(node: Any, out: list[tuple[Any, Any]]) -> None:
    """Every (container, key) of a str under a CUTTABLE key, in dicts and lists below ``node``."""
    if isinstance(node, dict):
        for k, v in node.items():
            if type(v) is str:
                if k in CUTTABLE:
                    out.append((node, k))
            elif isinstance(v, (dict, list)):
                _leaves(v, out)
    elif isinstance(node, list):
        for v in node:
            if isinstance(v, (dict, list)):
                _leaves(v, out)


def _cap(lengths: list[int], need: int) -> int:
    """The largest cap C with sum(max(0, L - C)) >= need (``lengths`` sorted, longest first)."""
    total = 0
    for k, length in enumerate(lengths, 1):
        total += length
        cap = (total - need) // k
        nxt = lengths[k] if k < len(lengths) else 0
        if cap >= nxt:
            return max(0, cap)
    return 0


def cut_strings(body: dict[str, Any], limit: int) -> dict[str, Any]:
    """``body`` if its JSON fits in ``limit`` bytes, else a copy with the longest texts cut to fit.

    The texts are cut to one common length (the longest lose the most, short ones are kept) and
    the copy carries ``"truncated": true``. If even empty texts do not fit, the copy is returned as
    cut as it gets (the caller's send then fails with MESSAGE_TOO_LARGE as before).
    """
    size = len(orjson.dumps(body))
    if size <= limit:
        return body
    body = copy.deepcopy(body)
    body["truncated"] = True
    found: list[tuple[Any, Any]] = []
    _leaves(body, found)
    leaves = [(c, k, c[k]) for c, k in found]      # (container, key, the whole text)
    kept = [len(full) for _, _, full in leaves]     # characters of each text still shown
    for _ in range(8):      # texts of uneven density (ASCII, CJK, escapes) may need a few rounds
        weight = [len(orjson.dumps(full[:n])) - 2 for (_, _, full), n in zip(leaves, kept)]  # bytes
        if not any(weight):
            break
        cap = _cap(sorted(weight, reverse=True), size + 1 - limit + (len(MARK) + 16) * len(kept))
        for i, (c, k, full) in enumerate(leaves):
            if weight[i] > cap:
                kept[i] = kept[i] * cap // weight[i]
                c[k] = full[:kept[i]] + MARK.format(n=len(full) - kept[i])
        size = len(orjson.dumps(body))
        if size <= limit:
            break
    return body


def fit_page(messages: list[dict[str, Any]], limit: int) -> int:
    """How many of the newest ``messages`` (ascending ids) fit in ``limit`` bytes of JSON (at least 1)."""
    total, n = 0, 0
    for m in reversed(messages):
        total += len(orjson.dumps(m)) + 1
        if total > limit and n:
            break
        n += 1
    return n


def fit_items(body: dict[str, Any], key: str, limit: int) -> int:
    """How many of the first items of the list ``body[key]`` fit in a body of at most ``limit`` bytes
    (``body`` as encoded, "re" included; room is kept for the marks): all of them when the body fits,
    else as many as fit, at least one (a single item too large is then cut by ``shrink_reply``)."""
    items = body[key]
    limit -= SLACK
    if len(orjson.dumps(body)) <= limit:
        return len(items)
    room = limit - len(orjson.dumps({**body, key: []}))
    total, n = 0, 0
    for item in items:
        total += len(orjson.dumps(item)) + 1
        if total > room and n:
            break
        n += 1
    return n


def shrink_reply(body: dict[str, Any], limit: int, *, page: bool) -> dict[str, Any]:
    """A RESPONSE body (without "re") that was over the limit, made to fit.

    ``page``: a HISTORY_REQUEST reply: the oldest messages are left for the next page first (at
    least one message stays, so paging always moves on), then texts are cut.
    """
    limit -= SLACK
    if page and body.get("messages"):
        msgs = body["messages"]
        n = fit_page(msgs, limit - len(orjson.dumps({**body, "messages": []})))
        if n < len(msgs):
            kept = msgs[-n:]
            body = {**body, "messages": kept, "has_more": True, "next_before": kept[0]["id"]}
    return cut_strings(body, limit)


def fit_last_items(body: dict[str, Any], key: str, limit: int) -> int:
    """As ``fit_items``, counted from the end of the list ``body[key]``: how many of its last items fit
    (for a list in ascending order whose newest items are the ones to keep)."""
    return fit_items({**body, key: body[key][::-1]}, key, limit)
