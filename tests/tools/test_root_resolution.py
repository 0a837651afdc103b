"""[tools] file_roots / log_roots are checked as resolved: ``//``, ``/srv/..`` or a symlink to ``/``
(or into /proc, /sys, /dev) are refused like ``/`` itself, since the tools resolve roots with realpath
when they read (``server.tools.paths``): ``["//"]`` used to pass the check and expose the whole disk."""
from __future__ import annotations

import os

import pytest

from server.config_base import ConfigError
from server.cli import load_config
from server.tools import ToolsConfig


def _links(tmp_path):
    os.symlink("/", tmp_path / "to-root")
    os.symlink("/proc", tmp_path / "to-proc")
    os.symlink("/dev/shm", tmp_path / "to-shm")
    return [str(tmp_path / "to-root"), str(tmp_path / "to-proc"), str(tmp_path / "to-shm") + "/"]


@pytest.mark.parametrize("key", ["file_roots", "log_roots"])
def test_roots_that_resolve_to_slash_or_a_pseudo_filesystem_are_refused(tmp_path, key):
    for bad in ["//", "///", "//proc", "/srv/..", "/tmp/../proc/self", "/./", *_links(tmp_path)] if key == "file_roots" \
            else ["//", "/var/..", str(tmp_path / "x/../../../../../../../..")]:
        with pytest.raises(ConfigError) as ei:
            ToolsConfig.from_dict({key: ["/var/log", bad]})
        assert ei.value.path == f"tools.{key}", bad
        assert "pseudo filesystem" in ei.value.message and repr(bad) in ei.value.message, bad
    with pytest.raises(ConfigError) as ei:
        ToolsConfig.from_dict({key: ["//"]})
    assert ei.value.message.startswith("'//' (resolved: '/') is or holds a pseudo filesystem")


def test_ordinary_roots_and_symlinks_to_them_still_pass(tmp_path):
    (tmp_path / "logs").mkdir()
    os.symlink(tmp_path / "logs", tmp_path / "link")
    roots = ["/var/log", str(tmp_path / "logs"), str(tmp_path / "link"), "//var/log"]
    assert ToolsConfig.from_dict({"file_roots": roots, "log_roots": roots}).file_roots == roots


def test_nplt_server_config_refuses_a_double_slash_root(tmp_path):
    cfg = tmp_path / "server.toml"
    cfg.write_text('[tools]\nfile_roots = ["//"]\n')
    with pytest.raises(ConfigError) as ei:                 # what nplt-server reports, with exit code 2
        load_config(["--data-dir", str(tmp_path / "data")], env={}, path=cfg)
    assert str(ei.value).startswith("tools.file_roots: '//' (resolved: '/') is or holds a pseudo filesystem")
