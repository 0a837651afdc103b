"""The link to PostgreSQL: the asyncpg pool, the retry policy for a restarting server, and the
mapping of driver errors to StorageErrors.

Retry policy: a call that cannot get a working connection (refused, reset, server starting or
shutting down) is retried ``pg_retry_attempts`` times, waiting ``pg_retry_backoff_ms`` doubled each
time (at most 5 s), then fails with StorageUnavailable. A write whose connection breaks after the
statement was sent is NOT retried (PostgreSQL may or may not have committed it): it fails with
StorageUnavailable and nothing is acknowledged. Reads are retried either way. The pool replaces
broken connections by itself, so the store recovers when PostgreSQL is back.

Client-side bound: ``statement_timeout`` is enforced by PostgreSQL itself, so a server that stops
answering (frozen, overloaded past the point of scheduling the backend, or behind a network black
hole) would leave a call waiting forever. Every call of ``run`` (and ``run_holding``, unless it
waits for a lock by design) is therefore given ``pg_statement_timeout_ms`` + ``STATEMENT_TIMEOUT_MARGIN_S``
(``PgLink.call_timeout``; no bound when ``pg_statement_timeout_ms`` is 0), in all for a call of short
statements; a call of several long ones (a document's rows) starts it again before each with
``progress()``. Past it the call's connection is terminated (never returned to the pool: a statement
pending on it, or a transaction's ROLLBACK, fails at once) and the call fails with StorageUnavailable,
not retried (a write then was not acknowledged; PostgreSQL may still commit it when it comes back, as
for any connection lost after a statement was sent).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar

import asyncpg
from asyncpg.exceptions._base import DataError as ClientDataError
from asyncpg.exceptions._base import InternalClientError

from ..config import StorageConfig
from ..errors import InvalidArgument, StorageClosed, StorageError
from .errors import StorageUnavailable
from .leases import Leases
from .schema import migrate

log = logging.getLogger("storage")
T = TypeVar("T")
MAX_BACKOFF_S = 5.0
#: Added to ``pg_statement_timeout_ms`` for the client-side bound of one call (``PgLink.call_timeout``):
#: room for PostgreSQL's own statement timeout to arrive as an error first, when the server answers.
STATEMENT_TIMEOUT_MARGIN_S = 5.0

#: Errors meaning "no usable connection": worth a retry when nothing was sent yet.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError, asyncio.TimeoutError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError, asyncpg.AdminShutdownError, asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError, InternalClientError,    # (a connection broken under a call)
)


def is_connection_error(exc: BaseException) -> bool:
    """True for "no usable connection" (a bad query argument is an InterfaceError too, but not this)."""
    return isinstance(exc, CONNECTION_ERRORS) and not isinstance(exc, ClientDataError)


class PooledConnection(asyncpg.Connection):
    """A pooled connection released without asyncpg's reset query (``pg_advisory_unlock_all(); CLOSE
    ALL; UNLISTEN *; RESET ALL``): one round trip saved per call. Nothing here leaves session state
    on a pooled connection (LISTEN and the long-held locks use connections of their own, and
    ``locks.session_lock`` undoes its lock and setting itself); an open transaction is still rolled
    back on release by asyncpg."""

    def get_reset_query(self) -> str:
        return ""


class Unsent(Exception):
    """Wraps a connection error raised before any statement of the call was sent."""


def call_timeout(config: StorageConfig) -> float | None:
    """The client-side bound of one call: ``pg_statement_timeout_ms`` + ``STATEMENT_TIMEOUT_MARGIN_S``
    (None, no bound, when ``pg_statement_timeout_ms`` is 0)."""
    ms = config.pg_statement_timeout_ms
    return ms / 1000 + STATEMENT_TIMEOUT_MARGIN_S if ms else None


class Deadline:
    """Terminates ``con`` if the call on it has not ended ``seconds`` after it started (None: never),
    or after the last ``restart``: PostgreSQL does not answer, and its own statement_timeout cannot
    say so. The pending statement then fails with a connection error at once, as does any later one
    of the call (a transaction's ROLLBACK too); ``expired`` tells the caller why. ``cancel`` when the
    call ends."""

    __slots__ = ("con", "seconds", "expired", "_handle")

    def __init__(self, con: asyncpg.Connection, seconds: float | None) -> None:
        self.con = con
        self.seconds = seconds
        self.expired = False
        self._handle: asyncio.TimerHandle | None = None
        self.restart()

    def restart(self) -> None:
        if self.seconds is not None and not self.expired:
            if self._handle is not None:
                self._handle.cancel()
            self._handle = asyncio.get_running_loop().call_later(self.seconds, self._expire)

    def _expire(self) -> None:
        self.expired = True
        _discard(self.con)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()


_current: ContextVar[Deadline | None] = ContextVar("nplt_pg_call_deadline", default=None)


def progress() -> None:
    """In a ``PgLink.run`` work of several statements that may each take long (a document's rows, a
    migrated session's messages): the call's client-side bound starts again, for the next statement."""
    deadline = _current.get()
    if deadline is not None:
        deadline.restart()


class PgLink:
    """An asyncpg pool with the retry policy and error mapping of the module docstring."""

    def __init__(self, config: StorageConfig) -> None:
        self.config = config
        self.pool: asyncpg.Pool | None = None
        self.leases: Leases | None = None     # the pool's connections, kept between calls
        self.closed = False
        self.call_timeout = call_timeout(config)   # the client-side bound of a call (module docstring)

    def no_answer(self, *, write: bool) -> StorageUnavailable:
        """The error of a call that hit ``call_timeout`` (its connection was terminated)."""
        cfg = self.config
        return StorageUnavailable(
            f"PostgreSQL did not answer within {self.call_timeout:g} s (pg_statement_timeout_ms "
            f"{cfg.pg_statement_timeout_ms} ms + {STATEMENT_TIMEOUT_MARGIN_S:g} s); the connection was dropped"
            + ("; the write was not acknowledged, retry later" if write else ""))

    def connect_args(self) -> dict[str, Any]:
        cfg = self.config
        return {"dsn": cfg.url, "timeout": cfg.pg_connect_timeout_s,
                "server_settings": {"statement_timeout": str(cfg.pg_statement_timeout_ms),
                                    "application_name": "nplt-server"}}

    async def open(self) -> None:
        """Connect (with the retry policy), apply pending migrations, then open the pool."""
        async def migrate_once() -> None:
            con = await asyncpg.connect(**self.connect_args())
            try:
                await migrate(con)
            finally:
                await con.close()
        await self.retrying(migrate_once, "apply the schema migrations")
        cfg = self.config

        async def make_pool() -> asyncpg.Pool:
            return await asyncpg.create_pool(min_size=0, max_size=cfg.pg_pool_size, connection_class=PooledConnection,
                                             max_inactive_connection_lifetime=60.0, **self.connect_args())
        self.pool = await self.retrying(make_pool, "open the connection pool")
        self.leases = Leases(self.pool, cfg.pg_pool_size)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.leases is not None:
            await self.leases.close()
        if self.pool is not None:
            try:
                await asyncio.wait_for(self.pool.close(), self.config.pg_connect_timeout_s)
            except (asyncio.TimeoutError, *CONNECTION_ERRORS):
                self.pool.terminate()

    async def _acquire(self) -> asyncpg.Connection:
        """A connection of the pool (``Leases``), within ``pg_connect_timeout_s`` (raises TimeoutError)."""
        assert self.leases is not None
        return await self.leases.take(self.config.pg_connect_timeout_s)

    async def _put_back(self, con: asyncpg.Connection, clean: bool) -> None:
        assert self.leases is not None
        await self.leases.put_back(con, clean)

    async def run(self, work: Callable[[asyncpg.Connection], Awaitable[T]], *, write: bool) -> T:
        """``work(connection)`` with a pooled connection, under the retry policy."""
        async def once() -> T:
            if self.closed or self.pool is None:
                raise StorageClosed("the history store is closed")
            try:
                con = await self._acquire()
            except CONNECTION_ERRORS as exc:
                raise Unsent() from exc
            clean = False
            deadline = Deadline(con, self.call_timeout)
            token = _current.set(deadline)
            try:
                result = await work(con)
                clean = True
                return result
            except BaseException as exc:
                if deadline.expired and not isinstance(exc, asyncio.CancelledError):
                    raise self.no_answer(write=write) from None     # (not retried: it was sent)
                if not is_connection_error(exc):
                    # PostgreSQL's own error, or a value the driver refused before sending: the
                    # connection is fine (a cancelled call's is not: it goes back to the pool)
                    clean = isinstance(exc, (asyncpg.PostgresError, ClientDataError))
                    raise
                _discard(con)
                if write:
                    raise StorageUnavailable(f"PostgreSQL connection lost during a write ({_why(exc)}); "
                                             "it was not acknowledged, retry later") from None
                raise Unsent() from exc
            finally:
                deadline.cancel()
                _current.reset(token)
                await self._put_back(con, clean)
        return await self.retrying(once, "reach PostgreSQL")

    async def ping(self) -> None:
        """One ``SELECT 1`` through the pool, without the retry policy (a readiness probe must answer
        now): raises StorageUnavailable when PostgreSQL cannot be reached or does not answer within
        ``pg_statement_timeout_ms`` (``pg_connect_timeout_s`` when that is 0). A pooled connection
        found broken (PostgreSQL restarted since) is discarded and the query tried once more."""
        if self.closed or self.pool is None:
            raise StorageClosed("the history store is closed")
        cfg = self.config
        timeout = cfg.pg_statement_timeout_ms / 1000 or cfg.pg_connect_timeout_s
        exc: BaseException | None = None
        for _ in range(2):
            try:
                con = await self._acquire()
            except (asyncio.TimeoutError, *CONNECTION_ERRORS) as err:
                raise StorageUnavailable(f"PostgreSQL is unavailable ({_why(err)})") from None
            clean = False
            try:
                await con.fetchval("SELECT 1", timeout=timeout)
                clean = True
                return
            except asyncio.TimeoutError:
                _discard(con)      # (asyncpg's cancel request would wait for the server too)
                raise StorageUnavailable(f"PostgreSQL did not answer within {timeout:g} s") from None
            except asyncpg.QueryCanceledError:
                raise StorageUnavailable(f"PostgreSQL did not answer within {timeout:g} s") from None
            except CONNECTION_ERRORS as err:
                _discard(con)
                exc = err
            finally:
                await self._put_back(con, clean)
        raise StorageUnavailable(f"PostgreSQL is unavailable ({_why(exc)})")

    async def run_holding(self, work: Callable[[asyncpg.Connection], Awaitable[T]], *,
                          bounded: bool = True) -> asyncpg.Connection:
        """Run ``work(connection)`` (idempotent: retried like a read) and keep the connection: the
        caller releases it with ``release``. For state tied to a connection (advisory locks).
        ``bounded``: within ``call_timeout`` (False for a work that waits for a lock by design)."""
        async def once() -> asyncpg.Connection:
            if self.closed or self.pool is None:
                raise StorageClosed("the history store is closed")
            try:
                con = await self._acquire()
            except CONNECTION_ERRORS as exc:
                raise Unsent() from exc
            deadline = Deadline(con, self.call_timeout if bounded else None)
            try:
                await work(con)
                return con
            except BaseException as exc:
                if deadline.expired and not isinstance(exc, asyncio.CancelledError):
                    await self._put_back(con, False)
                    raise self.no_answer(write=False) from None
                if is_connection_error(exc):
                    _discard(con)
                await self._put_back(con, not is_connection_error(exc)
                                     and isinstance(exc, (asyncpg.PostgresError, ClientDataError)))
                if is_connection_error(exc):
                    raise Unsent() from exc
                raise
            finally:
                deadline.cancel()
        return await self.retrying(once, "reach PostgreSQL")

    async def release(self, con: asyncpg.Connection) -> None:
        """Give back a connection of ``run_holding`` (the caller undid what it set on it)."""
        if self.leases is not None:
            await self._put_back(con, True)

    async def retrying(self, fn: Callable[[], Awaitable[T]], what: str) -> T:
        cfg = self.config
        delay = cfg.pg_retry_backoff_ms / 1000
        for attempt in range(cfg.pg_retry_attempts + 1):
            try:
                return await fn()
            except Unsent as wrapped:
                exc: BaseException = wrapped.__cause__ or wrapped
            except ClientDataError as bad:
                raise InvalidArgument(f"value refused by the PostgreSQL driver: {bad}") from None
            except CONNECTION_ERRORS as raw:
                exc = raw
            except asyncpg.QueryCanceledError:
                raise StorageUnavailable(f"PostgreSQL did not answer within pg_statement_timeout_ms "
                                         f"({cfg.pg_statement_timeout_ms} ms)") from None
            except (asyncpg.DataError, asyncpg.UntranslatableCharacterError) as bad:
                raise InvalidArgument(f"PostgreSQL refused a value: {bad}") from None
            except asyncpg.PostgresError as other:
                log.error("storage: PostgreSQL error: %r", other)
                raise StorageError(f"PostgreSQL error: {other}") from None
            if self.closed:
                raise StorageClosed("the history store is closed")
            if attempt < cfg.pg_retry_attempts:
                log.warning("storage: cannot %s (%s), retry %d/%d in %.2f s", what, _why(exc), attempt + 1,
                            cfg.pg_retry_attempts, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
        raise StorageUnavailable(f"PostgreSQL is unavailable: cannot {what} ({_why(exc)})")


def _discard(con: asyncpg.Connection) -> None:
    """Close a broken connection so the pool never hands it out again."""
    try:
        con.terminate()
    except CONNECTION_ERRORS as exc:   # already released to the pool or closed: nothing left to close
        log.debug("storage: broken connection already closed (%s)", _why(exc))


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
