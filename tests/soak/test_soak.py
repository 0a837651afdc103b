"""``make soak`` in miniature: the whole campaign (fuzz, SIGKILL restarts, overload, provider faults)
with tiny counts, as a real subprocess. Zero crashes, zero lost acknowledged messages, zero tracebacks
in any server log; every phase reported and did its work."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_tiny_soak_loses_nothing_and_crashes_nothing(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--profile", "tiny",
                           "--work", str(tmp_path / "work"), "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["phase"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"fuzz (v2+v3 over TCP)", "SIGKILL restarts", "overload: connections", "overload: flood",
                         "overload: non-readers", "overload: fragments", "overload: slowloris", "provider faults"}
    assert [(p, r["crashes"], r["tracebacks"]) for p, r in rows.items() if r["crashes"] or r["tracebacks"]] == []
    kills = rows["SIGKILL restarts"]
    assert kills["lost"] == 0 and kills["extra"]["kills"] == 2 and kills["extra"]["acked"] > 0
    assert kills["failures"] == []            # no duplicate, no session left ending with a question
    assert rows["fuzz (v2+v3 over TCP)"]["extra"]["frames"] >= 1000
    assert rows["provider faults"]["failures"] == []
    assert "| phase | tried | crashes |" in proc.stdout
