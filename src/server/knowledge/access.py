"""Who may see and change which collection. A collection is ``user:<id>`` (personal) or
``group:<name>`` (shared by the group's members)."""
from __future__ import annotations

from typing import Collection

from protocol import ErrorCode
from server.errors import HandlerError


def personal(user: str) -> str:
    return f"user:{user}"


def readable(user: str, groups: Collection[str]) -> list[str]:
    """Every collection ``user`` may read: the personal one, then each group's."""
    return [personal(user)] + [f"group:{g}" for g in sorted(groups)]


def resolve(user: str, groups: Collection[str], collection: str | None) -> str:
    """The collection a request names (None = personal), or FORBIDDEN when the user is not in it."""
    if collection is None or collection in ("", "personal"):
        return personal(user)
    if collection in readable(user, groups):
        return collection
    if not collection.startswith(("user:", "group:")) and collection in groups:
        return f"group:{collection}"            # a bare group name
    raise HandlerError(ErrorCode.FORBIDDEN, f"no access to collection {collection!r}")
