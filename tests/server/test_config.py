"""Configuration: precedence (flags > env > file > defaults), precise errors, bind policy, entry point."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from protocol import MsgType
from server.auth import hash_token
from server.config import ServerConfig, check_bind_policy, is_loopback
from server.config_base import ConfigError
from server.logs import setup_logging
from server.main import main
from testkit.server import V3Client

TOML = """
[server]
host = "127.0.0.1"
port = 7001
log_format = "json"

[limits]
max_clients = 10
idle_timeout_s = 30

[storage]
root = "/tmp/from-file"
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "nplt.toml"
    p.write_text(text)
    return p


def test_defaults():
    cfg = ServerConfig.load([], env={})
    assert (cfg.server.host, cfg.server.port, cfg.server.legacy_grace_ms) == ("127.0.0.1", 9999, 300)
    lim = cfg.limits
    assert (lim.max_clients, lim.max_message_size, lim.max_pending_requests, lim.max_page_size) == (256, 8 << 20, 32, 200)
    assert (lim.max_queued_turns, lim.idle_timeout_s, lim.ping_interval_s, lim.handshake_timeout_s) == (8, 300, 60, 10)
    assert (lim.max_output_buffer, lim.max_text_chars) == (4 << 20, 32000)
    assert cfg.auth.users == [] and cfg.single_user
    assert cfg.storage.root == "storage/history"


def test_precedence_flags_over_env_over_file(tmp_path):
    path = write(tmp_path, TOML)
    cfg = ServerConfig.load([], env={}, path=path)
    assert cfg.server.port == 7001 and cfg.server.log_format == "json" and cfg.limits.max_clients == 10
    assert cfg.limits.idle_timeout_s == 30.0 and cfg.storage.root == "/tmp/from-file"
    env = {"NPLT_PORT": "7002", "NPLT_DATA_DIR": "/tmp/from-env", "NPLT_MAX_CLIENTS": "20",
           "NPLT_INSECURE": "yes", "NPLT_CONFIG": str(path)}
    cfg = ServerConfig.load([], env=env)  # NPLT_CONFIG names the file
    assert (cfg.server.port, cfg.storage.root, cfg.limits.max_clients) == (7002, "/tmp/from-env", 20)
    assert cfg.server.insecure is True and cfg.server.log_format == "json"
    cfg = ServerConfig.load(["--port", "7003", "--data-dir", "/tmp/from-flag", "--max-clients", "30",
                             "--log-format", "text", "--legacy-grace-ms", "50"], env=env)
    assert (cfg.server.port, cfg.storage.root, cfg.limits.max_clients) == (7003, "/tmp/from-flag", 30)
    assert cfg.server.log_format == "text" and cfg.server.legacy_grace_ms == 50


def test_llm_env_is_handled_by_the_agent_config():
    cfg = ServerConfig.load([], env={"NPLT_LLM_API_KEY": "sk-test", "NPLT_LLM_PROVIDER": "deepseek"})
    assert cfg.llm.api_key == "sk-test" and cfg.llm.provider == "deepseek"
    assert "sk-test" not in repr(cfg)


@pytest.mark.parametrize("text, where", [
    ("[server]\nport = 'x'\n", "server.port: expected an integer"),
    ("[server]\nport = 70000\n", "server.port: expected a value in 0..65535"),
    ("[server]\nlog_format = 'xml'\n", "server.log_format: expected one of text, json"),
    ("[server]\nprot = 1\n", "server.prot: unknown key"),
    ("[limits]\nmax_clients = 0\n", "limits.max_clients"),
    ("[limits]\nidle_timeout_s = true\n", "limits.idle_timeout_s: expected a number"),
    ("[server]\ntls_cert = 'c.pem'\n", "tls_cert and tls_key must be given together"),
    ("[auth]\nusers = [{user_id = 'a', token_sha256 = 'abc'}]\n", "auth.users[0].token_sha256: expected 64 hex"),
    ("[auth]\nusers = [{user_id = 'a b', token_sha256 = '" + "0" * 64 + "'}]\n", "auth.users[0].user_id"),
    ("[storage]\ndurability = 'never'\n", "storage.durability"),
    ("[nonsense]\nx = 1\n", "nonsense: unknown section"),
    ("[server\n", "invalid TOML"),
])
def test_config_errors_are_precise(tmp_path, text, where):
    with pytest.raises(ConfigError) as err:
        ServerConfig.load([], env={}, path=write(tmp_path, text))
    assert where in str(err.value)


def test_env_errors_name_the_variable():
    with pytest.raises(ConfigError) as err:
        ServerConfig.load([], env={"NPLT_PORT": "abc"})
    assert str(err.value) == "NPLT_PORT: expected an integer, got 'abc'"
    with pytest.raises(ConfigError) as err:
        ServerConfig.load([], env={"NPLT_INSECURE": "maybe"})
    assert "NPLT_INSECURE" in str(err.value)
    with pytest.raises(ConfigError) as err:
        ServerConfig.load([], env={}, path="/nonexistent/nplt.toml")
    assert "config file not found" in str(err.value)


def test_non_loopback_needs_users_or_insecure():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")
    with pytest.raises(ConfigError) as err:
        check_bind_policy(ServerConfig.load(["--host", "0.0.0.0"], env={}))
    assert "--insecure" in str(err.value) and "no users are configured" in str(err.value)
    check_bind_policy(ServerConfig.load(["--host", "0.0.0.0", "--insecure"], env={}))
    users = {"auth": {"users": [{"user_id": "a", "token_sha256": hash_token("t")}]}}
    check_bind_policy(ServerConfig.from_dict({"server": {"host": "0.0.0.0"}, **users}, env={}))


def test_main_exit_codes_and_hash_token(capsys):
    assert main(["hash-token", "abc"]) == 0
    assert capsys.readouterr().out.strip() == hash_token("abc") == \
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert main(["--host", "0.0.0.0"]) == 2
    assert "refusing to listen on '0.0.0.0'" in capsys.readouterr().err
    os.environ.pop("NPLT_PORT", None)
    assert main(["--config", "/nonexistent.toml"]) == 2
    assert "configuration error" in capsys.readouterr().err
    assert main(["hash-token"]) == 2


def test_json_logging(capsys):
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        setup_logging("info", "json")
        logging.getLogger("nplt.test").info("hello %s", "world", extra={"conn": 7})
        line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
        assert line["msg"] == "hello world" and line["level"] == "info" and line["conn"] == 7
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


async def test_entry_point_serves_and_stops_on_sigterm(tmp_path):
    port_file = tmp_path / "port"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPLT_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "server.main", "--port", "0", "--port-file", str(port_file),
         "--data-dir", str(tmp_path / "data"), "--log-format", "json"],
        env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "server did not write its port file"
            await asyncio.sleep(0.05)
        port = int(port_file.read_text())
        c = await V3Client.connect(("127.0.0.1", port))
        assert c.hello["agent"]["offline"] is True  # no LLM configured: the offline agent
        r = await c.call(MsgType.CHAT_TEXT, text="what time is it")
        end = (await c.turn_events(r["turn_id"], timeout=30))[-1]
        assert end.type == MsgType.TURN_END and end.body["message"]["content"]
        proc.send_signal(signal.SIGTERM)
        err = await c.wait_type(MsgType.ERROR)
        assert err.body["code"] == "SHUTTING_DOWN"
        await c.close()
        assert await asyncio.to_thread(proc.wait, 30) == 0
        log = proc.stderr.read()
        assert '"msg":"listening on 127.0.0.1:' in log and "what time is it" not in log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
