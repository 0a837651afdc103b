"""[transfer] settings: defaults, ranges, and the non-loopback rule for the UDP endpoint."""
from __future__ import annotations

import pytest

from server.config import ServerConfig, check_bind_policy
from server.config_base import ConfigError
from server.transfer_config import TransferConfig


def test_defaults_are_the_deployed_clients_values() -> None:
    cfg = ServerConfig.from_dict({}, env={})
    assert cfg.transfer == TransferConfig()
    t = cfg.transfer
    assert (t.udp_window, t.udp_retransmit_s, t.udp_give_up_s, t.udp_port) == (5, 0.1, 30.0, 0)
    assert (t.udp_first_ack_s, t.max_udp_transfers_per_client, t.max_udp_transfers) == (5.0, 2, 8)   # abuse limits
    assert cfg.knowledge.max_upload_bytes == 100 * 1024 * 1024     # the upload limit shared with v3


def test_bad_values_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="transfer.udp_port"):
        ServerConfig.from_dict({"transfer": {"udp_port": 70000}}, env={})
    with pytest.raises(ConfigError, match="transfer"):
        ServerConfig.from_dict({"transfer": {"udp_windw": 5}}, env={})
    with pytest.raises(ConfigError, match="knowledge"):
        ServerConfig.from_dict({"knowledge": {"max_upload_bytes": 0}}, env={})


def test_a_non_loopback_udp_address_needs_users_or_insecure() -> None:
    cfg = ServerConfig.from_dict({"transfer": {"udp_host": "0.0.0.0"}}, env={})
    with pytest.raises(ConfigError, match="transfer.udp_host"):
        check_bind_policy(cfg)
    check_bind_policy(ServerConfig.from_dict({"transfer": {"udp_host": "0.0.0.0"}, "server": {"insecure": True}},
                                             env={}))
    check_bind_policy(ServerConfig.from_dict({"transfer": {"udp_host": "127.0.0.1"}}, env={}))
