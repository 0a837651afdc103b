"""The hub: which subscribers are attached to which session, and which belong to which user.

A subscriber is anything with the ``Subscriber`` shape: the v3 connection's port
(``server.v3_port``) and the v2 adapter (``server.legacy_v2``) alike; the hub does not know which
it is talking to. Turn events go to every subscriber attached to the turn's session, ``mine`` set
only for the one that sent the chat request (its events carry the request's ``re``); SESSION_EVENT
and NOTICE go to ``event`` (a v2 subscriber ignores them). Events are typed
(``protocol.server_events``); one is encoded at most once for all subscribers (``Outgoing.shared``;
the sender's copy, with its ``re``, apart), then framed per connection. With PostgreSQL storage the
cluster component sets ``relay``: every event published here also goes to the other nodes, and theirs
come back with ``remote=True`` (delivered here only). On the JSON backend ``relay`` stays None.
"""
from __future__ import annotations

from typing import Any, Iterable, Protocol

from protocol.server_events import ServerEvent
from server.wire import encode_event


class Outgoing:
    """One typed event being published (``event``, its ``re`` unset), encoded once on first use."""

    __slots__ = ("event", "type", "_shared")

    def __init__(self, event: ServerEvent) -> None:
        self.event = event
        self.type = type(event).TYPE
        self._shared: bytes | None = None

    def shared(self, limit: int) -> bytes:
        """The payload with ``"re": null`` (cut to ``limit`` if needed), encoded once."""
        if self._shared is None:
            self._shared = encode_event(self.event, None, limit)
        return self._shared


class Subscriber(Protocol):
    """What the hub delivers to: one per connection."""

    user_id: str | None
    session_id: str | None
    needs_session: bool     # True: never left without a session (a v2 client: its commands assume one)

    @property
    def closed(self) -> bool: ...
    def turn_event(self, out: Outgoing, mine: bool, re: Any) -> None: ...
    def event(self, out: Outgoing) -> None: ...
    def session_moved(self, deleted_id: str, new_id: str) -> None: ...
    def hold_events(self) -> None: ...   # events wait until the connection's next reply has gone out


class Relay(Protocol):
    """Where a node's events also go when it runs in a cluster (``server.cluster_relay``)."""

    def turn(self, session_id: str, event: ServerEvent) -> None: ...
    def user(self, user_id: str, event: ServerEvent) -> None: ...
    def session(self, session_id: str, event: ServerEvent) -> None: ...


class Hub:
    """Subscriber registry per session and per user, with encode-once fan-out."""

    def __init__(self) -> None:
        self._by_session: dict[str, set[Subscriber]] = {}
        self._by_user: dict[str, set[Subscriber]] = {}
        self.relay: Relay | None = None   # set by the cluster component (PostgreSQL storage only)

    # -- registry -------------------------------------------------------------------------------
    def add_user(self, sub: Subscriber, user_id: str) -> None:
        sub.user_id = user_id
        self._by_user.setdefault(user_id, set()).add(sub)

    def attach(self, sub: Subscriber, session_id: str) -> None:
        """Attach ``sub`` to ``session_id`` (detaching it from its previous session)."""
        old = sub.session_id
        if old is not None and old != session_id:
            self._discard(self._by_session, old, sub)
        sub.session_id = session_id
        self._by_session.setdefault(session_id, set()).add(sub)

    def detach(self, sub: Subscriber) -> None:
        """Leave ``sub`` attached to no session (its session was deleted and none is left)."""
        if sub.session_id is not None:
            self._discard(self._by_session, sub.session_id, sub)
        sub.session_id = None

    def remove(self, sub: Subscriber) -> None:
        """Forget ``sub`` entirely (its connection closed)."""
        if sub.session_id is not None:
            self._discard(self._by_session, sub.session_id, sub)
        if sub.user_id is not None:
            self._discard(self._by_user, sub.user_id, sub)

    @staticmethod
    def _discard(table: dict[str, set], key: str, sub: Subscriber) -> None:
        subs = table.get(key)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del table[key]

    def session_subscribers(self, session_id: str) -> set[Subscriber]:
        return self._by_session.get(session_id, set())

    def user_subscribers(self, user_id: str) -> set[Subscriber]:
        return self._by_user.get(user_id, set())

    def attached_sessions(self) -> int:
        return len(self._by_session)

    # -- fan-out --------------------------------------------------------------------------------
    def publish_turn(self, session_id: str, event: ServerEvent, origin: Subscriber | None = None,
                     re: Any = None, remote: bool = False) -> None:
        """A turn event to the session's subscribers, and to ``origin`` (the sender) wherever it is;
        also to the relay (other nodes) unless it came from another node (``remote``)."""
        if self.relay is not None and not remote:
            self.relay.turn(session_id, event)
        subs = self._by_session.get(session_id)
        if origin is not None and (subs is None or origin not in subs) and not origin.closed:
            # the sender switched away (or chatted into another session): it still sees its turn
            subs = {origin, *subs} if subs else {origin}
        if not subs:
            return
        out = Outgoing(event)
        for sub in tuple(subs):
            sub.turn_event(out, sub is origin, re)

    def publish_user(self, user_id: str, event: ServerEvent, remote: bool = False) -> None:
        """An event (``re`` null) to every subscriber of ``user_id``."""
        if self.relay is not None and not remote:
            self.relay.user(user_id, event)
        self._publish(self._by_user.get(user_id, ()), event)

    def publish_session(self, session_id: str, event: ServerEvent, remote: bool = False) -> None:
        """An event (``re`` null) to the subscribers attached to ``session_id``."""
        if self.relay is not None and not remote:
            self.relay.session(session_id, event)
        self._publish(self._by_session.get(session_id, ()), event)

    @staticmethod
    def _publish(subs: Iterable[Subscriber], event: ServerEvent) -> None:
        out = Outgoing(event)
        for sub in tuple(subs):
            sub.event(out)
