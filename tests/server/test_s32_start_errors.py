"""A start that fails on the operator's input says what is wrong in their terms: a --data-dir that is a
file, a host name that does not resolve (before: "[Errno 17] File exists", "[Errno -2] Name or service
not known" without the name)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from server.cli import load_config
from server.main import start_error


def start(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPLT_") and k != "OPENAI_API_KEY"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return subprocess.run([sys.executable, "-m", "server.main", "--port", "0", "--log-file", "off", *args],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=60)


def test_a_data_dir_that_is_a_file_is_named(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a folder\n")
    done = start("--data-dir", str(afile))
    assert done.returncode == 1
    assert f"nplt-server: cannot start: {afile} must be a directory (found a file)" in done.stderr
    nested = FileExistsError(17, "File exists")                 # a file on the way: named too
    nested.filename = str(afile / "history")
    cfg = load_config(["--data-dir", str(afile / "history")], env={})
    assert start_error(nested, cfg) == f"{afile} must be a directory (found a file)"


def test_a_host_that_does_not_resolve_is_named(tmp_path: Path) -> None:
    """(The resolver's answer is not this test's business: the error is built from a gaierror.)"""
    cfg = load_config(["--data-dir", str(tmp_path / "d"), "--host", "no-such-host.invalid", "--insecure"], env={})
    why = start_error(socket.gaierror(socket.EAI_NONAME, "Name or service not known"), cfg)
    assert why == "cannot resolve the host 'no-such-host.invalid' (server.host, --host): Name or service not known"
    assert start_error(OSError(98, "Address already in use"), cfg) == "[Errno 98] Address already in use"
