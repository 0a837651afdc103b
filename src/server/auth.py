"""Token authentication: users are configured as (user_id, sha256 of token); tokens never stored or logged."""
from __future__ import annotations

import hashlib
from typing import Any

from protocol.messages import MAX_TOKEN_CHARS
from server.config import AuthConfig

LOCAL_USER = "local"


def hash_token(token: str) -> str:
    """The hex sha256 of a token, as written in ``[auth] users``."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class Authenticator:
    """Maps a HELLO token to a user id; with no users configured everyone is ``local``."""

    def __init__(self, config: AuthConfig) -> None:
        # by the sha256 of the token: a lookup leaks nothing an attacker can use (finding a token
        # whose digest shares a prefix with a configured one is a preimage search), so no scan of
        # every user in constant time is needed (tokens are unique per user: AuthConfig checks it)
        self._users = {bytes.fromhex(u.token_sha256): u.user_id for u in config.users}
        self._groups = {u.user_id: u.groups for u in config.users}
        self._admins = frozenset(u.user_id for u in config.users if u.admin)

    def groups_of(self, user_id: str) -> tuple[str, ...]:
        """The user's groups (config ``[auth] users``: ``groups``); none in single-user mode."""
        return self._groups.get(user_id, ())

    @property
    def enabled(self) -> bool:
        return bool(self._users)

    def is_admin(self, user_id: str | None) -> bool:
        """Whether ``user_id`` may administer the server (CLIENT_LIST, CLIENT_KILL): a user marked
        ``admin = true`` in [auth]; in single-user mode, ``local``."""
        if not self._users:
            return user_id == LOCAL_USER
        return user_id in self._admins

    def authenticate(self, token: Any) -> str | None:
        """The user owning ``token`` (the HELLO's value as sent), or None: looked up by its sha256.

        With no users configured everyone is ``local`` and the token is ignored, whatever it is. Otherwise
        a missing, empty, non-string or over-long (> MAX_TOKEN_CHARS) token matches nobody.
        """
        if not self._users:
            return LOCAL_USER
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
            return None
        return self._users.get(hashlib.sha256(token.encode("utf-8")).digest())
