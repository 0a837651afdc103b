"""HELLO (docs/protocol.md §5.1): version check, authentication, attaching to a session."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from protocol import ProtocolError
from protocol.messages import Hello
from server.errors import HandlerError

if TYPE_CHECKING:  # pragma: no cover
    from server.connection import ServerConnection

PROTO = 3
CAPABILITIES = ["sessions", "history", "search", "export", "chat", "cancel", "models", "stats",
                "events", "fragmentation", "reattach"]


def agent_info(conn: ServerConnection) -> dict[str, Any]:
    agent = conn.server.agent
    return {"name": agent.name, "offline": bool(agent.offline), "model": agent.default_model}


async def handle_hello(conn: ServerConnection, body: dict[str, Any]) -> dict[str, Any]:
    proto = body.get("proto")
    if isinstance(proto, int) and not isinstance(proto, bool) and proto != PROTO:
        raise HandlerError("UNSUPPORTED_VERSION", f"protocol version {proto} is not supported (this server: {PROTO})")
    try:
        req = Hello.from_body(body)
    except ProtocolError as exc:
        raise HandlerError(exc.code, exc.message) from None
    srv = conn.server
    user = srv.auth.authenticate(req.token)
    if user is None:  # AUTH_FAILED is fatal: the connection closes after this ERROR
        raise HandlerError("AUTH_FAILED", "a token is required" if req.token is None else "invalid token")
    conn.user_id = user
    rec, restored, created = None, False, False
    if req.session_id:
        try:
            rec = await srv.sessions.owned(user, req.session_id)
            restored = True
        except HandlerError:
            rec = None
    if rec is None:
        rec, created = await srv.sessions.newest_or_new(user)
    srv.hub.add_user(conn, user)
    srv.hub.attach(conn, rec.session_id)
    if created:
        await srv.sessions.publish_event("created", rec)
    return {
        "server": f"nplt-assistant/{srv.version}", "proto": PROTO, "user": user,
        "session": srv.sessions.info(rec, summary=True), "session_restored": restored,
        "running_turn": srv.runner.running_state(rec.session_id),
        "limits": srv.config.limits.public(), "capabilities": CAPABILITIES, "agent": agent_info(conn),
    }
