"""The scriptable CLI: every subcommand, its JSON document and its exit codes, against a real server."""
from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from client import cli
from client.main import main
from client.wording import stamp
from client_testlib import ServerThread


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with ServerThread(tmp_path_factory.mktemp("cli")) as st:
        yield st


def run(st: ServerThread | None, capsys: pytest.CaptureFixture, *args: str, port: int | None = None):
    """main() in-process; returns (exit code, stdout, stderr)."""
    host, p = st.addr if st else ("127.0.0.1", port)
    code = main(["--host", host, "--port", str(p), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ask_streams_answer(srv: ServerThread, capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(srv, capsys, "ask", "hello cli")
    assert code == 0, err
    assert out == "echo: hello cli\n"


def test_ask_json_keeps_an_answer_the_server_cut_to_fit(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with ServerThread(tmp_path, max_message_size=65535) as st:
        code, out, err = run(st, capsys, "ask", "!big 90000", "--json")
        assert code == 0, err
        assert json.loads(out)["message"]["content"] == "x" * 90_000     # the streamed text, not the cut copy
        code, out, err = run(st, capsys, "ask", "!big 90000")
        assert code == 0 and out == "x" * 90_000 + "\n" and err == ""


def test_ask_json_document(srv: ServerThread, capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(srv, capsys, "ask", "--new", "!tool json please", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) == {"session_id", "turn_id", "user_message", "message", "tool_calls", "usage", "finish_reason"}
    assert doc["user_message"]["content"] == "!tool json please"
    assert doc["message"]["content"] == "echo: !tool json please"
    assert doc["tool_calls"][0]["tool_name"] == "fake_tool" and doc["tool_calls"][0]["status"] == "success"
    assert doc["finish_reason"] == "stop" and doc["usage"]["total_tokens"] > 0
    # the same session is used with --session, and its history now holds both turns
    code, out, _ = run(srv, capsys, "ask", "--session", doc["session_id"], "again", "--json")
    assert code == 0 and json.loads(out)["session_id"] == doc["session_id"]
    code, out, _ = run(srv, capsys, "history", "--session", doc["session_id"], "--json")
    page = json.loads(out)
    assert [m["content"] for m in page["messages"]][-1] == "echo: again" and page["total"] == 4


def test_ask_errors(srv: ServerThread, capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(srv, capsys, "ask", "--session", "s_20260101_000000000000", "hi")
    assert code == cli.EXIT_REQUEST and "NOT_FOUND" in err and out == ""
    code, out, err = run(srv, capsys, "ask", "!fail please", "--json")
    assert code == cli.EXIT_TURN and "LLM_ERROR" in err and out == ""
    code, out, err = run(srv, capsys, "ask", "!fail please")     # the partial answer's line is ended
    assert code == cli.EXIT_TURN and out.startswith("echo: ") and out.endswith("\n") and "LLM_ERROR" in err
    code, _, err = run(None, capsys, "ask", "hi", port=free_port())
    assert code == cli.EXIT_CONNECTION and "CONNECTION_REFUSED" in err


def test_auth_failure_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    with ServerThread(tmp_path, users=[("bob", "right")]) as st:
        monkeypatch.setenv("NPLT_CLIENT_TOKEN", "wrong")
        code, _, err = run(st, capsys, "sessions")
        assert code == cli.EXIT_AUTH and "AUTH_FAILED" in err
        code, _, err = run(st, capsys, "--token", "right", "sessions", "--json")  # flag beats env
        assert code == 0, err


def test_sessions(srv: ServerThread, capsys: pytest.CaptureFixture) -> None:
    run(srv, capsys, "ask", "--new", "listed session")
    code, out, err = run(srv, capsys, "sessions", "--json")
    assert code == 0, err
    sessions = json.loads(out)["sessions"]
    assert sessions and all({"session_id", "title", "message_count", "updated_at"} <= set(s) for s in sessions)
    updated = [s["updated_at"] for s in sessions]
    assert updated == sorted(updated, reverse=True)
    code, out, _ = run(srv, capsys, "sessions", "--limit", "1")
    assert code == 0 and len(out.strip().splitlines()) == 1
    newest = sessions[0]
    assert out.startswith(f"{newest['session_id']}  {stamp(newest['updated_at'])}  ")   # local time, zone named
    assert f"{newest['message_count']} messages  {newest['title']}" in out


def test_history_paging(srv: ServerThread, capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(srv, capsys, "ask", "--new", "first", "--json")
    sid = json.loads(out)["session_id"]
    for text in ("second", "third"):
        run(srv, capsys, "ask", "--session", sid, text)
    code, out, _ = run(srv, capsys, "history", "--session", sid, "--limit", "2", "--json")
    page = json.loads(out)
    assert set(page) == {"session_id", "messages", "has_more", "next_before", "total"}
    assert [m["content"] for m in page["messages"]] == ["third", "echo: third"] and page["has_more"]
    code, out, _ = run(srv, capsys, "history", "--session", sid, "--before", str(page["next_before"]),
                       "--limit", "2", "--json")
    assert [m["content"] for m in json.loads(out)["messages"]] == ["second", "echo: second"]
    code, out, _ = run(srv, capsys, "history", "--session", sid)
    assert code == 0 and "] user" in out and "echo: first" in out
    code, _, err = run(srv, capsys, "history", "--session", "s_20260101_000000000000")
    assert code == cli.EXIT_REQUEST and "NOT_FOUND" in err
    code, _, err = run(srv, capsys, "history", "--session", sid, "--limit", "5000")
    assert code == cli.EXIT_USAGE and err == "nplt-client: USAGE: --limit 5000 is over the server's max_page_size (200)\n"
    code, out, _ = run(srv, capsys, "history", "--limit", "2", "--json")   # default: the latest session
    assert code == 0 and json.loads(out)["session_id"] == sid
    assert [m["content"] for m in json.loads(out)["messages"]] == ["third", "echo: third"]


def test_export(srv: ServerThread, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    code, out, _ = run(srv, capsys, "ask", "--new", "export me", "--json")
    sid = json.loads(out)["session_id"]
    code, out, _ = run(srv, capsys, "export", "--session", sid, "--format", "markdown")
    assert code == 0 and "export me" in out
    code, latest, _ = run(srv, capsys, "export")                      # default: the latest session
    assert code == 0 and latest == out
    target = tmp_path / "out.json"
    code, out, _ = run(srv, capsys, "export", "--session", sid, "--format", "json", "--output", str(target))
    assert code == 0 and out == ""
    assert "echo: export me" in json.dumps(json.loads(target.read_text()))
    code, _, err = run(srv, capsys, "export", "--session", sid, "--output", str(tmp_path / "no" / "dir.md"))
    assert code == cli.EXIT_USAGE and "WRITE_FAILED" in err


def test_usage_and_config_errors(srv: ServerThread, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        run(srv, capsys, "export", "--session", "x", "--format", "pdf")
    assert info.value.code == cli.EXIT_USAGE
    code, _, err = run(srv, capsys, "--config", str(tmp_path / "missing.toml"), "sessions")
    assert code == cli.EXIT_USAGE and "CONFIG_ERROR" in err
    bad = tmp_path / "bad.toml"
    bad.write_text('port = "high"\n')
    code, _, err = run(srv, capsys, "--config", str(bad), "sessions")
    assert code == cli.EXIT_USAGE and "port" in err


def test_real_process_entry_point(srv: ServerThread, tmp_path: Path) -> None:
    env = {**os.environ, "NPLT_CLIENT_HOST": srv.addr[0], "NPLT_CLIENT_PORT": str(srv.addr[1]),
           "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "client.main", "ask", "from a process", "--json"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["message"]["content"] == "echo: from a process"
    env["NPLT_CLIENT_PORT"] = str(free_port())
    proc = subprocess.run([sys.executable, "-m", "client.main", "sessions"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == cli.EXIT_CONNECTION and proc.stderr.startswith("nplt-client: CONNECTION_REFUSED")


def test_version(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("nplt-client ")


def test_ask_dash_reads_the_message_from_stdin(srv: ServerThread, capsys: pytest.CaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("line one\nline two\n"))
    code, out, err = run(srv, capsys, "ask", "-")
    assert code == 0, err
    assert out == "echo: line one\nline two\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO("  \n"))
    code, out, err = run(srv, capsys, "ask", "-")
    assert code == cli.EXIT_USAGE and out == ""
    assert err == "nplt-client: USAGE: the message is empty (give its text, or - and the text on stdin)\n"
    for empty in ("", " \n "):                         # given on the command line: the same usage error
        assert run(srv, capsys, "ask", empty) == (cli.EXIT_USAGE, "", err)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xfe not UTF-8\n"), encoding="utf-8",
                                                       errors="surrogateescape"))   # as a C.UTF-8 stdin reads it
    code, out, err = run(srv, capsys, "ask", "-")       # checked here, before anything is sent: a usage error
    assert (code, out) == (cli.EXIT_USAGE, "")
    assert err == "nplt-client: USAGE: stdin is not valid UTF-8 (byte 0xff): the server takes UTF-8 text only\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ok \xff\n"), encoding="utf-8"))   # strict
    code, out, err = run(srv, capsys, "ask", "-")
    assert (code, out) == (cli.EXIT_USAGE, "") and "stdin is not valid UTF-8 (byte 0xff)" in err


def test_a_closed_pipe_ends_quietly(srv: ServerThread, tmp_path: Path) -> None:
    env = {**os.environ, "NPLT_CLIENT_HOST": srv.addr[0], "NPLT_CLIENT_PORT": str(srv.addr[1]),
           "HOME": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "client.main", "ask", "!tokens 20000"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(8) == b"tok tok "       # like `| head -c 8`: read a little, then close
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == cli.EXIT_OK, err
    assert err == ""


def test_a_server_stopping_during_ask_exits_with_the_connection_code(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    with ServerThread(tmp_path) as st:
        result: dict[str, int] = {}
        asker = threading.Thread(target=lambda: result.update(code=main(
            ["--host", st.addr[0], "--port", str(st.addr[1]), "ask", "!block until the end"])))
        asker.start()
        try:
            st.run(st.srv.agent.wait_blocked(1))
            st.run(st.srv.stop())
        finally:
            st.srv.agent.release()
            asker.join(30)
    out, err = capsys.readouterr()
    assert result["code"] == cli.EXIT_CONNECTION, err
    assert "SHUTTING_DOWN: the server stopped" in err
    assert out.startswith("echo: ") and out.endswith("\n")           # the shell prompt gets its own line


def test_text_history_marks_how_an_answer_ended(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A cancelled answer is not an anonymous empty '[4] assistant' (issue 16)."""
    with ServerThread(tmp_path) as srv:
        code, out, err = run(srv, capsys, "ask", "--new", "first", "--json")
        assert code == 0 and out, err
        sid = json.loads(out)["session_id"]
        store = srv.srv.store
        srv.run(store.append(sid, "user", "stop that"))
        srv.run(store.append(sid, "assistant", "", metadata={"partial": True, "finish_reason": "cancelled"}))
        srv.run(store.append(sid, "user", "again"))
        srv.run(store.append(sid, "assistant", "half", metadata={"partial": True, "error": "LLM_ERROR"}))
        code, out, err = run(srv, capsys, "history", "--session", sid)
    assert code == 0, err
    assert "] assistant" in out and "(cancelled, partial)\n(no answer)\n" in out
    assert "(error LLM_ERROR, partial)\nhalf\n" in out


def test_message_marks() -> None:
    assert cli.message_marks({}) == []
    assert cli.message_marks({"finish_reason": "stop", "usage": {}}) == []
    assert cli.message_marks({"finish_reason": "interrupted", "partial": True}) == ["interrupted", "partial"]
    assert cli.message_marks({"error": {"code": "LLM_TIMEOUT", "message": "x"}, "truncated": True}) == [
        "error LLM_TIMEOUT", "truncated"]


def test_trash_restore_and_purge(srv: ServerThread, capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(srv, capsys, "ask", "--new", "a session for the trash", "--json")
    assert code == 0, err
    sid = json.loads(out)["session_id"]
    code, out, err = run(srv, capsys, "purge", "s_20260101_000000000000")
    assert code == 5 and "NOT_FOUND" in err
    code, out, err = run(srv, capsys, "delete", sid)
    assert code == 0 and out.startswith(f"deleted {sid}")
    code, out, err = run(srv, capsys, "sessions", "--deleted", "--json")
    assert code == 0 and [s["session_id"] for s in json.loads(out)["sessions"]] == [sid]
    code, out, err = run(srv, capsys, "sessions", "--json")
    assert sid not in out
    code, out, err = run(srv, capsys, "restore", sid)
    assert code == 0 and out.startswith(f"restored {sid}")
    code, out, err = run(srv, capsys, "sessions", "--json")
    assert sid in out and sid not in run(srv, capsys, "sessions", "--deleted")[1]
    code, out, err = run(srv, capsys, "purge", sid)                   # a live one is deleted, then purged
    assert code == 0 and out == f"purged {sid}\n"
    code, out, err = run(srv, capsys, "sessions", "--json")
    assert sid not in out
    code, out, err = run(srv, capsys, "restore", sid)
    assert code == 5 and "NOT_FOUND" in err


def test_client_errors_take_protocol_or_client_codes_only():
    from client.errors import ClientCode, ClientError
    from protocol import ErrorCode
    assert ClientError(ErrorCode.NOT_FOUND, "gone").code is ErrorCode.NOT_FOUND
    assert ClientError(ClientCode.TIMEOUT, "slow").is_connection_error
    with pytest.raises(TypeError):
        ClientError("NOT_FOUND", "a bare string")


def test_a_fresh_server_lists_nothing_and_ask_new_leaves_no_empty_sessions(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture) -> None:
    """Listing never creates a session, and a session is made by its first message: `ask --new`
    whose message is refused leaves nothing behind, however often it is run."""
    with ServerThread(tmp_path, max_text_chars=50) as st:
        for _ in range(2):
            code, out, err = run(st, capsys, "sessions", "--json")
            assert code == 0 and json.loads(out) == {"sessions": []}, err
        for _ in range(2):                        # no answer: the server refuses the message
            code, out, err = run(st, capsys, "ask", "--new", "x" * 51)
            assert code == cli.EXIT_REQUEST and "INVALID_MESSAGE" in err
        code, out, _ = run(st, capsys, "sessions", "--json")
        assert json.loads(out) == {"sessions": []}
        ids = []
        for text in ("first topic", "second topic"):
            code, out, err = run(st, capsys, "ask", "--new", text, "--json")
            assert code == 0, err
            ids.append(json.loads(out)["session_id"])
        code, out, _ = run(st, capsys, "sessions", "--json")
        listed = json.loads(out)["sessions"]
        assert [s["session_id"] for s in listed] == ids[::-1] and all(s["message_count"] == 2 for s in listed)
        code, out, err = run(st, capsys, "ask", "no flag: the newest session", "--json")
        assert code == 0 and json.loads(out)["session_id"] == ids[1]


def test_tool_arguments_print_as_written(srv: ServerThread, capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(srv, capsys, "ask", "--new", "!tool 端口 8080", "--json")
    assert code == 0, err
    sid = json.loads(out)["session_id"]
    code, out, err = run(srv, capsys, "ask", "--session", sid, "!tool 磁盘")
    assert code == 0 and '[tool fake_tool {"q": "磁盘"}]\n' in err
    code, out, err = run(srv, capsys, "history", "--session", sid)
    assert code == 0, err
    assert '  tool fake_tool {"q": "端口 8080"} -> success' in out and '{"q": "磁盘"}' in out and "\\u" not in out


def test_a_user_without_sessions_is_told_how_to_start_one_and_a_wrong_model_creates_none(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with ServerThread(tmp_path) as st:
        for command in (["history"], ["export"], ["prompt"]):
            code, out, err = run(st, capsys, *command)
            assert code == cli.EXIT_REQUEST and out == ""
            assert err == ('nplt-client: NOT_FOUND: no current session, you have none yet: '
                           'nplt-client ask "your message" starts one\n')
        for flags in (["--new"], [], ["--new", "--system", "be brief"]):
            code, out, err = run(st, capsys, "ask", *flags, "--model", "nope", "hi")
            assert code == cli.EXIT_REQUEST and out == ""
            assert err == "nplt-client: UNKNOWN_MODEL: model 'nope' is not offered (available: echo, echo-large)\n"
        code, out, err = run(st, capsys, "sessions", "--json")
        assert code == 0 and json.loads(out) == {"sessions": []}, err      # nothing was created or sent
        code, out, err = run(st, capsys, "ask", "--new", "--model", "echo-large", "hi", "--json")
        assert code == 0 and json.loads(out)["message"]["content"] == "echo: hi", err


def test_kb_upload_of_a_missing_file_names_it_once(srv: ServerThread, capsys: pytest.CaptureFixture,
                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(srv, capsys, "kb", "upload", "nothere.md")
    assert code == cli.EXIT_REQUEST and out == ""
    assert err == "nplt-client: NOT_A_FILE: nothere.md: not a readable file\n"


def test_ask_in_a_session_that_does_not_exist_fails_for_a_user_without_sessions(tmp_path: Path,
                                                                                capsys: pytest.CaptureFixture) -> None:
    with ServerThread(tmp_path) as st:                 # (HELLO attaches to none: nothing to fall back on)
        code, out, err = run(st, capsys, "ask", "--session", "s_20260101_000000000000", "hi")
        assert code == cli.EXIT_REQUEST and "NOT_FOUND" in err and out == ""
        code, out, _ = run(st, capsys, "sessions", "--json")
        assert code == 0 and json.loads(out)["sessions"] == []          # no session was made for it


def test_a_reader_that_leaves_cancels_the_answer(tmp_path: Path) -> None:
    """`nplt-client ask ... | head -1`: once stdout's reader is gone the turn is cancelled, not generated on."""
    import asyncio

    from client.config import ClientConfig
    from client.main import build_parser
    from testkit.server import poll

    class Gone(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")
    with ServerThread(tmp_path) as st:
        args = build_parser().parse_args(["--host", st.addr[0], "--port", str(st.addr[1]), "ask", "!block long answer"])
        with pytest.raises(BrokenPipeError):
            asyncio.run(cli.run_command(args, ClientConfig.load(args), Gone(), io.StringIO()))
        store = st.srv.services.store

        async def ended() -> str | None:
            [rec] = (await store.list("local"))[0]
            last = (await store.messages(rec.session_id))[-1]
            return last.metadata.get("finish_reason") if last.role == "assistant" else None
        assert st.run(poll(ended)) == "cancelled"          # not left generating until the agent finishes
