"""RequestContext: what one request runs with: the services, and the port of the connection it came on.

The port (``server.v3_port.V3Port``, or a fake in tests) is the connection's hub subscriber: it holds
the user and the current session, and is what the hub publishes to. A handler never sees the
connection: ``async def handle(ctx: RequestContext, req) -> Reply`` (a typed ``protocol.replies`` object).
"""
from __future__ import annotations

from dataclasses import dataclass

from server.config import LimitsConfig
from server.hub import Subscriber
from server.services import Services


@dataclass(slots=True)
class RequestContext:
    services: Services
    port: Subscriber

    @property
    def user_id(self) -> str:
        user = self.port.user_id
        assert user is not None, "requests run only after HELLO"
        return user

    @property
    def session_id(self) -> str | None:
        """The connection's current session (set by HELLO, SESSION_NEW/SWITCH, or a delete moving it)."""
        return self.port.session_id

    @property
    def limits(self) -> LimitsConfig:
        return self.services.config.limits

    def attach(self, session_id: str) -> None:
        """Make ``session_id`` the connection's current session (its events follow)."""
        self.services.hub.attach(self.port, session_id)
