"""HELLO (docs/protocol.md §5.1): version check, authentication, attaching to a session.

Run by the connection before any other request (it decides the user), with the same context. The
connection reads the body with ``parse_hello`` (not the generic request parser): a HELLO of another
protocol version is answered UNSUPPORTED_VERSION even when its other fields do not validate as v3.
"""
from __future__ import annotations

from typing import Any

from protocol import ErrorCode, ProtocolError
from protocol.messages import Hello
from protocol.replies import HelloReply
from server.context import RequestContext
from server.errors import HandlerError
from server.handlers.common import agent_info, running_turn

PROTO = 3
CAPABILITIES = ("sessions", "history", "search", "export", "chat", "cancel", "models", "stats",
                "events", "fragmentation", "reattach", "trash", "system_prompt", "regenerate", "edit",
                "lazy_session")


def parse_hello(body: Any) -> Hello:
    """The typed HELLO; HandlerError UNSUPPORTED_VERSION for another version (checked first), else
    INVALID_MESSAGE naming the field."""
    proto = body.get("proto") if isinstance(body, dict) else None
    if isinstance(proto, int) and not isinstance(proto, bool) and proto != PROTO:
        raise HandlerError(ErrorCode.UNSUPPORTED_VERSION,
                           f"protocol version {proto} is not supported (this server: {PROTO})")
    try:
        return Hello.from_body(body)
    except ProtocolError as exc:
        raise HandlerError(exc.code, exc.message) from None


def authenticate(svc: Any, token: Any) -> str:
    """The user owning the HELLO's ``token``; HandlerError AUTH_FAILED (fatal: the connection closes
    after this ERROR, and the failure counts against its address, ``server.auth.LoginGuard``)."""
    user = svc.auth.authenticate(token)
    if user is None:
        raise HandlerError(ErrorCode.AUTH_FAILED, "a token is required" if token is None else "invalid token")
    return user


async def handle_hello(ctx: RequestContext, req: Hello) -> HelloReply:
    svc = ctx.services
    user = authenticate(svc, req.token)
    svc.hub.add_user(ctx.port, user)
    rec, restored = None, False
    if req.session_id:
        try:
            rec = await svc.sessions.owned(user, req.session_id)
            restored = True
        except HandlerError as exc:
            if exc.code != ErrorCode.NOT_FOUND:
                raise
            rec = None   # gone or not the user's: the newest session instead (session_restored false)
    if rec is None:
        # a user without sessions gets none (``session: null``): the first message creates one
        rec = await svc.sessions.newest(user)
    info = running = None
    if rec is not None:
        ctx.attach(rec.session_id)
        info, running = svc.sessions.info(rec, summary=True), await running_turn(ctx, rec.session_id)
    # what this user may use beyond the fixed list: the knowledge base, long-term memory, admin requests
    caps = CAPABILITIES + tuple(c for c, on in (
        ("kb", svc.knowledge is not None), ("memory", getattr(svc.memory, "user_memory", None) is not None),
        ("admin", svc.auth.is_admin(user))) if on)
    return HelloReply(f"nplt-assistant/{svc.version}", PROTO, user, info, restored, running,
                      svc.config.limits.public(), caps, agent_info(ctx))
