"""The server's own data is never readable through the file and log tools, even when a root holds it.

A file or log root may be a parent of the server's data directory (``file_roots = ["/home/ops"]`` with
the default data directory under ~/.local/share): then every user could read every other user's
conversations, documents and memory. ``Protected`` paths are refused when asked for (as given, once
resolved, through a symlink, even when they do not exist), and skipped silently by list_dir and
search_files when they walk a parent.
"""
from __future__ import annotations

import logging
import os

import orjson
import pytest

from server.cli import load_config
from server.config import ServerConfig
from server.tools import ToolContext, ToolRegistry, ToolsConfig
from server.tools.paths import PathPolicy, Protected, protected_overlaps
from server.tools.units import ToolFailure
from server.wiring import protected_paths

CTX = ToolContext("bob", "s_1")
REFUSED = "is part of the server's own data"


@pytest.fixture
def tree(tmp_path):
    """tmp/srv (the root): public/ files, nplt-data/ (the server's data), server.toml and server.log."""
    srv = tmp_path / "srv"
    data = srv / "nplt-data"
    (data / "user_memory").mkdir(parents=True)
    (data / "knowledge").mkdir()
    (data / "session_alice.journal").write_text('{"content": "the vault phrase is purple-elephant-42"}\n')
    (data / "user_memory" / "alice.json").write_text('{"text": "purple-elephant-42"}\n')
    (data / "knowledge" / "chunks.json").write_text('{"text": "alice salary zebra"}\n')
    (srv / "public").mkdir()
    (srv / "public" / "notice.txt").write_text("purple-elephant is the team mascot\n")
    (srv / "server.toml").write_text('[llm]\napi_key_hint = "purple-elephant"\n')
    (srv / "server.log").write_text("alice asked about purple-elephant\n")
    (srv / "server.log.1").write_text("older purple-elephant line\n")
    return srv


def protected(srv) -> tuple[Protected, ...]:
    return (Protected(str(srv / "nplt-data"), "storage.root"),
            Protected(str(srv / "server.toml"), "the server's config file"),
            Protected(str(srv / "server.log"), "the server log file"),
            Protected(str(srv / "server.log.1"), "the server log file"))


def registry(srv, **kw) -> ToolRegistry:
    return ToolRegistry(ToolsConfig(file_roots=[str(srv)], log_roots=[str(srv)], **kw), protected=protected(srv))


async def run(tools, name, **args):
    call = await tools.run(name, args, CTX)
    return call.status, orjson.loads(call.result)


def policy(srv) -> PathPolicy:
    return PathPolicy((str(srv),), "file directories", "tools.file_roots", "read_file", protected(srv))


# -- PathPolicy ------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [
    "nplt-data",                                   # relative to the root
    "nplt-data/session_alice.journal",
    "nplt-data/user_memory/alice.json",
    "server.toml", "server.log", "server.log.1",
    "nplt-data/no-such-file",                      # not there: refused all the same (no existence oracle)
    "nplt-data/knowledge/chunks.json",
])
def test_policy_refuses_paths_inside_the_servers_data(tree, path):
    for shown in (path, str(tree / path)):
        with pytest.raises(ToolFailure, match=REFUSED) as e:
            policy(tree).resolve(shown)
        assert shown in str(e.value)
    assert policy(tree).resolve("public/notice.txt") == os.path.realpath(tree / "public" / "notice.txt")


def test_policy_refuses_a_symlink_into_the_servers_data(tree):
    (tree / "public" / "innocent").symlink_to(tree / "nplt-data")
    (tree / "public" / "notes.txt").symlink_to(tree / "nplt-data" / "session_alice.journal")
    (tree / "public" / "settings.txt").symlink_to(tree / "server.toml")
    for path in ("public/innocent", "public/innocent/user_memory/alice.json", "public/notes.txt",
                 str(tree / "public" / "settings.txt")):
        with pytest.raises(ToolFailure, match=REFUSED):
            policy(tree).resolve(path)


def test_policy_refuses_through_a_symlinked_protected_path(tmp_path):
    """The data directory named through a symlink (storage.root = /srv/data -> /srv/.real-data): its real
    path is protected too, and the name given."""
    root = tmp_path / "srv"
    (root / ".real-data").mkdir(parents=True)
    (root / ".real-data" / "index.json").write_text("{}")
    (root / "data").symlink_to(root / ".real-data")
    p = PathPolicy((str(root),), "file directories", "tools.file_roots", "read_file",
                   (Protected(str(root / "data"), "storage.root"),))
    for path in (".real-data/index.json", "data/index.json", str(root / ".real-data")):
        with pytest.raises(ToolFailure, match=REFUSED):
            p.resolve(path)


def test_a_root_inside_the_servers_data_reads_nothing(tree):
    p = PathPolicy((str(tree / "nplt-data"),), "file directories", "tools.file_roots", "list_dir", protected(tree))
    with pytest.raises(ToolFailure, match=REFUSED):
        p.resolve(".")
    with pytest.raises(ToolFailure, match=REFUSED):
        p.resolve("user_memory/alice.json")


def test_without_protected_paths_nothing_changes(tree):
    p = PathPolicy((str(tree),), "file directories", "tools.file_roots", "read_file")
    assert p.resolve("nplt-data/session_alice.journal").endswith("session_alice.journal")


# -- the tools ---------------------------------------------------------------------------------------

async def test_list_dir_of_a_parent_leaves_the_servers_data_out(tree):
    status, d = await run(registry(tree), "list_dir", path=str(tree))
    assert status == "success"
    assert [e["name"] for e in d["entries"]] == ["public"]   # no nplt-data, server.toml, server.log*
    assert "hidden" not in d and d["matched"] == 1            # silently: not even counted


async def test_list_dir_of_the_data_directory_is_refused(tree):
    tools = registry(tree)
    for path in (str(tree / "nplt-data"), "nplt-data/user_memory"):
        status, d = await run(tools, "list_dir", path=path)
        assert status == "error" and REFUSED in d["error"] and "storage.root" in d["error"]


async def test_search_files_of_a_parent_skips_the_servers_data(tree):
    (tree / "public" / "innocent").symlink_to(tree / "nplt-data")   # a symlink is never followed either
    status, d = await run(registry(tree), "search_files", root=str(tree), pattern="purple-elephant")
    assert status == "success"
    assert [(m["path"], m["text"]) for m in d["matches"]] == [
        ("public/notice.txt", "purple-elephant is the team mascot")]
    assert d["files_searched"] == 1 and "skipped" not in d    # the protected paths: not even counted
    status, d = await run(registry(tree), "search_files", root=".", pattern="zebra")
    assert status == "success" and d["matches"] == []


async def test_search_read_and_tail_inside_the_data_are_refused(tree):
    tools = registry(tree)
    cases = [("search_files", {"root": str(tree / "nplt-data"), "pattern": "purple"}),
             ("search_files", {"root": "nplt-data/user_memory", "pattern": "purple"}),
             ("read_file", {"path": str(tree / "nplt-data" / "session_alice.journal")}),
             ("read_file", {"path": "server.toml"}),
             ("read_log", {"path": "server.log"}),
             ("read_log", {"path": str(tree / "nplt-data" / "session_alice.journal")})]
    for name, args in cases:
        status, d = await run(tools, name, **args)
        assert status == "error" and REFUSED in d["error"], (name, args, d)
        assert "purple" not in d["error"] or "pattern" in args


async def test_the_rest_of_the_root_stays_readable(tree):
    tools = registry(tree)
    status, d = await run(tools, "read_file", path="public/notice.txt")
    assert status == "success" and d["text"] == "purple-elephant is the team mascot"


# -- the start-up warning ------------------------------------------------------------------------------

def test_one_warning_when_a_root_holds_the_servers_data(tree, caplog):
    with caplog.at_level(logging.WARNING, logger="server.tools.registry"):
        registry(tree)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"tools.file_roots entry {tree} holds storage.root {tree / 'nplt-data'}" in warnings[0]
    assert f"tools.log_roots entry {tree} holds the server log file {tree / 'server.log'}" in warnings[0]


def test_no_warning_when_the_roots_are_elsewhere(tree, caplog):
    with caplog.at_level(logging.WARNING, logger="server.tools.registry"):
        ToolRegistry(ToolsConfig(file_roots=[str(tree / "public")]), protected=protected(tree))
        ToolRegistry(ToolsConfig(file_roots=[str(tree)]))
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_overlaps_name_both_directions(tree):
    inner = str(tree / "nplt-data" / "knowledge")
    assert protected_overlaps({"tools.file_roots": [inner]}, (Protected(str(tree / "nplt-data"), "storage.root"),)) == [
        f"tools.file_roots entry {inner} lies inside storage.root {tree / 'nplt-data'}"]


# -- what the server protects (server.wiring) ------------------------------------------------------------

def test_protected_paths_of_a_server_config(tmp_path):
    toml = tmp_path / "etc" / "server.toml"
    toml.parent.mkdir()
    toml.write_text(f"""
[storage]
root = "{tmp_path / 'data'}"
[server]
log_file = "{tmp_path / 'log' / 'nplt.log'}"
log_backups = 2
tls_cert = "{tmp_path / 'tls' / 'cert.crt'}"
tls_key = "{tmp_path / 'tls' / 'server-key.txt'}"
[user_memory]
root = "{tmp_path / 'memory'}"
""")
    cfg = load_config([], env={}, path=toml)
    assert cfg.config_file == str(toml)
    assert {(p.path, p.what) for p in protected_paths(cfg)} == {
        (str(tmp_path / "data"), "storage.root"),                 # knowledge/ and uploads/ are inside it
        (str(tmp_path / "memory"), "user_memory.root"),
        (str(tmp_path / "log" / "nplt.log"), "the server log file"),
        (str(tmp_path / "log" / "nplt.log.1"), "the server log file"),
        (str(tmp_path / "log" / "nplt.log.2"), "the server log file"),
        (str(tmp_path / "tls" / "server-key.txt"), "server.tls_key"),
        (str(toml), "the server's config file"),
    }


def test_protected_paths_default_layout(tmp_path):
    cfg = ServerConfig.from_dict({"storage": {"root": str(tmp_path / "history")}}, env={})
    assert cfg.config_file is None
    assert [(p.path, p.what) for p in protected_paths(cfg)] == [(str(tmp_path / "history"), "storage.root")]
