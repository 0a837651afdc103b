"""``nplt-client clients list [--json]`` / ``clients kill ID`` against a real server (admins only)."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from client import cli
from client.main import main
from client_testlib import ServerThread
from server.auth import hash_token


def run(st: ServerThread, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(["--host", st.addr[0], "--port", str(st.addr[1]), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list_and_kill(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with ServerThread(tmp_path) as st, socket.create_connection(st.addr) as other:   # single user: local is admin
        code, out, err = run(st, capsys, "clients", "list", "--json")
        assert code == 0, err
        clients = json.loads(out)["clients"]
        assert len(clients) == 2 and json.loads(out)["truncated"] is False and err == ""
        me = [c for c in clients if c["me"]]
        silent = [c for c in clients if not c["me"]]
        assert me[0]["user"] == "local" and me[0]["proto"] == "v3" and me[0]["state"] == "ready"
        assert silent[0]["state"] == "grace" and silent[0]["user"] is None
        code, out, err = run(st, capsys, "clients", "list")
        assert code == 0 and out.splitlines()[0].split()[:3] == ["ID", "PEER", "USER"]
        assert any(line.split()[0].endswith("*") for line in out.splitlines()[1:])  # this connection
        code, out, err = run(st, capsys, "clients", "kill", str(silent[0]["id"]))
        assert code == 0 and out == f"killed {silent[0]['id']}\n", err
        other.settimeout(10)
        assert other.recv(100) == b""                 # closed by the server
        code, out, err = run(st, capsys, "clients", "kill", str(silent[0]["id"]))
        assert code == cli.EXIT_REQUEST and "NOT_FOUND" in err and out == ""


def test_non_admins_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    users = {"auth": {"users": [{"user_id": "bob", "token_sha256": hash_token("t-bob")}]}}
    with ServerThread(tmp_path, sections=users) as st:
        monkeypatch.setenv("NPLT_CLIENT_TOKEN", "t-bob")
        code, out, err = run(st, capsys, "clients", "list")
        assert code == cli.EXIT_REQUEST and "FORBIDDEN" in err and out == ""
        with pytest.raises(SystemExit) as info:
            run(st, capsys, "clients", "kill", "0")
        assert info.value.code == cli.EXIT_USAGE and "positive integer" in capsys.readouterr().err
