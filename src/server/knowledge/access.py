"""Who may see and change which collection. A collection is ``user:<id>`` (personal) or
``group:<name>`` (shared by the group's members)."""
from __future__ import annotations

from typing import Collection

from protocol import ErrorCode
from server.errors import HandlerError

#: words a request may name instead of a collection: ``personal`` is the caller's own. A group may
#: not be named one of them, in any case (``server.config`` refuses it at start-up): a group called
#: "personal" could never be chosen, ``kb upload --group personal`` storing into ``user:<id>``
RESERVED_NAMES = frozenset({"personal"})


def personal(user: str) -> str:
    return f"user:{user}"


def readable(user: str, groups: Collection[str]) -> list[str]:
    """Every collection ``user`` may read: the personal one, then each group's."""
    return [personal(user)] + [f"group:{g}" for g in sorted(groups)]


def can_read(user: str, groups: Collection[str], collection: str) -> bool:
    """Whether ``collection`` is one of ``readable(user, groups)``, without building that list (a
    user in thousands of groups: one lookup, not a scan of every group's collection name)."""
    if collection == personal(user):
        return True
    return collection.startswith("group:") and collection[6:] in groups


def resolve(user: str, groups: Collection[str], collection: str | None) -> str:
    """The collection a request names (None = personal), or FORBIDDEN when the user is not in it."""
    if collection is None or collection in ("", "personal"):
        return personal(user)
    if can_read(user, groups, collection):
        return collection
    if not collection.startswith(("user:", "group:")) and collection in groups:
        return f"group:{collection}"            # a bare group name
    raise HandlerError(ErrorCode.FORBIDDEN, f"no access to collection {collection!r}")
