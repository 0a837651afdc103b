"""Start-up on a non-loopback address: a WARNING when there is no TLS (tokens and conversations cross
the network in clear), and no UDP download port when users are configured (it serves only v2
clients, which have no token and are refused then)."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from protocol import MsgType
from testkit.server import V3Client, running_server

DATA = Path(__file__).parent / "data"
CERT, KEY = str(DATA / "test_cert.pem"), str(DATA / "test_key.pem")
CLEAR = "without TLS"


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "nplt.server" and r.levelno == logging.WARNING]


async def test_users_on_all_interfaces_without_tls_are_warned_about(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="nplt.server")
    async with running_server(tmp_path, host="0.0.0.0", users=[("alice", "token-a")]) as (srv, (_, port)):
        c = await V3Client.connect(("127.0.0.1", port), token="token-a")
        assert (await c.call(MsgType.PING))["re"]
        await c.close()
    assert warnings(caplog) == ["listening on 0.0.0.0 without TLS: tokens and conversations cross the network "
                                "in clear; set tls_cert and tls_key (or use an SSH tunnel)"]
    caplog.clear()
    async with running_server(tmp_path / "insecure", host="0.0.0.0", insecure=True):   # single user, --insecure
        pass
    assert warnings(caplog) == ["listening on 0.0.0.0 without TLS: conversations cross the network in clear; "
                                "set tls_cert and tls_key (or use an SSH tunnel)"]


@pytest.mark.parametrize("overrides", [{"host": "127.0.0.1", "users": [("alice", "token-a")]},
                                       {"host": "0.0.0.0", "users": [("alice", "token-a")],
                                        "tls_cert": CERT, "tls_key": KEY}],
                         ids=["loopback", "tls"])
async def test_no_warning_on_loopback_or_with_tls(tmp_path, caplog, overrides):
    caplog.set_level(logging.INFO, logger="nplt.server")
    async with running_server(tmp_path, **overrides):
        pass
    assert not [w for w in warnings(caplog) if CLEAR in w]


async def test_the_udp_port_is_opened_only_when_v2_clients_are_served(tmp_path):
    async with running_server(tmp_path / "a", users=[("alice", "token-a")]) as (srv, _):
        assert srv.services.udp.transport is None and srv.services.udp.port == 0   # v2 is refused: no UDP port
    async with running_server(tmp_path / "b") as (srv, _):                        # single user: v2 is served
        assert srv.services.udp.transport is not None and srv.services.udp.port > 0
