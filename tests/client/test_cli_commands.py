"""``search``, ``rename`` and ``clear`` (what the TUI does with ctrl+f, f2 and f9), and arguments
that are not UTF-8, against a real server."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from client import cli
from client.main import main
from client.wording import stamp
from client_testlib import ServerThread


def run(st: ServerThread, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(["--host", st.addr[0], "--port", str(st.addr[1]), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_search_rename_and_clear(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with ServerThread(tmp_path) as st:
        code, out, err = run(st, capsys, "clear")                  # no session yet: says how to start one
        assert code == cli.EXIT_REQUEST and "NOT_FOUND" in err and "nplt-client ask" in err
        code, out, _ = run(st, capsys, "ask", "--new", "nginx restarts every night", "--json")
        nginx = json.loads(out)["session_id"]
        code, out, _ = run(st, capsys, "ask", "--new", "disk usage of /var", "--json")
        disk = json.loads(out)["session_id"]
        # search: every session by default, or one
        code, out, err = run(st, capsys, "search", "nginx", "--json")
        assert code == 0, err
        hits = json.loads(out)["hits"]
        assert hits and {h["session_id"] for h in hits} == {nginx}
        assert {"session_id", "title", "message_id", "role", "snippet", "timestamp", "score"} == set(hits[0])
        first = min(hits, key=lambda h: h["message_id"])
        code, out, _ = run(st, capsys, "search", "nginx")
        assert code == 0 and f"{nginx}  [{first['message_id']}] {first['role']}  {stamp(first['timestamp'])}  " in out
        code, out, err = run(st, capsys, "search", "nginx", "--session", disk, "--json")
        assert code == 0 and json.loads(out) == {"hits": []}
        code, out, err = run(st, capsys, "search", "nothing-like-this")
        assert (code, out, err) == (0, "", "nplt-client: no message matches\n")
        code, out, err = run(st, capsys, "search", "nginx", "--session", "s_20260101_000000000000")
        assert code == cli.EXIT_REQUEST and "NOT_FOUND" in err
        # rename
        code, out, err = run(st, capsys, "rename", nginx, "Nginx 夜间重启")
        assert (code, out) == (0, f"renamed {nginx}  Nginx 夜间重启\n")
        code, out, _ = run(st, capsys, "sessions", "--json")
        assert {s["session_id"]: s["title"] for s in json.loads(out)["sessions"]}[nginx] == "Nginx 夜间重启"
        code, out, err = run(st, capsys, "rename", nginx, "two\nlines")
        assert code == cli.EXIT_REQUEST and "INVALID_MESSAGE" in err
        code, out, err = run(st, capsys, "rename", "s_20260101_000000000000", "x")
        assert code == cli.EXIT_REQUEST and "NOT_FOUND" in err
        # clear: the most recently updated session by default, or --session; --purge
        code, out, err = run(st, capsys, "clear")
        assert (code, out) == (0, f"cleared 2 messages of {disk}\n")
        code, out, err = run(st, capsys, "clear", "--session", nginx, "--purge")
        assert (code, out) == (0, f"cleared and purged 2 messages of {nginx}\n")
        for sid in (nginx, disk):
            code, out, _ = run(st, capsys, "history", "--session", sid, "--json")
            assert json.loads(out)["messages"] == []
        code, out, _ = run(st, capsys, "search", "nginx", "--json")
        assert json.loads(out) == {"hits": []}
        code, out, err = run(st, capsys, "clear", "--session", "s_20260101_000000000000")
        assert code == cli.EXIT_REQUEST and "NOT_FOUND" in err


@pytest.mark.parametrize("command", ["search", "rename", "clear"])
def test_new_subcommands_have_help(command: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0 and f"usage: nplt-client {command}" in capsys.readouterr().out


def test_an_argument_that_is_not_utf8_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with ServerThread(tmp_path) as st:
        bad = b"\xff bad".decode("utf-8", "surrogateescape")     # what Python makes of $'\xff bad' in argv
        code, out, err = run(st, capsys, "ask", bad)
        assert (code, out) == (cli.EXIT_USAGE, "")
        assert err == "nplt-client: USAGE: TEXT is not valid UTF-8 (byte 0xff): the server takes UTF-8 text only\n"
        code, out, err = run(st, capsys, "search", bad)
        assert code == cli.EXIT_USAGE and "QUERY is not valid UTF-8" in err
        code, out, _ = run(st, capsys, "sessions", "--json")
        assert json.loads(out) == {"sessions": []}                  # nothing reached the server


def test_export_output_replaces_the_file_it_names(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with ServerThread(tmp_path / "srv") as st:
        run(st, capsys, "ask", "hello export")
        target = tmp_path / "chat.md"
        target.write_text("an older export\n")
        code, out, err = run(st, capsys, "export", "--output", str(target))
        assert (code, out) == (0, "") and "hello export" in target.read_text()
