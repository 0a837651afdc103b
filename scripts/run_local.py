"""`make run`: start a local server (offline agent unless an LLM is configured) and open the TUI on it.

The server runs as a child process bound to 127.0.0.1 (an OS-chosen port unless --port is given), writing
its port to a temporary file; the TUI connects to it; when the TUI exits the server is stopped with SIGTERM
(graceful: turns finished or saved as partial, storage compacted).

When the terminal goes away (SSH drop, closed tmux pane: SIGHUP) or this script gets SIGTERM, the TUI
exits (it handles SIGHUP itself, and is killed if it lingers) and the server is stopped the same
graceful way. The server runs in its own session, so the terminal's SIGHUP never kills it abruptly.

The server writes its rotating log file in the history directory (``<data-dir>/logs/nplt-server.log``;
its stderr goes to ``nplt-server.stderr`` beside it, which holds this run's only: at each start the
previous run's is renamed ``nplt-server.stderr.1``, replacing an older one). Both are kept after
exit; when the server fails, the end of this run's stderr (``STDERR_TAIL_CHARS``) is printed. Where the log is and
which port the server listens on are printed before the TUI opens and again after it closes, so the
CLI can be pointed at the same server from another terminal (``.venv/bin/nplt-client --port PORT ...``).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOG_NAME = "nplt-server.log"          # the server's own default name (server.cli.LOG_NAME)
STDERR_NAME = "nplt-server.stderr"    # the server's stderr, this run's; the previous run's is STDERR_NAME + ".1"
STDERR_TAIL_CHARS = 4000              # how much of the end of it is printed when the server fails


def fresh_stderr_file(path: Path) -> None:
    """Keep the previous run's stderr as ``<path>.1`` (one copy: the files never grow run after run)."""
    try:
        os.replace(path, path.with_name(path.name + ".1"))
    except FileNotFoundError:
        pass


def stderr_tail(path: Path, chars: int = STDERR_TAIL_CHARS) -> str:
    """The last ``chars`` characters of this run's stderr file (reads only its end)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4 * chars))
            return f.read().decode("utf-8", errors="replace")[-chars:]
    except OSError:
        return ""


def wait_for_port(port_file: Path, server: subprocess.Popen, deadline_s: float = 30.0) -> int:
    """Poll the port file the server writes once it listens (or fail if the server exits first)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"run: the server exited with code {server.returncode} before listening")
        text = port_file.read_text().strip() if port_file.exists() else ""
        if text.isdigit():
            return int(text)
        time.sleep(0.05)
    raise SystemExit("run: the server did not start listening within 30 s")


def _stop(signum: int, frame: object) -> None:
    """SIGHUP / SIGTERM: unwind main() so its ``finally`` stops the server."""
    raise SystemExit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGHUP, _stop)
    signal.signal(signal.SIGTERM, _stop)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 = any free port")
    ap.add_argument("--data-dir", default=str(ROOT / "storage" / "history"))
    args, extra = ap.parse_known_args()
    bindir = Path(sys.executable).parent
    log_dir = Path(args.data_dir).resolve() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file, stderr_file = log_dir / LOG_NAME, log_dir / STDERR_NAME
    fresh_stderr_file(stderr_file)
    with tempfile.TemporaryDirectory(prefix="nplt-run-") as tmp:
        port_file = Path(tmp) / "port"
        with open(stderr_file, "w", encoding="utf-8") as err:
            server = subprocess.Popen(
                [str(bindir / "nplt-server"), "--host", args.host, "--port", str(args.port),
                 "--data-dir", args.data_dir, "--log-file", str(log_file), "--port-file", str(port_file)],
                stdout=err, stderr=subprocess.STDOUT, start_new_session=True,
            )
        try:
            port = wait_for_port(port_file, server)
            # the programs are in the venv's bin, not on PATH: print the path to copy
            cli = bindir / "nplt-client"
            sys.stderr.write(f"run: nplt-server on {args.host}:{port} (CLI: {cli} --port {port} ...)\n"
                             f"run: server log: {log_file}\n")
            sys.stderr.flush()
            client = subprocess.run([str(bindir / "nplt-client"), "--host", args.host, "--port", str(port), *extra])
            return client.returncode
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
                try:
                    server.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    server.kill()
            if server.returncode not in (0, -signal.SIGTERM, None):
                sys.stderr.write(stderr_tail(stderr_file))
            sys.stderr.write(f"run: the server has stopped; its log: {log_file} (stderr: {stderr_file})\n")


if __name__ == "__main__":
    raise SystemExit(main())
