"""The edge where replies and events become JSON: one function per kind of outgoing message.

Handlers return reply bodies and the turn pipeline publishes event bodies as plain dicts of
docs/protocol.md §5-6 (without ``re``); only these two functions turn them into what goes on the
wire. When typed replies and events arrive in ``protocol``, they change here and nowhere else.
"""
from __future__ import annotations

from typing import Any

import orjson

from server.fit import SLACK, cut_strings


def encode_event(body: dict[str, Any], re: Any, limit: int) -> bytes:
    """The JSON payload of an event; one over ``limit`` is sent with its longest texts cut (server.fit)."""
    full = {"re": re, **body}
    payload = orjson.dumps(full)
    if len(payload) > limit:
        payload = orjson.dumps(cut_strings(full, limit - SLACK))
    return payload


def encode_reply(re: Any, body: dict[str, Any]) -> dict[str, Any]:
    """The RESPONSE body answering request ``re`` (framed and fragmented by the codec)."""
    return {"re": re, **body}
