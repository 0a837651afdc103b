"""scripts/run_local.py (``make run``): when the terminal goes away, the TUI exits and the local server
it started is stopped gracefully; it prints the server's port and log path, and the log outlives it.
Real processes on a pseudo-terminal; psutil finds the children."""
from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 60.0


def children(proc: psutil.Process) -> dict[str, psutil.Process]:
    """The TUI and server processes under run_local, by program name."""
    found = {}
    for child in proc.children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
        except psutil.Error:
            continue
        for name in ("nplt-server", "nplt-client"):
            if name in cmd:
                found[name] = child
    return found


def test_a_hangup_ends_the_tui_and_stops_the_local_server(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    env = {**os.environ, "HOME": str(tmp_path), "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"}
    run = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "run_local.py"), "--data-dir", str(tmp_path / "data")],
                           stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)

    def drain() -> None:   # read the TUI's output so it never blocks on a full terminal
        while True:
            try:
                if not os.read(master, 65536):
                    return
            except OSError:
                return
    threading.Thread(target=drain, daemon=True).start()
    try:
        parent = psutil.Process(run.pid)
        deadline = time.monotonic() + DEADLINE
        procs: dict[str, psutil.Process] = {}
        while len(procs) < 2:
            assert run.poll() is None, "run_local exited early"
            assert time.monotonic() < deadline, f"the TUI and the server did not start: {procs}"
            procs = children(parent)
            time.sleep(0.05)   # polling the process table with a deadline (nothing to wait on)
        server = procs["nplt-server"]
        assert os.getsid(server.pid) != run.pid   # its own session: the hangup reaches it only via run_local
        # the terminal goes away: SIGHUP to the terminal's process group (run_local and the TUI)
        os.killpg(run.pid, signal.SIGHUP)
        assert run.wait(DEADLINE) == 128 + signal.SIGHUP
        gone, alive = psutil.wait_procs(list(procs.values()), timeout=DEADLINE)
        assert not alive, f"left behind: {alive}"
        assert server.pid in {p.pid for p in gone}   # stopped by run_local (SIGTERM: the graceful stop)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        os.close(master)


def test_run_prints_the_port_and_the_log_path_and_the_log_outlives_it(tmp_path: Path) -> None:
    """`make run` says where the server listens and where its log is, before the TUI opens and after
    it closes; the CLI reaches the server on that port; the log file is still there afterwards."""
    master, slave = pty.openpty()
    env = {**os.environ, "HOME": str(tmp_path), "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"}
    data = tmp_path / "data"
    run = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "run_local.py"), "--data-dir", str(data)],
                           stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    seen = bytearray()
    grew = threading.Condition()

    def drain() -> None:   # keep what the terminal shows (run_local's lines and the TUI's screen)
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                chunk = b""
            with grew:
                seen.extend(chunk)
                grew.notify_all()
            if not chunk:
                closed.set()
                return
    closed = threading.Event()
    threading.Thread(target=drain, daemon=True).start()

    def wait_for(pattern: str) -> re.Match[str]:
        deadline = time.monotonic() + DEADLINE
        with grew:
            while (m := re.search(pattern, seen.decode(errors="replace"))) is None:
                left = deadline - time.monotonic()
                assert left > 0 and not closed.is_set(), f"no {pattern!r} in {bytes(seen[-2000:])!r}"
                grew.wait(left)
        return m
    log = data.resolve() / "logs" / "nplt-server.log"
    try:
        port = int(wait_for(r"run: nplt-server on 127\.0\.0\.1:(\d+) \(CLI: \S+/nplt-client --port \1 ").group(1))
        assert wait_for(r"run: server log: (\S+)").group(1) == str(log)
        cli = subprocess.run([sys.executable, "-m", "client.main", "--port", str(port), "sessions", "--json"],
                             capture_output=True, text=True, env=env, timeout=DEADLINE)
        assert cli.returncode == 0, cli.stderr          # the printed port is the server's
        assert json.loads(cli.stdout) == {"sessions": []}
        os.killpg(run.pid, signal.SIGTERM)               # like ctrl+c in make: the graceful stop
        assert run.wait(DEADLINE) == 128 + signal.SIGTERM
        wait_for(r"run: the server has stopped; its log: " + re.escape(str(log)))
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        os.close(master)
    assert log.is_file() and log.stat().st_size > 0      # kept after exit, with what the server said
    assert str(port) in log.read_text(encoding="utf-8")
