"""Review s32: `make run` (scripts/run_local.py) keeps only this run's server stderr in
logs/nplt-server.stderr (the previous run's as .1: nothing grows run after run), and a failed start
prints what this run wrote, not older runs' lines. A real run_local whose server fails at once (a bad
configuration file, NPLT_CONFIG)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OLD = "OLD-RUN-LINE from an earlier run\n"


def run_local(tmp_path: Path, data: Path) -> subprocess.CompletedProcess[str]:
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nno_such_key_s32 = 1\n")
    env = {**os.environ, "HOME": str(tmp_path), "NPLT_CONFIG": str(bad)}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "run_local.py"), "--data-dir", str(data)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=120)


def test_a_failed_start_shows_this_runs_stderr_only_and_the_file_does_not_grow(tmp_path):
    data = tmp_path / "data"
    logs = data / "logs"
    logs.mkdir(parents=True)
    stderr_file = logs / "nplt-server.stderr"
    stderr_file.write_text(OLD * 20_000)                     # ~700 KB left by earlier runs
    run = run_local(tmp_path, data)
    assert run.returncode != 0
    assert "no_such_key_s32" in run.stderr and "configuration error" in run.stderr    # this run's error
    assert "OLD-RUN-LINE" not in run.stderr
    this_run = stderr_file.read_text()
    assert "no_such_key_s32" in this_run and "OLD-RUN-LINE" not in this_run and len(this_run) < 4000
    assert (logs / "nplt-server.stderr.1").read_text() == OLD * 20_000   # the previous run's, kept once
    run = run_local(tmp_path, data)                          # again: one previous copy, no old lines
    assert run.returncode != 0 and "OLD-RUN-LINE" not in run.stderr
    assert "OLD-RUN-LINE" not in (logs / "nplt-server.stderr.1").read_text()
    assert sorted(p.name for p in logs.iterdir() if p.name.startswith("nplt-server.stderr")) == [
        "nplt-server.stderr", "nplt-server.stderr.1"]
