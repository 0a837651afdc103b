"""A real ``nplt-server`` process on port 0 for tests and the soak (SIGKILL, restarts).

``ServerProcess.start(data_dir, *args, env=...)`` runs ``python -m server.main`` with its history in
``data_dir`` and waits (deadline) for the port file; the caller's NPLT_* and OPENAI_API_KEY variables
are removed so they cannot change the server. stderr goes to ``log_path`` (appended across restarts).
"""
from __future__ import annotations

import asyncio
import os
import resource
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

START_DEADLINE_S = 30.0


def kill_at_point(script: Path, *args: str, point: str) -> None:
    """Run the Python ``script`` with ``args`` until it prints the line ``point`` (it has reached
    the moment to die at), then SIGKILL it; its pipes are closed whatever happens."""
    proc = subprocess.Popen([sys.executable, str(script), *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()            # type: ignore[union-attr]
        assert line == point, proc.stderr.read()          # type: ignore[union-attr]
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()                                # type: ignore[union-attr]


def _limit_file_size(limit: int) -> None:
    """In the server process before exec: no file over ``limit`` bytes, and a write past it is EFBIG
    rather than the default SIGXFSZ that would kill the process."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


class ServerProcess:
    def __init__(self, proc: subprocess.Popen, port: int, log_path: Path) -> None:
        self.proc, self.port, self.log_path = proc, port, log_path

    @classmethod
    async def start(cls, data_dir: Path, *args: str, env: dict[str, str] | None = None,
                    log_path: Path | None = None, file_size_limit: int | None = None) -> ServerProcess:
        """``nplt-server`` as a real process on an OS-chosen port. ``file_size_limit``: no file it writes
        may grow past this many bytes (RLIMIT_FSIZE; a write past it is EFBIG, not SIGXFSZ): a disk
        that refuses a write."""
        data_dir = Path(data_dir)
        port_file = data_dir.parent / f"{data_dir.name}.port"
        port_file.unlink(missing_ok=True)
        log_path = log_path or data_dir.parent / f"{data_dir.name}.log"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("NPLT_") and k != "OPENAI_API_KEY"}
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "server.main", "--port", "0", "--port-file", str(port_file),
                 "--data-dir", str(data_dir), "--log-format", "json", *args],
                env={**clean, **(env or {})}, stdout=subprocess.DEVNULL, stderr=log,
                preexec_fn=None if file_size_limit is None else partial(_limit_file_size, file_size_limit))
        deadline = time.monotonic() + START_DEADLINE_S
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None:
                raise AssertionError(f"server exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise AssertionError("server did not write its port file")
            await asyncio.sleep(0.02)  # polling a file another process writes, with a deadline
        return cls(proc, int(port_file.read_text()), log_path)

    @property
    def addr(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    async def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM; the exit code (killed after ``timeout``)."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return await asyncio.to_thread(self.proc.wait, timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9
