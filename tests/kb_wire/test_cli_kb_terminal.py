"""``nplt-client kb upload`` as a group member (--group G: the JSON per file, the group's members
see the document, others do not), and on a terminal (a real pty: the progress bar, then the final
line)."""
from __future__ import annotations

import hashlib
import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))   # for client_testlib
from client_testlib import ServerThread  # noqa: E402

from client.main import main  # noqa: E402
from kb_wire.kbwire import auth_section, token  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"
NOTES = "# Ports\n\nThe metrics exporter listens on port 9100 by default.\n".encode()
DEADLINE = 60.0


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with ServerThread(tmp_path_factory.mktemp("kbcli-groups"), sections={"auth": auth_section()}) as st:
        yield st


def run(st: ServerThread, capsys: pytest.CaptureFixture, user: str, *args: str) -> tuple[int, str, str]:
    code = main(["--host", st.addr[0], "--port", str(st.addr[1]), "--token", token(user), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_upload_into_a_group_as_a_member(srv: ServerThread, capsys: pytest.CaptureFixture, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NPLT_CLIENT_TOKEN", raising=False)
    notes = tmp_path / "ports.md"
    notes.write_bytes(NOTES)
    code, out, err = run(srv, capsys, "alice", "kb", "upload", str(notes), "--group", "red", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert list(doc) == ["files"] and len(doc["files"]) == 1
    [row] = doc["files"]
    assert set(row) == {"path", "doc_id", "name", "md5", "chunks", "duplicate"} and row["path"] == str(notes)
    assert row["name"] == "ports.md" and row["md5"] == hashlib.md5(NOTES).hexdigest()
    assert row["chunks"] == 1 and row["duplicate"] is False
    code, out, _ = run(srv, capsys, "carol", "kb", "list", "--json")          # carol is in red too
    [listed] = json.loads(out)["documents"]
    assert code == 0 and listed["doc_id"] == row["doc_id"] and listed["collection"] == "group:red"
    code, out, _ = run(srv, capsys, "bob", "kb", "list", "--json")            # bob is in blue only
    assert code == 0 and json.loads(out) == {"documents": []}
    code, out, err = run(srv, capsys, "bob", "kb", "upload", str(notes), "--group", "red", "--json")
    assert code != 0 and "FORBIDDEN" in err


def run_on_a_pty(argv: list[str]) -> tuple[int, str]:
    """Run the CLI with stdout and stderr on a pseudo-terminal; (exit status, everything it wrote)."""
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(SRC), "NPLT_CLIENT_TOKEN": ""}
    proc = subprocess.Popen([sys.executable, "-m", "client.main", *argv], stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + DEADLINE
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            try:
                data = os.read(master, 65536)
            except OSError:         # EIO: the child closed its end of the terminal
                break
            if not data:
                break
            out += data
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, out.decode("utf-8", "replace")


def test_upload_on_a_terminal_draws_a_progress_bar_then_the_result(srv: ServerThread, tmp_path: Path) -> None:
    big = tmp_path / "manual.md"
    body = "".join(f"## Section {i}\n\nThe exporter {i} listens on port {9100 + i} and rotates its logs daily.\n\n"
                   for i in range(4000))
    big.write_text("# Manual\n\n" + body, encoding="utf-8")
    code, text = run_on_a_pty(["--host", srv.addr[0], "--port", str(srv.addr[1]), "--token", token("dave"),
                               "kb", "upload", str(big)])
    assert code == 0, text
    frames = text.split("\r")
    bars = [f for f in frames if "manual.md" in f and "[" in f and "%" in f]
    assert any("receiving" in f for f in bars) and any("indexing" in f and "100%" in f for f in bars), text
    assert any(f"[{'#' * 24}]" in f for f in bars), text                    # a full bar was drawn
    lines = [ln for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
    doc_id, md5, chunks, word, name = lines[-1].split()
    assert len(doc_id) == 24 and md5 == hashlib.md5(big.read_bytes()).hexdigest()
    assert word == "chunks" and int(chunks) > 1 and name == "manual.md"
