"""CLIENT_LIST and CLIENT_KILL (docs/protocol.md §5.9): the server's connections, for admins only.

Like redis CLIENT LIST / CLIENT KILL. An admin is a user marked ``admin = true`` in [auth] (in
single-user mode, ``local``); anyone else gets FORBIDDEN. A handler sees the connections only
through the small ``Client`` interface below. A killed v3 connection is sent ERROR CLIENT_KILLED
(fatal); a v2 one a last CHAT_TEXT. The connection the request came on is never killed.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Protocol

from protocol import ErrorCode
from protocol.messages import Address, ClientKill, ClientList, peer_forms
from protocol.objects import ClientInfo
from protocol.replies import ClientKillReply, ClientListReply
from server.context import RequestContext
from server.errors import HandlerError
from server.fit import fit_items
from server.wire import encode_reply

log = logging.getLogger("nplt.admin")


class Client(Protocol):
    """What an admin request may see and do of a connection (``server.connection.ServerConnection``)."""

    conn_id: int
    port: Any          # its V3Port: the requester is the connection whose port is ctx.port

    def info(self, me: bool) -> ClientInfo: ...
    def kill(self, by: str) -> None: ...


def _require_admin(ctx: RequestContext) -> None:
    if not ctx.services.auth.is_admin(ctx.user_id):
        raise HandlerError(ErrorCode.FORBIDDEN, "this request is for administrators ([auth] admin = true)")


def _clients(ctx: RequestContext) -> list[Client]:
    return sorted(ctx.services.connections, key=lambda c: c.conn_id)


async def client_list(ctx: RequestContext, req: ClientList) -> ClientListReply:
    """Every connection, oldest first; over ``max_message_size`` only the oldest that fit, marked
    ``truncated`` (docs/protocol.md §3, "Size"; CLIENT_KILL's filters still reach every connection)."""
    _require_admin(ctx)
    reply = ClientListReply(tuple(c.info(c.port is ctx.port) for c in _clients(ctx)))
    n = fit_items(encode_reply(req.id, reply), "clients", ctx.limits.max_message_size)
    return reply if n == len(reply.clients) else replace(reply, clients=reply.clients[:n], truncated=True)


def _address_of(peer: str) -> tuple[Address, int] | None:
    """A connection's own peer ("ip:port", an IPv6 address with or without brackets) as (address,
    port); None when it has no IP address (not connected yet: "?")."""
    return next(((ip, port) for ip, port in reversed(peer_forms(peer)) if port is not None), None)


def _peer_matches(info: ClientInfo, forms: tuple[tuple[Address, int | None], ...]) -> bool:
    """Whether the connection's peer is one ``peer_forms`` of the CLIENT_KILL ``peer`` names: the
    same address (compared as addresses: "::1", "[::1]" and "0:0::1" are one; an IPv4-mapped IPv6
    peer is its IPv4 address) and, when a port was given, the same port."""
    own = _address_of(info.peer)
    return own is not None and any(ip == own[0] and port in (None, own[1]) for ip, port in forms)


def _matches(info: ClientInfo, req: ClientKill, forms: tuple[tuple[Address, int | None], ...]) -> bool:
    if req.client_id is not None and info.id != req.client_id:
        return False
    if req.user is not None and info.user != req.user:
        return False
    if req.peer is not None and not _peer_matches(info, forms):
        return False
    return True


async def client_kill(ctx: RequestContext, req: ClientKill) -> ClientKillReply:
    """Close every other connection matching all the filters given (id, user, peer "ip:port",
    "[ipv6]:port" or "ip"; a peer of another form was refused INVALID_MESSAGE by ``ClientKill``)."""
    _require_admin(ctx)
    forms = peer_forms(req.peer) if req.peer is not None else ()     # (checked non-empty by ClientKill)
    hits = [c for c in _clients(ctx) if c.port is not ctx.port and _matches(c.info(False), req, forms)]
    if not hits:
        asked = ", ".join(f"{k} {v!r}" for k, v in (("client_id", req.client_id), ("user", req.user),
                                                    ("peer", req.peer)) if v is not None)
        raise HandlerError(ErrorCode.NOT_FOUND, f"no other connection matches {asked}")
    for c in hits:
        c.kill(ctx.user_id)
    killed = tuple(c.conn_id for c in hits)
    log.warning("user %s killed connection(s) %s", ctx.user_id, ", ".join(map(str, killed)))
    return ClientKillReply(killed)
