"""Review s33 of the CLI, against real servers: ``export --output`` is atomic (a full disk or a file
size limit leaves the old file as it was, and no temporary file), follows the folder rules of
``kb download -o`` and writes through a FIFO; every ``ClientConfig`` setting has its
``NPLT_CLIENT_*`` variable and an unknown one is a CONFIG_ERROR; ``--port 0`` is refused; a blank
``search`` and a negative ``history --before`` are local usage errors; ``history`` prints a failed
turn's error line (``(after N attempts)`` once)."""
from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from client import cli, files
from client.config import ClientConfig, ClientConfigError, env_variables
from client.main import main
from client.turn_errors import error_line, with_attempts
from client_testlib import ServerThread, prefill
from protocol import ErrorCode
from server.agent.base import AgentError
from testkit.echo_agent import EchoAgent

DEADLINE = 30.0
OLD = "my important notes: keep me\n"
RETRIED = "cannot connect to the model endpoint llm.example (after 3 attempts)"


class RetryingAgent(EchoAgent):
    """EchoAgent whose ``!retried`` turn fails as the model endpoint's errors do: the message already
    ends with ``(after 3 attempts)`` and the error carries ``attempts = 3``."""

    async def run_turn(self, req: Any, sink: Any) -> Any:
        if req.user_message.content.startswith("!retried"):
            error = AgentError(ErrorCode.LLM_ERROR, RETRIED)
            error.attempts = 3
            raise error
        return await super().run_turn(req, sink)


@pytest.fixture
def st(tmp_path: Path) -> Iterator[ServerThread]:
    with ServerThread(tmp_path / "server", agent_factory=RetryingAgent) as server:
        yield server


def run(st: ServerThread, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(["--host", st.addr[0], "--port", str(st.addr[1]), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def session_with_history(st: ServerThread, capsys: pytest.CaptureFixture, n: int = 0) -> str:
    code, out, err = run(st, capsys, "ask", "--new", "export me", "--json")
    assert code == 0, err
    sid = json.loads(out)["session_id"]
    if n:
        st.run(prefill(st.srv, sid, n, start=2))
    return sid


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(files.TEMP_PREFIX))


# -- 1. an export that cannot be written whole leaves the old file -----------------------------------------
def test_an_export_over_a_file_size_limit_keeps_the_old_file(st: ServerThread, capsys: pytest.CaptureFixture,
                                                            tmp_path: Path) -> None:
    """A real process under RLIMIT_FSIZE (Python ignores SIGXFSZ: the write fails with EFBIG, as a full
    disk fails with ENOSPC). Before, the file was truncated, then cut at the limit: the notes were gone."""
    sid = session_with_history(st, capsys, 400)
    folder = tmp_path / "out"
    folder.mkdir()
    notes = folder / "notes.md"
    notes.write_text(OLD)
    limit = 8192

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    env = {**os.environ, "NPLT_CLIENT_HOST": st.addr[0], "NPLT_CLIENT_PORT": str(st.addr[1]),
           "HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "client.main", "export", "--session", sid, "--output", str(notes)],
                          env=env, capture_output=True, timeout=DEADLINE, preexec_fn=limited)
    assert proc.returncode == cli.EXIT_USAGE, proc.stderr
    assert proc.stderr.decode() == f"nplt-client: WRITE_FAILED: cannot write {notes}: File too large\n"
    assert notes.read_text() == OLD and leftovers(folder) == []
    # the same export without the limit replaces it, whole
    code, _, err = run(st, capsys, "export", "--session", sid, "--output", str(notes))
    assert code == 0, err
    assert len(notes.read_bytes()) > limit and "message number 401" in notes.read_text()
    assert leftovers(folder) == []


def test_an_export_onto_a_full_disk_keeps_the_old_file_and_leaves_no_temporary_file(
        st: ServerThread, capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sid = session_with_history(st, capsys, 40)
    notes = tmp_path / "notes.md"
    notes.write_text(OLD)
    os.chmod(notes, 0o640)

    def full_disk(fd: int, data: bytes) -> None:
        os.write(fd, data[:100])          # some bytes go out, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with monkeypatch.context() as m:
        m.setattr(files, "_write_all", full_disk)
        code, out, err = run(st, capsys, "export", "--session", sid, "--output", str(notes))
        assert (code, out) == (cli.EXIT_USAGE, "")
        assert err == f"nplt-client: WRITE_FAILED: cannot write {notes}: No space left on device\n"
        assert notes.read_text() == OLD and leftovers(tmp_path) == []
        # no file before: none after
        code, _, err = run(st, capsys, "export", "--session", sid, "--output", str(tmp_path / "new.md"))
        assert code == cli.EXIT_USAGE and not (tmp_path / "new.md").exists() and leftovers(tmp_path) == []
    code, _, err = run(st, capsys, "export", "--session", sid, "--output", str(notes))
    assert code == 0 and "message number 41" in notes.read_text()
    assert oct(notes.stat().st_mode & 0o777) == oct(0o640)          # the replaced file's permissions kept


# -- 2. folders, a trailing separator, FIFOs, stdout ----------------------------------------------------
def test_export_output_follows_the_folder_rules_of_kb_download(st: ServerThread, capsys: pytest.CaptureFixture,
                                                              tmp_path: Path) -> None:
    sid = session_with_history(st, capsys)
    missing = tmp_path / "nosuchdir"
    code, out, err = run(st, capsys, "export", "--session", sid, "--output", f"{missing}/")
    assert (code, out) == (cli.EXIT_USAGE, "")
    assert err == f"nplt-client: WRITE_FAILED: cannot write {missing}/: not a folder\n"
    assert not missing.exists()                   # before: a FILE named nosuchdir, exit 0
    folder = tmp_path / "exports"
    folder.mkdir()
    for given, fmt, name in ((str(folder), "markdown", f"nplt-{sid}.md"), (f"{folder}/", "json", f"nplt-{sid}.json")):
        code, _, err = run(st, capsys, "export", "--session", sid, "--format", fmt, "--output", given)
        assert code == 0, err
        assert "export me" in (folder / name).read_text()
    (folder / f"nplt-{sid}.md").unlink()
    (folder / f"nplt-{sid}.md").mkdir()           # a folder where the file would go
    code, _, err = run(st, capsys, "export", "--session", sid, "--output", str(folder))
    assert code == cli.EXIT_USAGE
    assert err == f"nplt-client: WRITE_FAILED: cannot write {folder / f'nplt-{sid}.md'}: it is a folder\n"
    code, out, _ = run(st, capsys, "export", "--session", sid, "--output", "-")     # '-' is stdout
    assert code == 0 and "export me" in out


def test_export_output_writes_through_a_fifo(st: ServerThread, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    sid = session_with_history(st, capsys)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    try:
        code, _, err = run(st, capsys, "export", "--session", sid, "--output", str(fifo))
    finally:
        reader.join(DEADLINE)
        if reader.is_alive():       # the export never opened the FIFO: open it for writing so the reader ends
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            reader.join(DEADLINE)
    assert code == 0, err
    assert b"export me" in got[0] and fifo.is_fifo() and leftovers(tmp_path) == []


# -- 3. NPLT_CLIENT_* variables ------------------------------------------------------------------------------
def test_every_setting_has_its_variable_and_an_unknown_one_is_a_config_error(
        st: ServerThread, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    names = set(env_variables())
    for setting in ("CONNECT_TIMEOUT_S", "RECONNECT_INITIAL_S", "RECONNECT_MAX_S", "EVENT_QUEUE_SIZE",
                    "SIDEBAR_MAX_SESSIONS", "HOST", "PORT", "TLS", "TLS_CA_FILE", "TLS_INSECURE"):
        assert "NPLT_CLIENT_" + setting in names
    cfg = ClientConfig.load(None, {"NPLT_CLIENT_CONNECT_TIMEOUT_S": "3.5", "NPLT_CLIENT_RECONNECT_INITIAL_S": "0.5",
                                   "NPLT_CLIENT_RECONNECT_MAX_S": "4", "NPLT_CLIENT_EVENT_QUEUE_SIZE": "64",
                                   "NPLT_CLIENT_SIDEBAR_MAX_SESSIONS": "7", "NPLT_CLIENT_TLS_INSECURE": "1"})
    assert (cfg.connect_timeout_s, cfg.reconnect_initial_s, cfg.reconnect_max_s, cfg.event_queue_size,
            cfg.sidebar_max_sessions, cfg.tls.insecure) == (3.5, 0.5, 4.0, 64, 7, True)
    with pytest.raises(ClientConfigError) as info:
        ClientConfig.load(None, {"NPLT_CLIENT_EVENT_QUEUE_SIZE": "8"})       # below the range: named
    assert info.value.path == "environment.event_queue_size"
    monkeypatch.setenv("NPLT_CLIENT_PROT", "1234")                          # a typo: no longer ignored
    code, out, err = run(st, capsys, "sessions")
    assert (code, out) == (cli.EXIT_USAGE, "")
    assert err == ("nplt-client: CONFIG_ERROR: NPLT_CLIENT_PROT: unknown variable, no client setting has this "
                   "name: did you mean NPLT_CLIENT_PORT?\n")


def test_port_0_is_a_config_error(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["--port", "0", "sessions"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err == "nplt-client: CONFIG_ERROR: flags.port: expected a value in 1..65535, got 0\n"
    monkeypatch.setenv("NPLT_CLIENT_PORT", "0")
    assert main(["sessions"]) == cli.EXIT_USAGE
    assert "CONFIG_ERROR: environment.port" in capsys.readouterr().err


# -- 4. usage errors found locally -----------------------------------------------------------------------------
def test_a_blank_search_and_a_negative_cursor_are_usage_errors(st: ServerThread,
                                                              capsys: pytest.CaptureFixture) -> None:
    for query in ("", "   "):
        code, out, err = run(st, capsys, "search", query)
        assert (code, out, err) == (cli.EXIT_USAGE, "",
                                    "nplt-client: USAGE: the query is empty: give the words to look for\n")
    for before in ("-5", "0"):
        with pytest.raises(SystemExit) as info:
            run(st, capsys, "history", "--before", before)
        assert info.value.code == cli.EXIT_USAGE
        assert f"expected a positive integer, got '{before}'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sessions", "--help"])
    assert "--limit N " in capsys.readouterr().out


# -- 5. the error line of a failed turn in history -----------------------------------------------------------
def test_history_prints_the_error_line_of_a_failed_turn_once(st: ServerThread, capsys: pytest.CaptureFixture) -> None:
    code, _, err = run(st, capsys, "ask", "--new", "!retried please")
    assert code == cli.EXIT_TURN, err
    code, out, err = run(st, capsys, "history")
    assert code == 0, err
    assert f"Error LLM_ERROR: {RETRIED}\n" in out and out.count("after 3 attempts") == 1
    assert "(no answer)" not in out
    code, _, _ = run(st, capsys, "ask", "!fail half way")            # partial text, then the error
    code, out, _ = run(st, capsys, "history", "--json")
    partial = json.loads(out)["messages"][-1]["content"]
    assert partial and partial.startswith("echo: ")
    code, out, _ = run(st, capsys, "history")
    assert out.endswith(f"(error LLM_ERROR, partial)\n{partial}\nError LLM_ERROR: scripted failure after "
                        "partial output\n\n")


def test_with_attempts_never_says_it_twice() -> None:
    assert with_attempts("down", 3) == "down (after 3 attempts)"
    assert with_attempts(RETRIED, 3) == RETRIED
    assert with_attempts("down", 1) == "down" and with_attempts("down", None) == "down"
    assert error_line({"error": "LLM_ERROR", "error_message": RETRIED, "attempts": 3}) == f"Error LLM_ERROR: {RETRIED}"
    assert error_line({"error": "LLM_ERROR", "error_message": "x", "attempts": 2}) == \
        "Error LLM_ERROR: x (after 2 attempts)"
    assert error_line({"finish_reason": "stop"}) is None
