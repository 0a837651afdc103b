"""Review s32 of the CLI, against real servers: an ``ask`` stopped by SIGTERM or SIGHUP cancels its
turn first; a stdout or stdin that cannot be used (closed, full, an encoding without Chinese) is a
clean ``WRITE_FAILED``/``USAGE`` exit 2 that also cancels the turn; the "could not be cancelled"
line names its reason; ``kb download`` of a name longer than a file name can be; ``--json`` for
delete, restore, purge, rename, clear, memory forget, kb delete and kb download."""
from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from client import cli, kb_cli
from client.config import ClientConfig
from client.connection import Client
from client.main import build_parser, main
from client_testlib import ServerThread
from testkit.server import V3Client, poll

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kb_wire"))   # for kbwire
from kbwire import raw_upload  # noqa: E402

DEADLINE = 30.0


@pytest.fixture
def st(tmp_path: Path) -> Iterator[ServerThread]:
    with ServerThread(tmp_path / "server") as server:
        try:
            yield server
        finally:
            server.srv.agent.release()          # a "!block" turn a failed test left waiting


def run(st: ServerThread, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """main() in-process; (exit code, stdout, stderr)."""
    code = main(["--host", st.addr[0], "--port", str(st.addr[1]), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def spawn(st: ServerThread, home: Path, *args: str, shell: str = "", env: dict[str, str] | None = None,
          **popen: Any) -> subprocess.Popen:
    """``nplt-client ARGS`` as a real process (``shell``: redirections for ``sh``, e.g. ``>&-``)."""
    home.mkdir(exist_ok=True)
    environ = {**os.environ, "NPLT_CLIENT_HOST": st.addr[0], "NPLT_CLIENT_PORT": str(st.addr[1]),
               "HOME": str(home), **(env or {})}
    command = [sys.executable, "-m", "client.main", *args]
    if shell:
        command = ["sh", "-c", f'exec "$0" "$@" {shell}', *command]
    return subprocess.Popen(command, env=environ, stdout=popen.pop("stdout", subprocess.PIPE),
                            stderr=subprocess.PIPE, **popen)


def last_answer(st: ServerThread, capsys: pytest.CaptureFixture) -> dict[str, Any]:
    """The newest session's last stored message, polled (with a deadline) until it is the assistant's
    answer (a turn stored once it ends)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        code, out, err = run(st, capsys, "history", "--json")
        assert code == 0, err
        messages = json.loads(out)["messages"]
        if messages and messages[-1]["role"] == "assistant":
            return messages[-1]
        assert time.monotonic() < deadline, f"no stored answer: {messages}"
        time.sleep(0.02)       # poll interval of a condition with a deadline, not a synchronisation


# -- 1. SIGTERM / SIGHUP cancel the turn ----------------------------------------------------------------
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_stops_ask_after_cancelling_its_turn(st: ServerThread, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture, signum: int, code: int) -> None:
    """`timeout 2 nplt-client ask ...` (SIGTERM) used to kill the process with no cleanup: the server
    went on generating the whole answer and stored it complete."""
    proc = spawn(st, tmp_path / "home", "ask", "--new", "!block until a signal")
    assert proc.stdout is not None and proc.stderr is not None
    answer = "echo: !block until a signal"
    first = answer[:-(-len(answer) // 3)]    # EchoAgent's first delta (of 3), streamed before it blocks
    assert proc.stdout.read(len(first)).decode() == first
    st.run(st.srv.agent.wait_blocked(1))
    proc.send_signal(signum)
    assert proc.wait(DEADLINE) == code, proc.stderr.read().decode()
    err = proc.stderr.read().decode()
    assert err.endswith(f"nplt-client: TERMINATED: {signal.Signals(signum).name}\n"), err
    assert "could not be cancelled" not in err
    answer = last_answer(st, capsys)
    assert answer["metadata"]["finish_reason"] == "cancelled" and answer["metadata"]["partial"] is True
    assert answer["content"] == first
    assert st.srv.agent.completions == 0       # the answer was never generated to its end


# -- 2. stdout / stdin that cannot be used ------------------------------------------------------------
def test_ask_with_a_closed_stdout_fails_before_sending(st: ServerThread, tmp_path: Path) -> None:
    proc = spawn(st, tmp_path / "home", "ask", "--new", "to nobody", shell=">&-", stdout=subprocess.DEVNULL)
    assert proc.wait(DEADLINE) == cli.EXIT_USAGE
    assert proc.stderr is not None and proc.stderr.read().decode() == "nplt-client: WRITE_FAILED: stdout: closed\n"
    assert st.srv.agent.started == 0           # no turn generated for nobody


def test_ask_into_a_full_disk_cancels_its_turn(st: ServerThread, tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    proc = spawn(st, tmp_path / "home", "ask", "--new", "!block into a full disk", shell="> /dev/full",
                 stdout=subprocess.DEVNULL)
    assert proc.wait(DEADLINE) == cli.EXIT_USAGE
    assert proc.stderr is not None
    assert proc.stderr.read().decode() == "nplt-client: WRITE_FAILED: stdout: No space left on device\n"
    answer = last_answer(st, capsys)
    assert answer["metadata"]["finish_reason"] == "cancelled" and answer["metadata"]["partial"] is True
    assert st.srv.agent.completions == 0


@pytest.mark.parametrize("json_flag", [(), ("--json",)])
def test_other_commands_into_a_full_disk_or_closed_stdout(st: ServerThread, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture, json_flag: tuple) -> None:
    assert run(st, capsys, "ask", "--new", "a session to list")[0] == 0
    for shell, reason in ((">/dev/full", "No space left on device"), (">&-", "closed")):
        proc = spawn(st, tmp_path / "home", "sessions", *json_flag, shell=shell, stdout=subprocess.DEVNULL)
        assert proc.wait(DEADLINE) == cli.EXIT_USAGE, shell
        assert proc.stderr is not None and proc.stderr.read().decode() == f"nplt-client: WRITE_FAILED: stdout: {reason}\n"


def test_an_output_encoding_without_chinese_escapes_instead_of_failing(st: ServerThread, tmp_path: Path) -> None:
    """PYTHONIOENCODING=latin-1 (or an ASCII locale): text as backslash escapes, JSON as \\uXXXX (valid,
    lossless); before, a UnicodeEncodeError traceback, exit 1."""
    latin = {"PYTHONIOENCODING": "latin-1"}
    proc = spawn(st, tmp_path / "home", "ask", "--new", "端口 🚀 café", env=latin)
    out, err = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == 0, err
    assert out == "echo: \\u7aef\\u53e3 \\U0001f680 café\n".encode("latin-1")
    proc = spawn(st, tmp_path / "home", "ask", "端口 🚀 café", "--json", env=latin)
    out, err = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == 0, err
    assert out.isascii() and json.loads(out)["message"]["content"] == "echo: 端口 🚀 café"
    proc = spawn(st, tmp_path / "home", "sessions", "--json", env=latin)
    out, err = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == 0 and out.isascii(), err
    assert json.loads(out)["sessions"][0]["title"].startswith("端口")


def test_ask_dash_with_a_closed_stdin_is_a_usage_error(st: ServerThread, tmp_path: Path) -> None:
    proc = spawn(st, tmp_path / "home", "ask", "-", shell="<&-")
    out, err = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == cli.EXIT_USAGE and out == b""
    assert err.decode() == ("nplt-client: USAGE: stdin is closed: give the text as an argument, "
                            "or pipe it in for -\n")
    assert st.srv.agent.started == 0


# -- 3. the reason a cancel failed ------------------------------------------------------------------
async def test_a_cancel_without_reply_says_why_and_that_the_answer_may_go_on(
        server: tuple[Any, tuple[str, int]], echo: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """It printed "the turn could not be cancelled: " and nothing more (str(TimeoutError()) is "")."""
    _, (host, port) = server
    never = asyncio.Event()

    async def no_reply(self: Client, **_: Any) -> None:
        await never.wait()
    monkeypatch.setattr(Client, "chat_cancel", no_reply)
    monkeypatch.setattr(cli, "CANCEL_WAIT_S", 0.2)
    args = build_parser().parse_args(["--host", host, "--port", str(port), "ask", "--new", "!block me"])
    out, err = io.StringIO(), io.StringIO()
    task = asyncio.create_task(cli.run_command(args, ClientConfig.load(args), out, err))
    try:
        await poll(out.getvalue, timeout=DEADLINE, what="the first delta")   # the CLI follows the turn
        await echo.wait_blocked(1)
        task.cancel()                                       # as Ctrl+C or SIGTERM do
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        echo.release()
    assert err.getvalue() == ("nplt-client: the turn could not be cancelled (no reply within 0.2 s): "
                              "the answer may still be generating on the server\n")


def test_cancel_failed_keeps_a_reason_given() -> None:
    from client.errors import ClientError
    from protocol import ErrorCode
    text = cli.cancel_failed(ClientError(ErrorCode.INVALID_MESSAGE, "bad turn id"))
    assert text == ("the turn could not be cancelled (INVALID_MESSAGE: bad turn id): "
                    "the answer may still be generating on the server")


# -- 4. a document name longer than a file name --------------------------------------------------------
LONG = "很长的运维手册" * 35 + ".md"       # 248 characters, 738 UTF-8 bytes: the server takes it
DATA = b"# Runbook\n\nRestart the exporter on port 9100.\n"


def upload_named(st: ServerThread, name: str, data: bytes) -> str:
    async def upload() -> str:
        c = await V3Client.connect(st.addr)
        try:
            return (await raw_upload(c, name, data))["document"]["doc_id"]
        finally:
            await c.close()
    return st.run(upload())


def test_kb_download_of_a_name_too_long_for_a_file_name(st: ServerThread, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: `Path(dest).exists()` raised ENAMETOOLONG outside any handler, a traceback, exit 1."""
    doc_id = upload_named(st, LONG, DATA)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    code, out, err = run(st, capsys, "kb", "download", doc_id)
    assert code == 0, err
    [saved] = list(here.iterdir())
    assert saved.read_bytes() == DATA
    assert saved.name.endswith(f"-{doc_id}.md") and saved.name.startswith("很长的运维手册")
    assert len(saved.name.encode()) + len(".part.json") <= kb_cli.FILE_NAME_MAX_BYTES
    assert out.startswith(f"{saved.name}  {len(DATA)} bytes  md5 ")
    assert err == (f"nplt-client: the document's name is too long for a file name ({len(LONG.encode())} "
                   f"bytes): saving it as {saved.name} (-o PATH names another file)\n")
    code, out, err = run(st, capsys, "kb", "download", doc_id)          # the same name: not replaced
    assert code == cli.EXIT_USAGE and f"FILE_EXISTS: {saved.name} exists" in err
    folder = tmp_path / "folder"
    folder.mkdir()
    code, out, err = run(st, capsys, "kb", "download", doc_id, "-o", str(folder), "--json")   # -o DIR
    assert code == 0, err
    assert json.loads(out)["path"] == str(folder / saved.name) and (folder / saved.name).read_bytes() == DATA
    too_long = str(tmp_path / ("长" * 100 + ".md"))                         # a name given with -o: refused
    code, out, err = run(st, capsys, "kb", "download", doc_id, "-o", too_long)
    assert code == cli.EXIT_USAGE and out == ""
    assert err.startswith(f"nplt-client: WRITE_FAILED: cannot write {too_long}: File name too long")
    assert err.endswith("(the name is too long for this file system: choose a shorter one)\n")


def test_local_name_keeps_short_names_and_cuts_at_a_character() -> None:
    class Doc:
        def __init__(self, name: str) -> None:
            self.name, self.doc_id = name, "0123456789abcdef01234567"
    assert kb_cli.local_name(Doc("notes.md")) == ("notes.md", False)
    assert kb_cli.local_name(Doc("../../etc/passwd")) == ("passwd", False)
    name, cut = kb_cli.local_name(Doc("é" * 200 + ".md"))      # 217 bytes left: the 109th "é" is cut off whole
    assert cut and name == "é" * 108 + "-0123456789abcdef01234567.md"
    assert len(name.encode()) <= kb_cli.FILE_NAME_MAX_BYTES - len(kb_cli.PART_SUFFIX)
    name, cut = kb_cli.local_name(Doc("x" * 300))               # no extension
    assert cut and name == "x" * 220 + "-0123456789abcdef01234567"


# -- 5. --json for every command that changes something --------------------------------------------------
def test_json_of_the_commands_that_change_something(st: ServerThread, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = run(st, capsys, "ask", "--new", "one", "--json")
    assert code == 0, err
    sid = json.loads(out)["session_id"]
    code, out, err = run(st, capsys, "rename", sid, "新的标题", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) == {"session"} and doc["session"]["session_id"] == sid and doc["session"]["title"] == "新的标题"
    code, out, err = run(st, capsys, "clear", "--session", sid, "--json")
    assert code == 0 and json.loads(out) == {"session_id": sid, "cleared": 2, "purged": False}, err
    run(st, capsys, "ask", "--session", sid, "two")
    code, out, err = run(st, capsys, "clear", "--session", sid, "--purge", "--json")
    assert code == 0 and json.loads(out) == {"session_id": sid, "cleared": 2, "purged": True}, err
    code, out, err = run(st, capsys, "delete", sid, "--json")
    assert code == 0 and json.loads(out) == {"session_id": sid}, err
    code, out, err = run(st, capsys, "restore", sid, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) == {"session"} and doc["session"]["session_id"] == sid and doc["session"]["title"] == "新的标题"
    code, out, err = run(st, capsys, "purge", sid, "--json")
    assert code == 0 and json.loads(out) == {"session_id": sid}, err
    doc_id = upload_named(st, "notes.md", DATA)
    monkeypatch.chdir(tmp_path)
    code, out, err = run(st, capsys, "kb", "download", doc_id, "--json")
    assert code == 0, err
    assert json.loads(out) == {"path": "notes.md", "doc_id": doc_id, "name": "notes.md", "size": len(DATA),
                               "md5": __import__("hashlib").md5(DATA).hexdigest()}
    code, out, err = run(st, capsys, "kb", "delete", "notes.md", "--json")
    assert code == 0 and json.loads(out) == {"doc_id": doc_id}, err


def test_memory_forget_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with ServerThread(tmp_path, memory="auto") as st:
        code, _, err = run(st, capsys, "ask", "The prod DB host is db-prod-42.")
        assert code == 0, err
        um = st.srv.services.memory.user_memory
        [item] = st.run(um.list("local"))          # learned before the turn ended (TurnRunner: learn_now)
        code, out, err = run(st, capsys, "memory", "forget", item.id, "--json")
        assert code == 0 and json.loads(out) == {"item_id": item.id}, err


def test_empty_listings_say_so_on_stderr_and_keep_stdout_empty(st: ServerThread, capsys) -> None:
    """``sessions``, ``sessions --deleted`` and ``memory list`` with nothing to list print nothing on
    stdout (scripts) and say why on stderr (before: nothing at all)."""
    assert run(st, capsys, "sessions") == (0, "", "nplt-client: no sessions yet (nplt-client ask starts one)\n")
    assert run(st, capsys, "sessions", "--deleted") == (0, "", "nplt-client: the trash is empty\n")
    code, out, _ = run(st, capsys, "sessions", "--json")
    assert code == 0 and json.loads(out) == {"sessions": []}


def test_an_empty_long_term_memory_says_so_on_stderr(tmp_path: Path, capsys) -> None:
    with ServerThread(tmp_path / "srv", memory="auto") as srv:
        assert run(srv, capsys, "memory", "list") == (0, "", "nplt-client: nothing remembered yet\n")
