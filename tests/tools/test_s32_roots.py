"""Review s32: a tools root that does not exist (a typo: /var/lgo, /etc/ngnix) or is not a readable
directory is still accepted, but each one is logged at WARNING when the tool registry is built at
start-up (so the warning reaches the log file too)."""
from __future__ import annotations

import logging

from server.config import ServerConfig
from server.tools.config import ToolsConfig
from server.tools.registry import ToolRegistry
from testkit.process import ServerProcess


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "server.tools.registry" and "readable directory"
            in r.getMessage() and r.levelno == logging.WARNING]


def test_each_unusable_root_is_named_once(tmp_path, caplog):
    good = tmp_path / "logs"
    good.mkdir()
    a_file = tmp_path / "hostname"
    a_file.write_text("h\n")
    cfg = ServerConfig.from_dict({"tools": {"log_roots": [str(tmp_path / "lgo"), str(good)],
                                            "file_roots": [str(tmp_path / "ngnix"), str(a_file)]}}, env={})
    assert warnings(caplog) == []                # loading a configuration says nothing: starting does
    with caplog.at_level(logging.WARNING, logger="server.tools.registry"):
        ToolRegistry(cfg.tools).close()
    assert cfg.tools.log_roots == [str(tmp_path / "lgo"), str(good)]       # still accepted: the server starts
    said = warnings(caplog)
    assert len(said) == 3
    assert said[0].startswith(f"tools.log_roots entry '{tmp_path / 'lgo'}' does not exist")
    assert said[1].startswith(f"tools.file_roots entry '{tmp_path / 'ngnix'}' does not exist")
    assert said[2].startswith(f"tools.file_roots entry '{a_file}' is not a directory")
    assert not any(str(good) + "'" in s for s in said)


def test_readable_roots_and_no_roots_say_nothing(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="server.tools.registry"):
        ToolRegistry(ToolsConfig.from_dict({"log_roots": [str(tmp_path)], "file_roots": [str(tmp_path)]})).close()
        ToolRegistry(ToolsConfig()).close()
    assert warnings(caplog) == []
    assert ToolsConfig.from_dict({"file_roots": [str(tmp_path / "x")]}).unusable_roots() == [
        f"tools.file_roots entry '{tmp_path / 'x'}' does not exist"]


async def test_a_real_server_start_warns_about_a_misspelt_root(tmp_path):
    conf = tmp_path / "nplt.toml"
    missing = tmp_path / "var" / "lgo"
    conf.write_text(f'[tools]\nlog_roots = ["{missing}"]\n')
    srv = await ServerProcess.start(tmp_path / "data", "--config", str(conf))
    try:
        assert await srv.stop() == 0
    finally:
        srv.kill()
    err = srv.log_path.read_text()
    assert err.count(f"tools.log_roots entry '{missing}' does not exist") == 1
