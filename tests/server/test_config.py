"""Configuration: precedence (flags > env > file > defaults), precise errors, bind policy, main()'s exit codes.

The running ``nplt-server`` process (signals, log levels) is tested in test_signals.py.
"""
from __future__ import annotations

import io
import json
import logging
import os
import sys
import types
from pathlib import Path

import platformdirs
import pytest

from server import main as server_main
from server.auth import hash_token
from server.config import ServerConfig, check_bind_policy, is_loopback
from server.cli import default_log_file, load_config
from server.config_base import ConfigError
from server.logs import setup_logging
from server.main import main
from server.services import VERSION


@pytest.fixture(autouse=True)
def _no_caller_environment(monkeypatch):
    """The caller's NPLT_* (and OpenAI) variables must not change what these tests see."""
    for var in list(os.environ):
        if var.startswith("NPLT_") or var == "OPENAI_API_KEY":
            monkeypatch.delenv(var)


TOML = """
[server]
host = "127.0.0.1"
port = 7001
log_format = "json"

[limits]
max_clients = 10
idle_timeout_s = 30
ping_interval_s = 10

[storage]
root = "/tmp/from-file"
"""


D1, D2 = hash_token("token-1"), hash_token("token-2")
USERS = "[auth]\nusers = [{user_id = '%s', token_sha256 = '%s'}, {user_id = '%s', token_sha256 = '%s'}]\n"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "nplt.toml"
    p.write_text(text)
    return p


def test_defaults():
    cfg = load_config([], env={})
    assert (cfg.server.host, cfg.server.port, cfg.server.legacy_grace_ms) == ("127.0.0.1", 9999, 300)
    lim = cfg.limits
    assert (lim.max_clients, lim.max_message_size, lim.max_pending_requests, lim.max_page_size) == (256, 8 << 20, 32, 200)
    assert (lim.max_queued_turns, lim.idle_timeout_s, lim.ping_interval_s, lim.handshake_timeout_s) == (8, 300, 60, 10)
    assert (lim.max_output_buffer, lim.max_text_chars, lim.max_active_turns_per_user) == (4 << 20, 32000, 16)
    assert lim.shutdown_grace_s == 5.0
    assert (lim.max_total_input_buffer, lim.message_timeout_s, lim.max_clients_per_ip) == (256 << 20, 60.0, 64)
    assert cfg.auth.reserved_slots == 0
    assert cfg.auth.users == [] and cfg.single_user
    # the installed server's data directory does not depend on the current folder
    assert cfg.storage.root == str(platformdirs.user_data_path("nplt-assistant") / "history")
    assert os.path.isabs(cfg.storage.root)
    assert cfg.server.log_file is None and (cfg.server.log_max_bytes, cfg.server.log_backups) == (5 << 20, 3)
    assert default_log_file(cfg) == os.path.join(cfg.storage.root, "logs", "nplt-server.log")


def test_precedence_flags_over_env_over_file(tmp_path):
    path = write(tmp_path, TOML)
    cfg = load_config([], env={}, path=path)
    assert cfg.server.port == 7001 and cfg.server.log_format == "json" and cfg.limits.max_clients == 10
    assert cfg.limits.idle_timeout_s == 30.0 and cfg.limits.ping_interval_s == 10.0
    assert cfg.storage.root == "/tmp/from-file"
    env = {"NPLT_PORT": "7002", "NPLT_DATA_DIR": "/tmp/from-env", "NPLT_MAX_CLIENTS": "20",
           "NPLT_INSECURE": "yes", "NPLT_CONFIG": str(path)}
    cfg = load_config([], env=env)  # NPLT_CONFIG names the file
    assert (cfg.server.port, cfg.storage.root, cfg.limits.max_clients) == (7002, "/tmp/from-env", 20)
    assert cfg.server.insecure is True and cfg.server.log_format == "json"
    cfg = load_config(["--port", "7003", "--data-dir", "/tmp/from-flag", "--max-clients", "30",
                             "--log-format", "text", "--legacy-grace-ms", "50"], env=env)
    assert (cfg.server.port, cfg.storage.root, cfg.limits.max_clients) == (7003, "/tmp/from-flag", 30)
    assert cfg.server.log_format == "text" and cfg.server.legacy_grace_ms == 50


def test_llm_env_is_handled_by_the_agent_config():
    cfg = load_config([], env={"NPLT_LLM_API_KEY": "sk-test", "NPLT_LLM_PROVIDER": "deepseek"})
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
    ("[limits]\nmax_total_input_buffer = 1000\n", "limits.max_total_input_buffer: expected a value in"),
    ("[limits]\nmessage_timeout_s = 0\n", "limits.message_timeout_s: expected a value in"),
    ("[limits]\nmax_clients_per_ip = -1\n", "limits.max_clients_per_ip: expected a value in"),
    ("[auth]\nusers = [{user_id = 'a', token_sha256 = '%s', admin = 'yes'}]\n" % ("0" * 64), "auth.users[0].admin"),
    ("[nonsense]\nx = 1\n", "nonsense: unknown section"),
    ("[cluster]\nremote_cancel_wait_ms = -1\n", "cluster.remote_cancel_wait_ms: expected a value in"),
    ("[cluster]\ndelta_batch = 3\n", "cluster.delta_batch: unknown key"),
    ("[server\n", "invalid TOML"),
    ("[server]\nlog_level = 'verbose'\n", "server.log_level: expected one of debug, info, warning, error"),
    ("[server]\nlegacy_grace_ms = 0\n", "server.legacy_grace_ms: expected a value in 50..60000, got 0"),
    ("[limits]\nidle_timeout_s = 30\nping_interval_s = 30\n", "limits.ping_interval_s: must be less than "
     "limits.idle_timeout_s (got ping_interval_s = 30, idle_timeout_s = 30)"),
    ("[limits]\nidle_timeout_s = 30\n", "limits.ping_interval_s: must be less than limits.idle_timeout_s"),
    ("[auth]\nusers = [{user_id = 'a', token_sha256 = '%s'}]\n" % ("0" * 63), "users[0].token_sha256: expected 64 hex"),
    # a trailing newline is no part of a hash (two users could share a token: review s31)
    ("[auth]\nusers = [{user_id = 'a', token_sha256 = \"%s\\n\"}]\n" % ("0" * 64), "users[0].token_sha256: expected 64 hex"),
    ("[auth]\nusers = [{user_id = 'a', token_sha256 = '%s'}]\n" % ("g" * 64), "users[0].token_sha256: expected 64 hex"),
    (USERS % ("a", D1, "a", D2), "auth.users[1].user_id: duplicate user 'a'"),
    # the same digest in another case is the same token
    (USERS % ("a", D1, "b", D1.upper()), "auth.users[1].token_sha256: users 'a' and 'b' have the same token"),
])
def test_config_errors_are_precise(tmp_path, text, where):
    with pytest.raises(ConfigError) as err:
        load_config([], env={}, path=write(tmp_path, text))
    assert where in str(err.value)


def test_cluster_section_is_read(tmp_path):
    assert load_config([], env={}).cluster.remote_cancel_wait_ms == 2000.0
    assert load_config([], env={}).cluster.remote_state_wait_ms == 500.0
    cfg = load_config([], env={}, path=write(tmp_path, "[cluster]\ndelta_batch_ms = 5\nremote_cancel_wait_ms = 250\n"))
    assert (cfg.cluster.delta_batch_ms, cfg.cluster.remote_cancel_wait_ms, cfg.cluster.hello_wait_ms) == (5.0, 250.0, 1000.0)


def test_admin_users_reserve_one_slot(tmp_path):
    cfg = load_config([], env={}, path=write(tmp_path, USERS % ("a", D1, "b", D2)))
    assert [u.admin for u in cfg.auth.users] == [False, False] and cfg.auth.reserved_slots == 0
    text = "[auth]\nusers = [{user_id = 'a', token_sha256 = '%s', admin = true}, {user_id = 'b', token_sha256 = '%s'}]\n"
    cfg = load_config([], env={}, path=write(tmp_path, text % (D1, D2)))
    assert [u.admin for u in cfg.auth.users] == [True, False] and cfg.auth.reserved_slots == 1


def test_log_level_and_format_are_case_insensitive(tmp_path):
    cfg = load_config([], env={}, path=write(tmp_path, "[server]\nlog_level = 'Warning'\nlog_format = 'JSON'\n"))
    assert (cfg.server.log_level, cfg.server.log_format) == ("warning", "json")
    cfg = load_config([], env={"NPLT_LOG_LEVEL": "DEBUG", "NPLT_LOG_FORMAT": "Json"})
    assert (cfg.server.log_level, cfg.server.log_format) == ("debug", "json")
    cfg = load_config(["--log-level", "ERROR", "--log-format", "TEXT"], env={"NPLT_LOG_LEVEL": "DEBUG"})
    assert (cfg.server.log_level, cfg.server.log_format) == ("error", "text")
    with pytest.raises(ConfigError) as err:
        load_config([], env={"NPLT_LOG_LEVEL": "LOUD"})
    assert str(err.value) == "server.log_level: expected one of debug, info, warning, error (any case), got 'LOUD'"


def test_no_insecure_flag_overrides_env_and_file(tmp_path):
    path = write(tmp_path, "[server]\ninsecure = true\n")
    assert load_config([], env={}, path=path).server.insecure is True
    assert load_config(["--no-insecure"], env={}, path=path).server.insecure is False
    assert load_config(["--no-insecure"], env={"NPLT_INSECURE": "1"}).server.insecure is False
    assert load_config(["--insecure"], env={"NPLT_INSECURE": "0"}).server.insecure is True
    assert load_config([], env={"NPLT_INSECURE": "on"}).server.insecure is True
    with pytest.raises(ConfigError):  # insecure from the environment, turned off again by the flag
        check_bind_policy(load_config(["--host", "0.0.0.0", "--no-insecure"], env={"NPLT_INSECURE": "1"}))


def test_env_errors_name_the_variable():
    with pytest.raises(ConfigError) as err:
        load_config([], env={"NPLT_PORT": "abc"})
    assert str(err.value) == "NPLT_PORT: expected an integer, got 'abc'"
    with pytest.raises(ConfigError) as err:
        load_config([], env={"NPLT_INSECURE": "maybe"})
    assert "NPLT_INSECURE" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config([], env={}, path="/nonexistent/nplt.toml")
    assert "config file not found" in str(err.value)


def test_non_loopback_needs_users_or_insecure():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")
    with pytest.raises(ConfigError) as err:
        check_bind_policy(load_config(["--host", "0.0.0.0"], env={}))
    assert "--insecure" in str(err.value) and "no users are configured" in str(err.value)
    check_bind_policy(load_config(["--host", "0.0.0.0", "--insecure"], env={}))
    users = {"auth": {"users": [{"user_id": "a", "token_sha256": hash_token("t")}]}}
    check_bind_policy(ServerConfig.from_dict({"server": {"host": "0.0.0.0"}, **users}, env={}))


def test_main_exit_codes_and_hash_token(capsys):
    assert main(["hash-token", "abc"]) == 0
    assert capsys.readouterr().out.strip() == hash_token("abc") == \
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert main(["--host", "0.0.0.0"]) == 2
    assert "refusing to listen on '0.0.0.0'" in capsys.readouterr().err
    assert main(["--config", "/nonexistent.toml"]) == 2
    assert "configuration error" in capsys.readouterr().err


def test_hash_token_is_a_subcommand(capsys, monkeypatch):
    with pytest.raises(SystemExit) as done:
        main(["hash-token", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: nplt-server hash-token") and "stdin" in out
    monkeypatch.setattr(sys, "stdin", io.StringIO("abc\n"))
    assert main(["hash-token"]) == 0                       # read from stdin when not given
    assert capsys.readouterr().out.strip() == hash_token("abc")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["hash-token"]) == 2
    assert "the token is empty" in capsys.readouterr().err
    assert main(["hash-token", "k" * 4097]) == 2           # no HELLO accepts it (review s31)
    assert "4097 characters" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        main(["hash-token", "a", "b"])
    assert done.value.code == 2


def test_version_and_log_settings(capsys, tmp_path):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"nplt-server {VERSION}"
    cfg = load_config(["--log-file", "off", "--data-dir", str(tmp_path)], env={})
    assert default_log_file(cfg) is None
    cfg = load_config([], env={"NPLT_LOG_FILE": str(tmp_path / "x.log"), "NPLT_LOG_MAX_BYTES": "8192",
                               "NPLT_LOG_BACKUPS": "0"})
    assert (default_log_file(cfg), cfg.server.log_max_bytes, cfg.server.log_backups) == (str(tmp_path / "x.log"), 8192, 0)
    cfg = load_config(["--data-dir", str(tmp_path / "node1")], env={"NPLT_STORAGE_URL": "postgresql://u@h/db"})
    assert default_log_file(cfg) == str(tmp_path / "node1" / "logs" / "nplt-server.log")   # a node's own folder
    with pytest.raises(ConfigError):
        load_config([], env={"NPLT_LOG_MAX_BYTES": "10"})


def test_the_log_file_rotates(tmp_path):
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    path = tmp_path / "logs" / "server.log"
    try:
        out = setup_logging("info", "text", str(path), max_bytes=4096, backups=2)
        for i in range(200):
            logging.getLogger("nplt.test").info("line %d %s", i, "x" * 60)
        out.close()
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["server.log", "server.log.1", "server.log.2"]
    assert all(p.stat().st_size <= 4096 for p in path.parent.iterdir())
    assert "line 199 " in path.read_text()


def test_uvloop_is_selected_when_installed(monkeypatch):
    fake = types.ModuleType("uvloop")
    fake.new_event_loop = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "uvloop", fake)
    assert server_main._loop_factory() is fake.new_event_loop


def test_default_loop_without_uvloop(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # "import uvloop" now raises ImportError
    assert server_main._loop_factory() is None  # asyncio.Runner's default loop


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


def test_storage_url_from_flag_env_and_file(tmp_path):
    """PostgreSQL is one setting away: --storage-url > NPLT_STORAGE_URL > [storage] url."""
    assert load_config([], env={}).storage.url is None
    assert load_config([], env={"NPLT_STORAGE_URL": "postgresql://e/db"}).storage.url == "postgresql://e/db"
    path = tmp_path / "c.toml"
    path.write_text('[storage]\nurl = "postgresql://f/db"\n', encoding="utf-8")
    assert load_config([], env={}, path=path).storage.url == "postgresql://f/db"
    got = load_config(["--storage-url", "postgresql://g/db"], env={"NPLT_STORAGE_URL": "postgresql://e/db"}, path=path)
    assert got.storage.url == "postgresql://g/db"


def test_the_standby_is_capped_by_the_hello_deadline():
    """(review s31: a standby longer than handshake_timeout_s let an admin's HELLO arrive in time for
    the standby and be refused HANDSHAKE_TIMEOUT)"""
    limits = ServerConfig.from_dict({"limits": {"handshake_timeout_s": 0.5, "standby_timeout_s": 4}}, env={}).limits
    assert limits.standby_s == 0.5
    assert ServerConfig.from_dict({}, env={}).limits.standby_s == 1.0


def test_relative_paths_in_a_config_file_are_taken_from_its_folder(tmp_path, monkeypatch):
    """systemd runs the server from /: a relative root or log file in /etc/nplt/server.toml means
    /etc/nplt/..., not /...; flags and environment variables stay relative to the current folder."""
    etc, elsewhere = tmp_path / "etc", tmp_path / "elsewhere"
    etc.mkdir()
    elsewhere.mkdir()
    (etc / "server.toml").write_text('[server]\nlog_file = "logs/server.log"\n'
                                     '[storage]\nroot = "history"\n'
                                     '[user_memory]\nroot = "/abs/memory"\n')
    monkeypatch.chdir(elsewhere)
    cfg = load_config(["--config", str(etc / "server.toml")], env={})
    assert cfg.storage.root == str(etc / "history")
    assert cfg.server.log_file == str(etc / "logs" / "server.log")
    assert cfg.memory.user_memory.root == "/abs/memory"
    cfg = load_config(["--config", "../etc/server.toml", "--data-dir", "data"], env={})
    assert cfg.storage.root == "data"            # a flag: relative to the current folder, as given
    assert cfg.server.log_file == str(etc / "logs" / "server.log")
    (etc / "off.toml").write_text('[server]\nlog_file = "off"\n')
    assert default_log_file(load_config(["--config", str(etc / "off.toml")], env={})) is None
