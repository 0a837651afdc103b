"""The link to PostgreSQL: the asyncpg pool, the retry policy for a restarting server, and the
mapping of driver errors to StorageErrors.

Retry policy: a call that cannot get a working connection (refused, reset, server starting or
shutting down) is retried ``pg_retry_attempts`` times, waiting ``pg_retry_backoff_ms`` doubled each
time (at most 5 s), then fails with StorageUnavailable. A write whose connection breaks after the
statement was sent is NOT retried (PostgreSQL may or may not have committed it): it fails with
StorageUnavailable and nothing is acknowledged. Reads are retried either way. The pool replaces
broken connections by itself, so the store recovers when PostgreSQL is back.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
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


class PgLink:
    """An asyncpg pool with the retry policy and error mapping of the module docstring."""

    def __init__(self, config: StorageConfig) -> None:
        self.config = config
        self.pool: asyncpg.Pool | None = None
        self.leases: Leases | None = None     # the pool's connections, kept between calls
        self.closed = False

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
            try:
                result = await work(con)
                clean = True
                return result
            except BaseException as exc:
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
            except (asyncio.TimeoutError, asyncpg.QueryCanceledError):
                raise StorageUnavailable(f"PostgreSQL did not answer within {timeout:g} s") from None
            except CONNECTION_ERRORS as err:
                _discard(con)
                exc = err
            finally:
                await self._put_back(con, clean)
        raise StorageUnavailable(f"PostgreSQL is unavailable ({_why(exc)})")

    async def run_holding(self, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> asyncpg.Connection:
        """Run ``work(connection)`` (idempotent: retried like a read) and keep the connection: the
        caller releases it with ``release``. For state tied to a connection (advisory locks)."""
        async def once() -> asyncpg.Connection:
            if self.closed or self.pool is None:
                raise StorageClosed("the history store is closed")
            try:
                con = await self._acquire()
            except CONNECTION_ERRORS as exc:
                raise Unsent() from exc
            try:
                await work(con)
                return con
            except BaseException as exc:
                if is_connection_error(exc):
                    _discard(con)
                await self._put_back(con, not is_connection_error(exc)
                                     and isinstance(exc, (asyncpg.PostgresError, ClientDataError)))
                if is_connection_error(exc):
                    raise Unsent() from exc
                raise
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
