"""Review s32 of the CLI's stops, against a real server over loopback, as real processes:

- SIGTERM stops ``nplt-client`` at once (exit 143) even while a worker thread is blocked: ``ask -``
  reading a stdin nobody closes, ``kb download -o FIFO`` waiting for the FIFO's reader, ``kb download
  -o -`` writing into a stdout nobody reads; a main thread blocked writing into such a stdout ends
  at ``client.main.STOP_DEADLINE_S``. Before, the process cancelled its task and then waited
  forever for those threads (asyncio.run's close, the interpreter's exit): only SIGKILL ended it.
- ``kb download -o -`` with stdout closed (``>&-``, ``<&- >&-``) is ``WRITE_FAILED: stdout: closed``
  before any byte is fetched; before, the bytes went into whatever took descriptor 1 (the event
  loop's epoll: "Invalid argument"; its self-pipe socket: exit 0, "downloaded").
- ``kb download -o - | head`` stops quietly with exit 0, as the docs say (before: WRITE_FAILED, exit 2).

Readiness is read from /proc (Linux): the SIGTERM handler installed, the process's threads asleep,
a pipe full; never a fixed sleep.
"""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from protocol import MsgType
from server.handlers import dispatch

from client import main as client_main
from client_testlib import ServerThread
from testkit.server import V3Client, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kb_wire"))   # for kbwire
from kbwire import raw_upload  # noqa: E402

DEADLINE = 30.0
#: a stop that does not wait for blocked threads ends well before the deadline that would end it anyway
STOP_WITHIN = client_main.STOP_DEADLINE_S - 1.0
BIG = b"".join(b"line %06d of a runbook that is longer than a pipe holds\n" % i for i in range(6000))  # ~340 KB


@pytest.fixture
def st(tmp_path: Path) -> Iterator[ServerThread]:
    with ServerThread(tmp_path / "server") as server:
        yield server


class Seen:
    """A request type's handler on the server: ``started`` when one began, ``answered`` when one ended."""

    def __init__(self) -> None:
        self.started, self.answered = threading.Event(), threading.Event()


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> dict[MsgType, Seen]:
    """KB_LIST and KB_DOWNLOAD as the server handles them (``Seen``)."""
    seen = {t: Seen() for t in (MsgType.KB_LIST, MsgType.KB_DOWNLOAD)}
    for t, marks in seen.items():
        def wrapped(ctx: Any, req: Any, _handler: Any = dispatch.HANDLERS[t], _marks: Seen = marks) -> Any:
            async def run() -> Any:
                _marks.started.set()
                try:
                    return await _handler(ctx, req)
                finally:
                    _marks.answered.set()
            return run()
        monkeypatch.setitem(dispatch.HANDLERS, t, wrapped)
    return seen


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen]]:
    """The processes a test started: killed at its end if still running (a hang on the old code)."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(DEADLINE)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def spawn(st: ServerThread, home: Path, procs: list[subprocess.Popen], *args: str, shell: str = "",
          **popen: Any) -> subprocess.Popen:
    """``nplt-client ARGS`` as a real process (``shell``: redirections for ``sh``, e.g. ``>&-``)."""
    home.mkdir(exist_ok=True)
    environ = {**os.environ, "NPLT_CLIENT_HOST": st.addr[0], "NPLT_CLIENT_PORT": str(st.addr[1]),
               "HOME": str(home), "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "client.main", *args]
    if shell:
        command = ["sh", "-c", f'exec "$0" "$@" {shell}', *command]
    proc = subprocess.Popen(command, env=environ, stdout=popen.pop("stdout", subprocess.PIPE),
                            stderr=subprocess.PIPE, **popen)
    procs.append(proc)
    return proc


def upload(st: ServerThread, name: str, data: bytes) -> str:
    async def run() -> str:
        c = await V3Client.connect(st.addr)
        try:
            return (await raw_upload(c, name, data))["document"]["doc_id"]
        finally:
            await c.close()
    return st.run(run())




def catches_sigterm(pid: int) -> bool:
    """Whether the process has its own SIGTERM handler yet (before it, SIGTERM kills it outright)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


def idle(pid: int, min_threads: int = 1) -> bool:
    """Whether each of the process's threads (at least ``min_threads``) is asleep (blocked in a call)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            states.append(task.joinpath("stat").read_text().rpartition(")")[2].split()[0])
        except (FileNotFoundError, ProcessLookupError):      # a thread that just ended
            continue
    return len(states) >= min_threads and all(s == "S" for s in states)


def blocked_writing(pid: int, read_end: Any) -> bool:
    """Whether the process is asleep with a thread blocked writing into the pipe whose read end this
    is: the pipe holds data, and that thread waits in the kernel's pipe write."""
    waiting = int.from_bytes(fcntl.ioctl(read_end.fileno(), termios.FIONREAD, b"\0\0\0\0"), sys.byteorder)
    return waiting > 0 and idle(pid) and any("pipe_write" in w for w in wchans(pid))


def wchans(pid: int) -> list[str]:
    """Where in the kernel each thread of the process waits."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.append(task.joinpath("wchan").read_text())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def stopped_by_sigterm(proc: subprocess.Popen, within: float = STOP_WITHIN) -> str:
    """SIGTERM, then exit 143 within ``within`` seconds; its stderr."""
    proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    try:
        code = proc.wait(within)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {within} s after SIGTERM")
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    assert code == 143, err
    assert err.endswith("nplt-client: TERMINATED: SIGTERM\n"), err
    assert time.monotonic() - start < within
    return err


# -- 1. SIGTERM while a thread is blocked -------------------------------------------------------------
def test_sigterm_stops_ask_dash_while_its_stdin_stays_open(st: ServerThread, tmp_path: Path,
                                                           procs: list[subprocess.Popen]) -> None:
    """`(sleep 60 | nplt-client ask -)`: stdin.read runs in a worker thread that no cancel interrupts."""
    proc = spawn(st, tmp_path / "home", procs, "ask", "-", stdin=subprocess.PIPE)
    # the handler installed, and a second thread (the stdin read) blocked with the rest
    wait_for(lambda: catches_sigterm(proc.pid) and idle(proc.pid, min_threads=2), DEADLINE, "reading stdin")
    stopped_by_sigterm(proc)
    assert proc.stdout is not None and proc.stdout.read() == b""


def test_sigterm_stops_a_download_into_a_fifo_without_a_reader(st: ServerThread, tmp_path: Path,
                                                              procs: list[subprocess.Popen],
                                                              served: dict[MsgType, Seen]) -> None:
    """`timeout 3 nplt-client kb download DOC -o FIFO` with no reader: opening the FIFO blocked a worker
    thread, and SIGTERM left the process waiting for it (only SIGKILL ended it)."""
    upload(st, "runbook.md", b"# Runbook\n\nRestart the worker.\n")
    fifo = tmp_path / "fifo1"
    os.mkfifo(fifo)
    proc = spawn(st, tmp_path / "home", procs, "kb", "download", "runbook.md", "-o", str(fifo))
    assert served[MsgType.KB_LIST].answered.wait(DEADLINE)        # the document looked up: the FIFO is next
    wait_for(lambda: catches_sigterm(proc.pid) and idle(proc.pid), DEADLINE, "waiting for a reader")
    stopped_by_sigterm(proc)
    assert not served[MsgType.KB_DOWNLOAD].started.is_set()      # nothing was fetched for a FIFO nobody reads
    assert fifo.is_fifo()


def test_a_download_into_a_fifo_waits_for_its_reader(st: ServerThread, tmp_path: Path,
                                                     procs: list[subprocess.Popen],
                                                     served: dict[MsgType, Seen]) -> None:
    """The FIFO is opened without blocking (asked again until a reader comes): the reader that comes
    later still gets every byte, as with `curl -o FIFO`."""
    upload(st, "big.md", BIG)
    fifo = tmp_path / "fifo2"
    os.mkfifo(fifo)
    proc = spawn(st, tmp_path / "home", procs, "kb", "download", "big.md", "-o", str(fifo))
    assert served[MsgType.KB_LIST].answered.wait(DEADLINE)
    wait_for(lambda: idle(proc.pid), DEADLINE, "waiting for a reader")
    with open(fifo, "rb") as reader:
        got = reader.read()
    assert proc.wait(DEADLINE) == 0
    assert got == BIG


def test_sigterm_stops_a_download_writing_into_a_stdout_nobody_reads(st: ServerThread, tmp_path: Path,
                                                                    procs: list[subprocess.Popen]) -> None:
    """`nplt-client kb download DOC -o - | stalled`: the write blocks in a worker thread."""
    upload(st, "big.md", BIG)
    proc = spawn(st, tmp_path / "home", procs, "kb", "download", "big.md", "-o", "-")
    assert proc.stdout is not None
    wait_for(lambda: catches_sigterm(proc.pid) and blocked_writing(proc.pid, proc.stdout), DEADLINE, "blocked writing")
    stopped_by_sigterm(proc)


def test_sigterm_ends_a_main_thread_blocked_on_stdout_at_the_deadline(st: ServerThread, tmp_path: Path,
                                                                      procs: list[subprocess.Popen]) -> None:
    """`nplt-client history | stalled`: the main thread itself blocks in the write, so the event loop
    never runs the cancel; the signal's handler still runs (the write is interrupted) and arms
    STOP_DEADLINE_S, at which the process ends with 143."""
    for _ in range(2):                             # two long messages and their echoes: > a pipe's 64 KB
        proc = spawn(st, tmp_path / "home", procs, "ask", "-", stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        _, err = proc.communicate(b"x" * 30_000, timeout=DEADLINE)
        assert proc.returncode == 0, err
    proc = spawn(st, tmp_path / "home", procs, "history")
    assert proc.stdout is not None
    wait_for(lambda: catches_sigterm(proc.pid) and blocked_writing(proc.pid, proc.stdout), DEADLINE, "blocked writing")
    stopped_by_sigterm(proc, within=client_main.STOP_DEADLINE_S + STOP_WITHIN)


# -- 2. kb download -o - with stdout closed ------------------------------------------------------------
@pytest.mark.parametrize("shell", [">&-", "<&- >&-"])
@pytest.mark.parametrize("target", ["-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"])
def test_a_download_to_a_closed_stdout_is_write_failed(st: ServerThread, tmp_path: Path,
                                                       procs: list[subprocess.Popen],
                                                       served: dict[MsgType, Seen],
                                                       shell: str, target: str) -> None:
    """Descriptor 1 closed at start is taken by the event loop (`>&-`: its epoll, "Invalid argument";
    `<&- >&-`: its self-pipe socket, where a small document "downloaded" with exit 0)."""
    upload(st, "runbook.md", b"# Runbook\n\nRestart the worker.\n")
    proc = spawn(st, tmp_path / "home", procs, "kb", "download", "runbook.md", "-o", target, shell=shell,
                 stdout=subprocess.DEVNULL)
    assert proc.wait(DEADLINE) == 2
    assert proc.stderr is not None and proc.stderr.read().decode() == "nplt-client: WRITE_FAILED: stdout: closed\n"
    assert not served[MsgType.KB_DOWNLOAD].started.is_set()      # refused before any byte was fetched


# -- 3. kb download -o - | head ------------------------------------------------------------------------
def test_a_download_to_stdout_whose_reader_leaves_stops_quietly(st: ServerThread, tmp_path: Path,
                                                                procs: list[subprocess.Popen]) -> None:
    """docs/client.md: when stdout's reader goes away (`| head`) the command stops quietly with exit 0."""
    upload(st, "big.md", BIG)
    proc = spawn(st, tmp_path / "home", procs, "kb", "download", "big.md", "-o", "-")
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10) == BIG[:10]
    proc.stdout.close()                          # as `head -c 10` does
    assert proc.wait(DEADLINE) == 0
    assert proc.stderr.read() == b""
