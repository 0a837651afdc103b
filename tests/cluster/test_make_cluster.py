"""`make cluster` (scripts/cluster.py): an embedded PostgreSQL and two nodes that share it, as a user
starts it by hand. A message sent through node 1 is listed through node 2, and Ctrl+C (SIGINT) stops
both nodes and PostgreSQL: no process of the cluster outlives the script."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 90.0


def cli(port: int, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "client.main", "--port", str(port), *args, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_make_cluster_serves_one_truth_and_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "cluster.py"), "--nodes", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    ports: list[int] = []
    family: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, f"cluster.py exited early with {proc.poll()}"
            m = re.match(r"node \d+: 127\.0\.0\.1:(\d+)", line)
            if m:
                ports.append(int(m.group(1)))
            if line.startswith("Ctrl+C stops everything"):
                break
        assert len(ports) == 2, ports
        family = psutil.Process(proc.pid).children(recursive=True)
        assert any("postgres" in p.name() for p in family) and len(family) >= 3

        answer = cli(ports[0], "ask", "--new", "hello from node one")
        listed = cli(ports[1], "sessions")["sessions"]
        assert [s["session_id"] for s in listed] == [answer["session_id"]]
        assert listed[0]["message_count"] == 2

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        gone, alive = psutil.wait_procs(family, timeout=30)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in family:
            if p.is_running():
                p.kill()
