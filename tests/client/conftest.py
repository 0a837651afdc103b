"""Fixtures for client tests: a real in-process server on 127.0.0.1:0 and connected clients."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # for client_testlib

from client.connection import Backoff, Client  # noqa: E402
from testkit.echo_agent import EchoAgent  # noqa: E402
from client_testlib import v3_server  # noqa: E402


@pytest.fixture(autouse=True)
def client_config_isolated(isolated_client_config: None) -> None:
    """No user config file or NPLT_CLIENT_* variable of the machine leaks into the tests
    (``isolated_client_config``, tests/conftest.py)."""


@pytest.fixture
def echo() -> EchoAgent:
    return EchoAgent()


@pytest.fixture
async def server(tmp_path: Path, echo: EchoAgent) -> AsyncIterator[tuple[Any, tuple[str, int]]]:
    async with v3_server(tmp_path, agent=echo) as (srv, addr):
        yield srv, addr


@pytest.fixture
async def client(server: tuple[Any, tuple[str, int]]) -> AsyncIterator[Client]:
    _, (host, port) = server
    c = Client(host, port, backoff=Backoff(initial=0.05, maximum=0.2))
    await c.connect()
    if c.session_id is None:   # HELLO gives a user without sessions none: start one to work in
        await c.session_new()
    try:
        yield c
    finally:
        await c.close()
