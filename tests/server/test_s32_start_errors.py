"""A start that fails on the operator's input says what is wrong in their terms: a --data-dir that is a
file, a host name that does not resolve (before: "[Errno 17] File exists", "[Errno -2] Name or service
not known" without the name)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def start(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-m", "server.main", "--port", "0", "--log-file", "off", *args],
                          capture_output=True, text=True, env=env, timeout=60)


def test_a_data_dir_that_is_a_file_is_named(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a folder\n")
    done = start("--data-dir", str(afile))
    assert done.returncode == 1
    assert f"nplt-server: cannot start: {afile} must be a directory (found a file)" in done.stderr
    done = start("--data-dir", str(afile / "history"))          # a file on the way
    assert done.returncode == 1 and f"{afile} must be a directory (found a file)" in done.stderr


def test_a_host_that_does_not_resolve_is_named(tmp_path: Path) -> None:
    done = start("--data-dir", str(tmp_path / "d"), "--host", "no-such-host.invalid", "--insecure")
    assert done.returncode == 1
    assert "cannot start: cannot resolve the host 'no-such-host.invalid' (server.host, --host)" in done.stderr
