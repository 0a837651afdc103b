"""The hub: which connections are attached to which session, and which belong to which user.

Turn events go to every connection attached to the turn's session (``"re"`` set only on the connection
that sent the chat request); SESSION_EVENT and NOTICE go to every v3 connection of the user. Each
distinct payload is JSON-encoded once, then framed per connection (the frame header carries the
connection's own sequence number).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Iterable

import orjson

from server.fit import SLACK, cut_strings

if TYPE_CHECKING:  # pragma: no cover
    from server.connection import ServerConnection

log = logging.getLogger("nplt.hub")


def _encode(body: dict[str, Any], limit: int) -> bytes:
    """JSON of a turn event; one over ``limit`` is sent with its longest texts cut (server.fit)."""
    payload = orjson.dumps(body)
    if len(payload) > limit:
        payload = orjson.dumps(cut_strings(body, limit - SLACK))
    return payload


class Hub:
    """Connection registry per session and per user, with encode-once fan-out."""

    def __init__(self) -> None:
        self._by_session: dict[str, set[ServerConnection]] = {}
        self._by_user: dict[str, set[ServerConnection]] = {}

    # -- registry -------------------------------------------------------------------------------
    def add_user(self, conn: ServerConnection, user_id: str) -> None:
        self._by_user.setdefault(user_id, set()).add(conn)

    def attach(self, conn: ServerConnection, session_id: str) -> None:
        """Attach ``conn`` to ``session_id`` (detaching it from its previous session)."""
        old = conn.session_id
        if old is not None and old != session_id:
            self._discard(self._by_session, old, conn)
        conn.session_id = session_id
        self._by_session.setdefault(session_id, set()).add(conn)

    def remove(self, conn: ServerConnection) -> None:
        """Forget ``conn`` entirely (it closed)."""
        if conn.session_id is not None:
            self._discard(self._by_session, conn.session_id, conn)
        if conn.user_id is not None:
            self._discard(self._by_user, conn.user_id, conn)

    @staticmethod
    def _discard(table: dict[str, set], key: str, conn: Any) -> None:
        conns = table.get(key)
        if conns is not None:
            conns.discard(conn)
            if not conns:
                del table[key]

    def session_connections(self, session_id: str) -> set[ServerConnection]:
        return self._by_session.get(session_id, set())

    def user_connections(self, user_id: str) -> set[ServerConnection]:
        return self._by_user.get(user_id, set())

    def attached_sessions(self) -> int:
        return len(self._by_session)

    # -- fan-out --------------------------------------------------------------------------------
    def publish_turn(self, session_id: str, msg_type: int, body: dict[str, Any],
                     origin: ServerConnection | None = None, re: Any = None) -> None:
        """Send a turn event to the session's connections; ``body`` must not contain ``re``."""
        conns = self._by_session.get(session_id)
        if origin is not None and not origin.closing and (conns is None or origin not in conns):
            # the sender switched away (or chatted into another session): it still sees its turn
            conns = {origin, *conns} if conns else {origin}
        if not conns:
            return
        shared: bytes | None = None
        for conn in tuple(conns):
            if conn.legacy is not None:
                try:
                    conn.legacy.on_turn_event(msg_type, body, conn is origin)
                except Exception:   # one broken connection must not stop the turn or the others
                    log.exception("v2 connection %s failed on a turn event; closing it", conn.conn_id)
                    conn.close()
                continue
            if conn is origin and re is not None:
                conn.send_payload(msg_type, _encode({"re": re, **body}, conn.limits.max_message_size))
            else:
                if shared is None:
                    shared = _encode({"re": None, **body}, conn.limits.max_message_size)
                conn.send_payload(msg_type, shared)

    def publish_user(self, user_id: str, msg_type: int, body: dict[str, Any]) -> None:
        """Send an event (``re`` null) to every v3 connection of ``user_id``."""
        self._publish(self._by_user.get(user_id, ()), msg_type, body)

    def publish_session_v3(self, session_id: str, msg_type: int, body: dict[str, Any]) -> None:
        """Send an event (``re`` null) to the v3 connections attached to ``session_id``."""
        self._publish(self._by_session.get(session_id, ()), msg_type, body)

    @staticmethod
    def _publish(conns: Iterable[ServerConnection], msg_type: int, body: dict[str, Any]) -> None:
        shared: bytes | None = None
        for conn in tuple(conns):
            if conn.legacy is not None:
                continue
            if shared is None:
                shared = orjson.dumps({"re": None, **body})
            conn.send_payload(msg_type, shared)
