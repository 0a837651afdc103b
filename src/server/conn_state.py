"""The states of a connection and the transitions between them, in one table.

    GRACE ──first byte HELLO──▶ HANDSHAKING ──HELLO accepted──▶ READY
      │ other first byte, or legacy_grace_ms of silence
      ▼
    LEGACY                       (every live state) ──close()──▶ CLOSING ──connection_lost──▶ CLOSED
      └─over max_clients, or the server is stopping──▶ REFUSED (SERVER_FULL for v3, then closed)

A transport can also be lost in any live state (CLOSED at once). Anything else is a bug and raises.
"""
from __future__ import annotations

from enum import Enum


class ConnState(Enum):
    GRACE = "grace"               # nothing received yet: v3 or v2 is not decided
    HANDSHAKING = "handshaking"   # a v3 client (first byte HELLO) whose HELLO is not accepted yet
    READY = "ready"               # v3, HELLO accepted: requests are served
    LEGACY = "legacy"             # a v2 client (server.legacy_v2)
    REFUSED = "refused"           # accepted by the kernel only to be told no
    CLOSING = "closing"           # close() called: nothing more is read or queued
    CLOSED = "closed"             # the transport is gone


GRACE, HANDSHAKING, READY, LEGACY, REFUSED, CLOSING, CLOSED = ConnState

TRANSITIONS: dict[ConnState, frozenset[ConnState]] = {
    GRACE: frozenset({HANDSHAKING, LEGACY, REFUSED, CLOSING, CLOSED}),
    HANDSHAKING: frozenset({READY, CLOSING, CLOSED}),
    READY: frozenset({CLOSING, CLOSED}),
    LEGACY: frozenset({CLOSING, CLOSED}),
    REFUSED: frozenset({CLOSING, CLOSED}),
    CLOSING: frozenset({CLOSED}),
    CLOSED: frozenset(),
}


class BadTransition(RuntimeError):
    pass


def check(old: ConnState, new: ConnState) -> ConnState:
    """``new`` if the table allows ``old -> new``, else BadTransition."""
    if new not in TRANSITIONS[old]:
        raise BadTransition(f"connection state {old.value} -> {new.value} is not allowed")
    return new
