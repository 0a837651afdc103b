"""Backup copies of secret-named files and shell / database history files are refused (review s34,
calls2.json): ``trap/server.key.bak`` and ``trap/.vault-token.old`` were read (``*.key`` does not match
``*.key.bak``), and ``.psql_history`` with ``ALTER USER ... PASSWORD`` came back raw.

A secret name followed by up to ``paths.MAX_BACKUP_SUFFIXES`` of ``paths.BACKUP_SUFFIXES`` (``.bak``,
``.old``, ``.orig``, ``~``, ``.save``, ``.swp``, ...) or a numbered / dated ending (``.1``, ``-20240501``),
vim's ``.NAME.swp`` and emacs's ``#NAME#`` are refused like the name; ``paths.HISTORY_FILE_PATTERNS`` by name.
"""
from __future__ import annotations

import orjson
import pytest

from protocol import MsgType
from server.app import Server
from server.tools import ToolContext, ToolRegistry, ToolsConfig
from server.tools.paths import is_secret_name
from testkit.scripted_llm import Reply, ScriptedLLM, ToolCallSpec
from testkit.server import V3Client, make_config

CTX = ToolContext("alice", "s_1")

SECRET_COPIES = ["server.key.bak", ".vault-token.old", ".netrc.bak", "server.key~", ".server.key.swp", "#server.key#",
                 "server.key.1", "server.key.bak.1", "tls.key-20240501", "id_rsa.orig", "credentials.json.save",
                 "secrets.yaml.20240501T101010", "cert.pem.dpkg-old", ".pgpass.rpmsave", "SERVER.KEY.BAK",
                 ".htpasswd.backup", "keystore.jks.prev"]
HISTORY_FILES = [".bash_history", ".zsh_history", ".psql_history", ".mysql_history", ".python_history",
                 ".rediscli_history", ".node_repl_history", ".sqlite_history", "fish_history", ".psql_history.bak",
                 ".custom_tool_history"]
NOT_SECRETS = ["app.log.1", "app.log.bak", "notes.txt.old", "history.txt", "history.log", "key.txt", "backup.tar.gz",
               "README.md~", "keys.py", ".bashrc", ".bashrc.bak", "app.log.2024-05-01", "x.1", ".1", "server.crt.bak",
               "keyboard.conf.orig", "history_report.csv"]


@pytest.mark.parametrize("name", SECRET_COPIES + HISTORY_FILES)
def test_backups_of_secret_names_and_history_files_are_secret(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", NOT_SECRETS)
def test_ordinary_backups_and_rotations_are_not(name):
    assert not is_secret_name(name)


def test_a_backup_of_a_secret_file_in_its_directory():
    assert is_secret_name("config.bak", ".kube") and is_secret_name("config.json.old", ".docker")
    assert not is_secret_name("config.bak", "app")


TRAP = {"server.key.bak": "-----BEGIN RSA PRIVATE KEY-----\nMIIbakKeyBody\n-----END RSA PRIVATE KEY-----\n",
        ".vault-token.old": "s_VaultOldTokenBody42\n", ".netrc.bak": "machine x login u password NetrcBakBody42\n",
        ".psql_history": "select 1;\nALTER USER app PASSWORD 'PsqlHistoryBody42';\n",
        ".bash_history": "ls\nexport API_TOKEN_FOR_CI=BashHistoryBody42\n", "notes.txt": "plain notes\n"}
BODIES = ["MIIbakKeyBody", "VaultOldTokenBody42", "NetrcBakBody42", "PsqlHistoryBody42", "BashHistoryBody42"]


@pytest.fixture
def trap(tmp_path):
    root = tmp_path / "files"
    (root / "trap").mkdir(parents=True)
    for name, text in TRAP.items():
        (root / "trap" / name).write_text(text)
    return root


async def test_the_file_tools_refuse_hide_and_skip_them(trap):
    tools = ToolRegistry(ToolsConfig(file_roots=[str(trap)], log_roots=[str(trap)]))
    for name in TRAP:
        if name == "notes.txt":
            continue
        for tool in ("read_file", "read_log"):
            call = await tools.run(tool, {"path": f"trap/{name}"}, CTX)
            assert call.status == "error" and "may hold secrets" in orjson.loads(call.result)["error"], (tool, name)
    listing = orjson.loads((await tools.run("list_dir", {"path": "trap"}, CTX)).result)
    assert [e["name"] for e in listing["entries"]] == ["notes.txt"] and listing["hidden"] == len(TRAP) - 1
    found = orjson.loads((await tools.run("search_files", {"root": "trap", "pattern": "o"}, CTX)).result)
    assert {m["path"] for m in found["matches"]} == {"notes.txt"} and found["skipped"]["secret"] == len(TRAP) - 1


async def test_a_real_server_never_reads_them(trap, tmp_path):
    """calls2.json over the wire: a scripted model asks for each copy; every call is refused and no body
    reaches the user (live, history) nor the model."""
    names = [n for n in TRAP if n != "notes.txt"]
    async with ScriptedLLM() as llm:
        llm.push(Reply.tools(*[ToolCallSpec(f"c{i}", "read_file", orjson.dumps({"path": f"trap/{n}"}).decode())
                               for i, n in enumerate(names)]), Reply.text("done"))
        cfg = make_config(tmp_path, sections={
            "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": llm.model, "retries": 0},
            "summarization": {"enabled": False}, "tools": {"file_roots": [str(trap)]}})
        srv = Server(cfg)
        addr = await srv.start()
        try:
            c = await V3Client.connect(addr)
            reply = await c.call(MsgType.CHAT_TEXT, text="read the trap folder")
            events = await c.turn_events(reply["turn_id"], timeout=30)
            history = await c.call(MsgType.HISTORY_REQUEST)
            await c.close()
        finally:
            await srv.stop()
    assert events[-1].type == MsgType.TURN_END, events[-1].body
    calls = [ev.body["call"] for ev in events if ev.type == MsgType.TOOL_RESULT]
    assert len(calls) == len(names) and all(c["status"] == "error" for c in calls), calls
    blob = orjson.dumps([[ev.body for ev in events], history, [r.body for r in llm.requests]]).decode()
    assert not [b for b in BODIES if b in blob]
