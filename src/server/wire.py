"""The edge where the server's typed replies and events become JSON, and storage records become the
protocol's objects.

Handlers return a typed reply (``protocol.replies``) and the turn pipeline publishes typed events
(``protocol.server_events``), both without ``re``; only ``encode_reply`` and ``encode_event`` turn
them into what goes on the wire, with the request id of the connection they go to. The ``*_obj``
functions convert ``storage.models`` records into the ``protocol.objects`` a reply or event carries.
"""
from __future__ import annotations

from typing import Any

import orjson

from protocol.objects import ChatMessage as MessageObj
from protocol.objects import SearchHit as SearchHitObj
from protocol.objects import Summary
from protocol.objects import ToolCall as ToolCallObj
from protocol.replies import Reply
from protocol.server_events import ServerEvent
from server.fit import SLACK, cut_strings
from storage.models import ChatMessage, SearchHit, SummaryRecord, ToolCall


def encode_event(event: ServerEvent, re: Any, limit: int) -> bytes:
    """The JSON payload of an event; one over ``limit`` is sent with its longest texts cut (server.fit)."""
    body = event.encode()
    if re is not None:
        body["re"] = re
    payload = orjson.dumps(body)
    if len(payload) > limit:
        payload = orjson.dumps(cut_strings(body, limit - SLACK))
    return payload


def encode_reply(re: Any, reply: Reply) -> dict[str, Any]:
    """The RESPONSE (or PONG, ERROR) body answering request ``re`` (framed and fragmented by the codec)."""
    body = reply.encode()
    body["re"] = re
    return body


def call_obj(call: ToolCall, *, running: bool = False) -> ToolCallObj:
    """A tool call as sent; ``running``: as announced by TOOL_CALL (no result yet)."""
    if running:
        return ToolCallObj(call.id, call.tool_name, call.arguments, "", "running", 0, call.timestamp, call.step)
    return ToolCallObj(call.id, call.tool_name, call.arguments, call.result, call.status, call.duration,
                       call.timestamp, call.step)


def message_obj(m: ChatMessage) -> MessageObj:
    return MessageObj(m.id, m.role, m.content, m.timestamp, tuple(call_obj(c) for c in m.tool_calls), m.metadata)


def summary_obj(s: SummaryRecord) -> Summary:
    return Summary(s.text, s.covers_to_id, s.created_at, s.model, s.covers_from_id)


def hit_obj(h: SearchHit) -> SearchHitObj:
    return SearchHitObj(h.session_id, h.title, h.message_id, h.role, h.snippet, h.timestamp, h.score)
