"""v2 HISTORY_REQUEST: the request's fields and the one-frame JSON document (docs/protocol.md §7).

The reply is always ONE ``CHAT_TEXT`` of at most 65535 bytes of UTF-8: a history document, or an
error document ``{"error": {"code", "message"}}``. A page too large for one frame leaves its oldest
messages for the next page; a single message too large on its own is cut by encoded size, in this
order, until it fits: metadata entries of 1 KB or more (largest first), tool call results (largest
first), whole tool calls (largest first), the other metadata entries, and last the content. Cut
texts end with ``…``, the message's metadata gets ``"truncated": true`` (and ``"tool_calls_omitted":
n`` when calls were left out); no character is ever split. The stored messages are never changed.
"""
from __future__ import annotations

from typing import Any

import orjson

from protocol import ErrorCode

MAX_FRAME_TEXT = 65535
DEFAULT_LIMIT = 50
MARK = "…"
BIG_METADATA = 1024   # metadata entries at least this large (JSON bytes) go before tool call results
_dumps = orjson.dumps


class HistoryRequestError(Exception):
    """A HISTORY_REQUEST that cannot be served; answered with an error document."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message


def _show(value: Any) -> str:
    """A client value for an error message, never long."""
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"


def parse_history_request(payload: bytes, max_page_size: int) -> tuple[int | None, int]:
    """(before, limit) from an empty payload or JSON ``{"before"?, "limit"?}``.

    ``before`` must be a positive integer (a message id); ``limit`` a positive integer, larger
    values are clamped to ``max_page_size``. Anything else raises HistoryRequestError.
    """
    before: Any = None
    limit: Any = DEFAULT_LIMIT
    if payload.strip():
        try:
            req = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise HistoryRequestError(ErrorCode.INVALID_MESSAGE, f"HISTORY_REQUEST: invalid JSON ({exc})") from None
        if not isinstance(req, dict):
            raise HistoryRequestError(ErrorCode.INVALID_MESSAGE, "HISTORY_REQUEST: expected a JSON object")
        before = req.get("before")
        limit = req.get("limit")
        if limit is None:
            limit = DEFAULT_LIMIT
    for name, v, what in (("before", before, "a message id"), ("limit", limit, "a number of messages")):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise HistoryRequestError(ErrorCode.INVALID_MESSAGE, f"HISTORY_REQUEST: field '{name}': expected "
                                      f"a positive integer ({what}), got {_show(v)}")
    return before, min(limit, max_page_size)


def error_document(code: ErrorCode, message: str, **extra: Any) -> str:
    """The v2 history error reply ``{"error": {"code", "message", ...}}``, fitting one frame."""
    doc = {"error": {"code": code, "message": message[:4000], **extra}}
    return _dumps(doc).decode()


def _message_dict(m: Any) -> dict[str, Any]:
    return {"id": m.id, "role": m.role, "content": m.content, "timestamp": m.timestamp,
            "tool_calls": [c.to_dict() for c in m.tool_calls], "metadata": dict(m.metadata)}


def history_document(session_id: str, page: Any, limit: int = MAX_FRAME_TEXT) -> str:
    """The v2 history JSON text of ``page``, made to fit ``limit`` bytes (see the module docstring)."""
    msgs = [_message_dict(m) for m in page.messages]
    has_more = page.has_more

    def doc(kept: list[dict[str, Any]], more: bool) -> dict[str, Any]:
        return {"session_id": session_id, "message_count": page.total, "messages": kept,
                "has_more": more, "next_before": kept[0]["id"] if kept else page.next_before}

    if msgs:  # the newest messages that fit; their sizes are measured once, newest first
        room = limit - len(_dumps(doc([], True))) - 24  # 24: the next_before digits, "false"
        n, used = 0, 0
        for m in reversed(msgs):
            used += len(_dumps(m)) + 1
            if used > room and n:
                break
            n += 1
        while True:
            kept = msgs[len(msgs) - n:]
            more = has_more or n < len(msgs)
            text = _dumps(doc(kept, more))
            if len(text) <= limit:
                return text.decode()
            if n == 1:
                break
            n -= 1
        body = doc(kept, more)
        _fit_message(body, kept[0], limit)
        return _dumps(body).decode()
    return _dumps(doc([], has_more)).decode()


def _fit_message(body: dict[str, Any], m: dict[str, Any], limit: int) -> None:
    """Cut the one message ``m`` of ``body`` (in place) until ``body`` fits ``limit`` bytes."""
    meta = m["metadata"] = {**m["metadata"], "truncated": True}
    calls = m["tool_calls"]

    def size() -> int:
        return len(_dumps(body))

    def drop_metadata(min_bytes: int) -> None:
        keep = ("truncated", "tool_calls_omitted")
        entries = sorted(((len(_dumps(v)), k) for k, v in meta.items() if k not in keep), reverse=True)
        for n, key in entries:
            if n < min_bytes or size() <= limit:
                return
            del meta[key]

    drop_metadata(BIG_METADATA)
    for call in sorted(calls, key=lambda c: len(_dumps(c.get("result", ""))), reverse=True):
        if size() <= limit:
            return
        if isinstance(call.get("result"), str) and call["result"]:
            _cut_string(call, "result", size, limit)
    dropped = 0
    while calls and size() > limit:  # whole calls, the largest first
        calls.remove(max(calls, key=lambda c: len(_dumps(c))))
        dropped += 1
        meta["tool_calls_omitted"] = dropped
    drop_metadata(0)
    if size() > limit and m["content"]:
        _cut_string(m, "content", size, limit)


def _cut_string(container: dict[str, Any], key: str, size: Any, limit: int) -> None:
    """Set ``container[key]`` to the longest prefix of its text (plus MARK) that lets the document fit
    ``limit`` bytes (just MARK if none does). Measured on the encoded JSON: multi-byte characters and
    escapes count as what they cost."""
    full: str = container[key]
    container[key] = ""
    room = limit - size() + 2  # bytes the JSON string (quotes included) may take
    lo, hi = 0, len(full)       # the longest prefix length that fits is in [lo, hi]
    if len(_dumps(full[:lo] + MARK)) > room:
        container[key] = MARK
        return
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(_dumps(full[:mid] + MARK)) <= room:
            lo = mid
        else:
            hi = mid - 1
    container[key] = full[:lo] + MARK
