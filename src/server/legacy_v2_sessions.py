"""v2 session, clear and model requests, each answered with ONE ``CHAT_TEXT`` (docs/protocol.md §7).

Every request that uses the connection's current session first checks that it still exists
(``LegacyV2.current``): a session deleted meanwhile (e.g. by a v3 client) moves the connection to
the user's newest session, or a new one, and the reply says so instead of acting on the wrong one.
"""
from __future__ import annotations

from typing import Any, Protocol

import orjson

from protocol import Message
from server.agent.titles import TITLE_CHARS
from server.auth import LOCAL_USER
from server.services import Services
from storage.models import SessionRecord

ECHO_CHARS = 64           # client input quoted back in a reply (an unknown model name) is cut to this


class V2Adapter(Protocol):
    """What these handlers use of ``server.legacy_v2.LegacyV2`` (the adapter is also a hub subscriber)."""

    services: Services
    session_id: str | None
    max_reply_bytes: int

    def reply(self, text: str) -> None: ...
    async def current(self) -> tuple[SessionRecord, str]: ...


def _ref(ev: Message, key: str) -> str:
    """``{"<key>": value}`` JSON, a JSON string, or the bare text of the request's payload."""
    payload: Any = ev.body
    text = payload.decode("utf-8", errors="replace").strip()
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    if isinstance(value, dict):
        value = value.get(key, "")
    if isinstance(value, str):
        return value.strip()
    # a number names a session prefix or a model as its text; null, true, a list or an object names nothing
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else ""


def clip(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters, marked with "…"."""
    return text if len(text) <= n else text[:n] + "…"


def _line(rec: SessionRecord, current: str | None) -> str:
    mark = "*" if rec.session_id == current else " "
    title = clip(" ".join((rec.title or "(untitled)").split()), TITLE_CHARS)
    return (f"{mark} {rec.session_id} | {title} | {rec.message_count} messages | "
            f"updated {rec.updated_at[:19].replace('T', ' ')}")


def session_list_text(recs: list[SessionRecord], current: str | None, note: str, max_bytes: int) -> str:
    """The session list (newest first), cut to ``max_bytes`` of UTF-8 with a line saying what was left out."""
    head = ([note] if note else []) + [f"Sessions ({len(recs)}):"]
    lines = [_line(r, current) for r in recs]
    text = "\n".join(head + lines)
    if len(text.encode()) <= max_bytes:
        return text
    used = sum(len(s.encode()) + 1 for s in head) + 400  # 400: room for the footer line
    shown = 0
    for line in lines:
        used += len(line.encode()) + 1
        if used > max_bytes:
            break
        shown += 1
    left = len(lines) - shown
    footer = (f"... and {left} older sessions not listed (the list must fit one frame). Switch to one "
              f"with SESSION_SWITCH and its id or an unambiguous prefix, delete old ones with "
              f"SESSION_DELETE, or page through all of them with an NPLT v3 client.")
    if current is not None and all(r.session_id != current for r in recs[:shown]):
        footer += f" Current session: {current}."
    return "\n".join(head + lines[:shown] + [footer])


async def session_list(v2: V2Adapter, ev: Message) -> None:
    _, note = await v2.current()
    recs = await v2.services.sessions.list_all(LOCAL_USER)
    v2.reply(session_list_text(recs, v2.session_id, note, v2.max_reply_bytes))


async def session_new(v2: V2Adapter, ev: Message) -> None:
    svc = v2.services
    rec = await svc.sessions.create(LOCAL_USER)
    svc.hub.attach(v2, rec.session_id)
    await svc.sessions.publish_event("created", rec)
    v2.reply(f"New session: {rec.session_id}")


async def session_switch(v2: V2Adapter, ev: Message) -> None:
    svc = v2.services
    rec = await svc.sessions.resolve(LOCAL_USER, clip(_ref(ev, "session_id"), ECHO_CHARS))
    svc.hub.attach(v2, rec.session_id)
    v2.reply(f"Switched to session {rec.session_id}: {clip(rec.title or '(untitled)', TITLE_CHARS)} "
             f"({rec.message_count} messages)")


async def session_delete(v2: V2Adapter, ev: Message) -> None:
    svc = v2.services
    rec = await svc.sessions.resolve(LOCAL_USER, clip(_ref(ev, "session_id"), ECHO_CHARS))
    was_current = v2.session_id == rec.session_id
    await svc.sessions.delete(LOCAL_USER, rec.session_id, requester=v2)
    text = f"Deleted session {rec.session_id}."
    cur, note = await v2.current()
    if was_current:
        text += f" Current session: {cur.session_id}"
    elif note:
        text += " " + note
    v2.reply(text)


async def clear(v2: V2Adapter, ev: Message) -> None:
    rec, note = await v2.current()
    if note:
        v2.reply(f"{note} Nothing was cleared.")
        return
    _, n = await v2.services.sessions.clear(rec)
    v2.reply(f"Cleared {n} messages from session {rec.session_id}.")


async def model_switch(v2: V2Adapter, ev: Message) -> None:
    svc = v2.services
    name = _ref(ev, "model")
    offered = svc.agent.models()
    if not name:
        v2.reply(f"MODEL_SWITCH needs a model name (JSON {{\"model\": \"<name>\"}} or the bare name). "
                 f"Available: {', '.join(offered)}")
        return
    if name not in offered:
        v2.reply(f"Unknown model {clip(name, ECHO_CHARS)!r}. Available: {', '.join(offered)}")
        return
    rec, note = await v2.current()
    if note:
        v2.reply(f"{note} The model was not switched; send the request again to switch it there.")
        return
    rec = await svc.store.set_model(rec.session_id, name)
    await svc.sessions.publish_event("model", rec)
    v2.reply(f"Model switched to {name} for session {rec.session_id}.")
