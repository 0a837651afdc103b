"""scripts/run_local.py (``make run``): when the terminal goes away, the TUI exits and the local server
it started is stopped gracefully. Real processes on a pseudo-terminal; psutil finds the children."""
from __future__ import annotations

import os
import pty
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
