"""Token authentication: users are configured as (user_id, sha256 of token); tokens never stored or logged.

``LoginGuard`` throttles failed logins per remote address and logs what clients do before they log in
(failed logins, connections closed before their HELLO) without flooding the log.
"""
from __future__ import annotations

import hashlib
import ipaddress
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from protocol.messages import MAX_TOKEN_CHARS
from server.config import AuthConfig
from server.refusals import ThrottledLog

LOCAL_USER = "local"

def hash_token(token: str) -> str:
    """The hex sha256 of a token, as written in ``[auth] users``."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_problem(token: str) -> str | None:
    """Why ``token`` could never log in (HELLO refuses it whatever the configuration), or None."""
    if not token:
        return "the token is empty"
    if len(token) > MAX_TOKEN_CHARS:
        return f"the token has {len(token)} characters; HELLO accepts at most {MAX_TOKEN_CHARS}"
    return None


def address_key(ip: str) -> str:
    """What failed logins are counted by: an IPv4 address, or the /64 network of an IPv6 address
    (one host usually holds a whole /64, so counting single IPv6 addresses would count nothing)."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return ip          # ("?" for a peer without an address, e.g. a UNIX socket)
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


@dataclass(slots=True)
class _Failures:
    since: float              # the start of the current window
    count: int = 0            # failed logins in it
    blocked_until: float = 0.0


class LoginGuard:
    """Failed logins (AUTH_FAILED) per remote address (``address_key``), and the log lines of clients
    that have not logged in.

    A HELLO's token is always checked first: a right token logs in, whatever this guard says, so
    nobody sharing an address (a NAT, an SSH tunnel's 127.0.0.1) can lock a user or the operator out.
    After ``max_failed_logins`` failed logins from one address within ``failed_login_window_s``,
    that address is in back-off for ``login_backoff_s`` (``retry_after``), and each of its HELLOs
    meanwhile, right or wrong (a faster right answer would let a guesser hang up early and know), is
    answered only after ``delay_s`` (a tarpit, the connection holding its slot: with ``max_clients_per_ip`` connections an address has at most that
    many guesses in flight, ``max_clients_per_ip / delay_s`` a second instead of thousands). Failures
    in back-off count too, so guessing on keeps the back-off going; it ends by itself otherwise (no
    successful login is needed); other addresses are not affected. At most ``max_login_addresses``
    addresses are remembered: the one whose last failure is oldest is forgotten first. Without users
    (single-user mode) no login fails and nothing is counted.

    Failed logins are logged at warning level, other connections closed before their HELLO
    (HANDSHAKE_TIMEOUT, UNSUPPORTED_VERSION, ...) at info level, each kind as ``server.refusals``
    logs refused connections: the first at once, then at most one line per interval counting the rest.
    """

    def __init__(self, config: AuthConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = config.max_failed_logins if config.users else 0
        self.window_s = config.failed_login_window_s
        self.backoff_s = config.login_backoff_s
        self.delay_s = config.failed_login_delay_s    # a failed login in back-off waits this long
        self.capacity = config.max_login_addresses
        self._clock = clock
        self._table: OrderedDict[str, _Failures] = OrderedDict()   # least recently failed first
        self.failed_log = ThrottledLog(
            clock=clock, level=logging.WARNING, first="connection %(id)s from %(peer)s: failed login: %(reason)s",
            summary="%(n)d failed logins in the last %(s).0f s; latest: connection %(id)s from %(peer)s: %(reason)s")
        self.closed_log = ThrottledLog(
            clock=clock, level=logging.INFO, first="connection %(id)s (%(peer)s): %(reason)s",
            summary="%(n)d connections closed before their HELLO in the last %(s).0f s; "
                    "latest: connection %(id)s (%(peer)s): %(reason)s")

    @property
    def addresses(self) -> int:
        """Addresses remembered (for tests and tools)."""
        return len(self._table)

    def failures(self, ip: str) -> int:
        """Failed logins counted for ``ip`` in its current window (for tests and tools)."""
        entry = self._table.get(address_key(ip))
        return entry.count if entry is not None else 0

    def retry_after(self, ip: str) -> float:
        """Seconds the back-off of ``ip`` lasts still (0: not in back-off): meanwhile its failed logins
        are answered after ``delay_s``."""
        if not self.limit or not self._table:
            return 0.0
        entry = self._table.get(address_key(ip))
        if entry is None:
            return 0.0
        return max(0.0, entry.blocked_until - self._clock())

    def failed(self, ip: str) -> str:
        """Count a failed login from ``ip``; what to tell the client (and the log) when it starts a
        back-off, else ""."""
        if not self.limit:
            return ""
        now, key = self._clock(), address_key(ip)
        table = self._table
        entry = table.pop(key, None)
        if entry is None or now - entry.since >= self.window_s:
            entry = _Failures(now, 0, entry.blocked_until if entry is not None else 0.0)
        entry.count += 1
        note = ""
        if entry.count >= self.limit:
            entry.blocked_until = now + self.backoff_s
            entry.since, entry.count = entry.blocked_until, 0    # counting starts again after the back-off
            note = (f"; {self.limit} failed logins from this address within {self.window_s:g} s: "
                    f"for {self.backoff_s:g} s its failed logins are answered after {self.delay_s:g} s")
        table[key] = entry
        while table:   # forget what is over (the least recently failed come first), then keep within capacity
            oldest = next(iter(table.values()))
            if len(table) <= self.capacity and (now - oldest.since < self.window_s or oldest.blocked_until > now):
                break
            table.popitem(last=False)
        return note

    def log_closed(self, conn_id: int | str, peer: str, reason: str, *, login: bool = False) -> None:
        """Log a connection closed before its HELLO was accepted (``login``: a failed login)."""
        (self.failed_log if login else self.closed_log).note(conn_id, peer, reason)


class Authenticator:
    """Maps a HELLO token to a user id; with no users configured everyone is ``local``."""

    def __init__(self, config: AuthConfig) -> None:
        # by the sha256 of the token: a lookup leaks nothing an attacker can use (finding a token
        # whose digest shares a prefix with a configured one is a preimage search), so no scan of
        # every user in constant time is needed (tokens are unique per user: AuthConfig checks it)
        self._users = {bytes.fromhex(u.token_sha256): u.user_id for u in config.users}
        self._groups = {u.user_id: u.groups for u in config.users}
        self._admins = frozenset(u.user_id for u in config.users if u.admin)
        self.guard = LoginGuard(config)

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
        a missing, non-string, empty or over-long (> MAX_TOKEN_CHARS, ``token_problem``) token matches nobody.
        """
        if not self._users:
            return LOCAL_USER
        if not isinstance(token, str) or token_problem(token) is not None:
            return None
        return self._users.get(hashlib.sha256(token.encode("utf-8")).digest())
