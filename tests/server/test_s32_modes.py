"""Review s32: what ``nplt-server`` creates is private to its account, and ``hash-token`` does not
echo a token typed at a terminal.

- A real server process started with umask 022 (the usual one) does a turn, a knowledge upload and
  a memory write: every file and directory under its data directory (and its port file) has no
  group or other permission bits, while it runs (the WAL is there) and after it stops.
- ``nplt-server hash-token`` reads one line from a pipe, and reads a token typed at a terminal (a
  pseudo-terminal here) without echoing it back.
"""
from __future__ import annotations

import os
import pty
import select
import stat
import subprocess
import sys
import time
from pathlib import Path

from client.connection import Client
from client.kb import upload
from protocol import MsgType as T
from server.auth import hash_token
from testkit.process import ServerProcess
from testkit.scripted_llm import Reply, ScriptedLLM
from testkit.server import V3Client

DEADLINE_S = 30.0


def _shared(paths: list[Path]) -> list[str]:
    """Those of ``paths`` granting group or other users any access, with their modes."""
    out = []
    for p in paths:
        mode = p.lstat().st_mode
        if stat.S_IMODE(mode) & 0o077:
            out.append(f"{oct(stat.S_IMODE(mode))} {p}")
    return out


async def test_everything_the_server_creates_is_private_whatever_its_umask(tmp_path):
    data = tmp_path / "data"
    old = os.umask(0o022)                  # the process umask the server inherits
    try:
        async with ScriptedLLM() as llm:
            llm.push(Reply.text("noted, ", "tea it is"))
            srv = await ServerProcess.start(data, env={"NPLT_LLM_BASE_URL": llm.base_url})
            try:
                c = await V3Client.connect(srv.addr)
                r = await c.call(T.CHAT_TEXT, text="remember that I like green tea")
                end = (await c.turn_events(r["turn_id"], timeout=DEADLINE_S))[-1]
                assert end.type == T.TURN_END and end.body["message"]["content"] == "noted, tea it is"
                await c.close()
                doc = tmp_path / "notes.txt"
                doc.write_text("green tea is brewed at 80 degrees\n" * 10)
                async with Client("127.0.0.1", srv.port) as cl:
                    assert (await upload(cl, doc)).chunks >= 1
                    assert [m.text for m in (await cl.memory_list()).items] == ["I like green tea"]
                running = sorted(data.rglob("*"))
                assert any(p.name.startswith("wal_") for p in running)          # the WAL, while it runs
                assert any(p.parent.name == "user_memory" for p in running)
                assert any(p.name == "original" for p in running)               # the KB upload
                assert _shared([data, *running]) == []
            finally:
                assert await srv.stop() == 0
    finally:
        os.umask(old)
    everything = sorted(data.rglob("*"))
    names = {p.name for p in everything}
    assert {"index.json", "nplt-server.log", "turns_in_flight.log", ".lock"} <= names, names
    assert any(n.endswith(".journal") for n in names) and any(n.startswith("session_") for n in names)
    port_file = data.parent / f"{data.name}.port"
    assert _shared([data, port_file, *everything]) == []


def test_hash_token_reads_one_line_from_a_pipe():
    proc = subprocess.run([sys.executable, "-m", "server.main", "hash-token"], input="s3cret-token\n",
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == hash_token("s3cret-token")
    assert "s3cret-token" not in proc.stderr


def _read_until(fd: int, want: bytes, deadline: float) -> bytes:
    """Read the pty master ``fd`` until ``want`` has been seen (or it is closed); AssertionError at
    the deadline."""
    got = b""
    while want not in got:
        left = deadline - time.monotonic()
        assert left > 0, f"timed out waiting for {want!r}; got {got!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:                    # EIO: every slave end is closed (the child exited)
            break
        if not chunk:
            break
        got += chunk
    return got


def test_hash_token_typed_at_a_terminal_is_not_echoed():
    token = "typed-secret-4711"
    master, slave = pty.openpty()
    try:
        # A new session without a controlling terminal: getpass cannot reach the terminal pytest may
        # run in (/dev/tty), only the pseudo-terminal given as stdin and stderr.
        proc = subprocess.Popen([sys.executable, "-m", "server.main", "hash-token"], stdin=slave,
                                stdout=subprocess.PIPE, stderr=slave, start_new_session=True)
        os.close(slave)
        slave = -1
        try:
            deadline = time.monotonic() + DEADLINE_S
            shown = _read_until(master, b"then Enter:", deadline)    # the prompt: now it reads
            os.write(master, token.encode() + b"\n")
            out, _ = proc.communicate(timeout=DEADLINE_S)
            shown += _read_until(master, b"\x00never\x00", deadline)    # the rest, up to the close
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert proc.returncode == 0
    assert out.decode().strip() == hash_token(token)
    assert token.encode() not in shown, shown                 # never echoed back to the terminal
