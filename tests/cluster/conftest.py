"""Several server nodes on one embedded PostgreSQL database (the test session's server)."""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pg.dbs import database, fresh_database
from pg.pgserver import shared_server, stop_shared
from server.app import Server
from testkit.echo_agent import EchoAgent
from testkit.server import V3Client, make_config


@pytest.fixture(scope="session")
def pg_server():
    try:
        yield shared_server()
    finally:
        stop_shared()


@pytest.fixture
async def pg_url(pg_server):
    async for url in database(pg_server):      # dropped after the test
        yield url


@pytest.fixture
def restartable(restartable_server):
    """The session's restartable PostgreSQL (tests/conftest.py), for tests that stop or kill it."""
    return restartable_server


@pytest.fixture
async def url(restartable) -> str:
    """A fresh database on the restartable PostgreSQL."""
    restartable.start()                  # (running already, unless a test stopped half-way)
    return await fresh_database(restartable)


@contextlib.asynccontextmanager
async def node(tmp_path: Path, url: str, name: str, agent: EchoAgent | None = None,
               sections: dict | None = None, memory: str | None = "basic", storage: dict | None = None,
               **overrides) -> AsyncIterator[Server]:
    """One in-process server node on loopback, storing in ``url`` (``sections``: more config;
    ``storage``: more [storage] settings; ``memory=None``: the real memory layer; ``overrides``:
    ``make_config``'s, e.g. ``users``)."""
    cfg = make_config(tmp_path / name, storage={"url": url, "pg_retry_backoff_ms": 10, **(storage or {})},
                      sections=sections, **overrides)
    srv = Server(cfg, agent=agent or EchoAgent(), memory=memory)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


@contextlib.asynccontextmanager
async def clients_of_one_session(first: Server, second: Server) -> AsyncIterator[tuple[V3Client, V3Client, str]]:
    """A client of node ``first`` (in its new session), a client of node ``second`` attached to that
    session, and the session id; both clients closed at the end."""
    one = await V3Client.connect((first.host, first.port))
    try:
        other = await V3Client.connect((second.host, second.port), session_id=one.session_id)
        try:
            yield one, other, one.session_id
        finally:
            await other.close()
    finally:
        await one.close()


@pytest.fixture
async def two_nodes(tmp_path, pg_url):
    async with node(tmp_path, pg_url, "a") as a, node(tmp_path, pg_url, "b") as b:
        yield a, b
