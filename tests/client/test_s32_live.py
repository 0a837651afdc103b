"""The client's link when the server stops answering, its private files, and uploads the disk refuses:

- a server that freezes (SIGSTOP: a hung host, a network path that drops everything without a FIN
  or RST) is noticed: after ``liveness_timeout`` seconds without a byte the client PINGs, and with no
  answer the connection is taken as lost (before: ``ask`` waited forever, the TUI said "connected");
  a quiet but healthy server (a stalled model) answers the PINGs and keeps its clients;
- the TUI's saved inputs (``tui.json``) and its log are readable by the user only, whatever the umask
  (before: 0644 files in 0755 folders);
- an upload whose bytes the server's disk refuses (STORAGE_ERROR) stops sending at the refusal
  (before: every byte was sent, then END answered the refusal).
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import stat
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from client import kb as kbclient
from client import paths
from client.config import ClientConfig
from client.connection import Backoff, Client
from client.errors import ClientError
from client.events import Connected, Disconnected, Reconnecting, ServerError
from client.link import LIVENESS_MIN_S
from client.tui.saved import SavedState
from protocol.server_events import AnswerDelta
from testkit.process import START_DEADLINE_S, ServerProcess
from testkit.scripted_llm import Reply, ScriptedLLM

from client_testlib import next_event_of, wait_until

LIVENESS = 0.5                       # the liveness timeout of the library tests (seconds)
LOST_DEADLINE = 20.0                 # the loss must be noticed well within this (seconds after the freeze)
NPLT_CLIENT = Path(sys.executable).with_name("nplt-client")


class Frozen:
    """SIGSTOP the server process; SIGCONT it when the block ends (whatever happens)."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server

    def __enter__(self) -> float:
        os.kill(self.server.proc.pid, signal.SIGSTOP)
        return time.monotonic()

    def __exit__(self, *exc: object) -> None:
        if self.server.proc.poll() is None:
            os.kill(self.server.proc.pid, signal.SIGCONT)


async def _streaming_server(tmp_path: Path, llm: ScriptedLLM, *args: str) -> ServerProcess:
    """A real server process whose model streams "partial answer" and then stalls."""
    llm.push(Reply.stalled("partial ", "answer"))
    return await ServerProcess.start(tmp_path / "data", *args, env={"NPLT_LLM_BASE_URL": llm.base_url})


async def _until_streaming(c: Client) -> None:
    reply = await c.chat_send("tell me a long story")
    streamed = ""
    while streamed != "partial answer":        # the turn now waits on the stalled model
        ev = await next_event_of(c, AnswerDelta, pred=lambda e: e.turn_id == reply.turn_id)
        streamed += ev.text


async def test_a_frozen_server_mid_answer_is_connection_lost(tmp_path):
    async with ScriptedLLM() as llm:
        server = await _streaming_server(tmp_path, llm)
        try:
            c = Client(*server.addr, reconnect=False, liveness_timeout=LIVENESS, request_timeout=300)
            await c.connect()
            try:
                await _until_streaming(c)
                # quiet but alive (the model stalls): the client's PINGs are answered, it stays connected
                await wait_until(lambda: c.link.liveness_pings >= 3, what="three liveness PINGs",
                                 timeout=LOST_DEADLINE)
                assert c.connected
                with Frozen(server) as t0:
                    request = asyncio.create_task(c.session_list())     # no reply will come
                    ev = await next_event_of(c, Disconnected, timeout=LOST_DEADLINE)
                    lost_after = time.monotonic() - t0
                    assert ev.code == "CONNECTION_LOST" and "no answer from the server" in ev.error, ev
                    with pytest.raises(ClientError) as exc:
                        await asyncio.wait_for(request, LOST_DEADLINE)
                    assert exc.value.code == "CONNECTION_LOST"
                    assert c.state == "disconnected"
                # silence (0.5 s) + the PING's bound (0.5 s), with room for a loaded machine
                assert lost_after < 10, lost_after
            finally:
                await c.close()
        finally:
            assert await server.stop() == 0


async def test_a_reconnecting_client_reconnects_after_the_freeze(tmp_path):
    server = await ServerProcess.start(tmp_path / "data")
    try:
        c = Client(*server.addr, reconnect=True, liveness_timeout=LIVENESS, connect_timeout=1.0,
                   backoff=Backoff(initial=0.05, maximum=0.5))
        await c.connect()
        try:
            with Frozen(server):
                ev = await next_event_of(c, Reconnecting, timeout=LOST_DEADLINE)
                assert "no answer from the server" in ev.error and c.state == "reconnecting"
            back = await next_event_of(c, Connected, timeout=LOST_DEADLINE)
            assert back.reconnected and c.connected
            assert (await c.ping()).re is not None
        finally:
            await c.close()
    finally:
        assert await server.stop() == 0


def test_the_liveness_timeout_default_and_setting():
    cfg = ClientConfig.load(None, {})
    assert cfg.liveness_timeout_s is None                 # by default: from the server's HELLO limits
    cfg = ClientConfig.load(None, {"NPLT_CLIENT_LIVENESS_TIMEOUT_S": "7.5"})
    assert cfg.liveness_timeout_s == 7.5
    link = Client("127.0.0.1", 1).link
    assert link.liveness == 120.0                         # no HELLO yet: the fixed default
    link.hello = type("Hello", (), {"limits": {"ping_interval_s": 60.0}})()
    assert link.liveness == 120.0
    link.hello.limits["ping_interval_s"] = 0.05
    assert link.liveness == LIVENESS_MIN_S
    link.liveness_timeout = 2.0
    assert link.liveness == 2.0


async def test_ask_exits_3_when_the_server_freezes_mid_answer(tmp_path):
    """The real CLI with liveness_timeout_s from its environment (1 s; the default derived from the
    server's ping_interval_s is test_the_liveness_timeout_default_and_setting's): after a second with
    no byte it PINGs, and with no answer within the PING's bound (min(liveness, 10 s)) the link is lost."""
    async with ScriptedLLM() as llm:
        server = await _streaming_server(tmp_path, llm, "--ping-interval-s", "1")
        try:
            proc = await asyncio.create_subprocess_exec(
                str(NPLT_CLIENT), "--port", str(server.port), "ask", "tell me a long story",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env={**{k: v for k, v in os.environ.items() if not k.startswith("NPLT_")},
                     "NPLT_CLIENT_LIVENESS_TIMEOUT_S": "1"})
            try:
                assert proc.stdout is not None and proc.stderr is not None
                out = await asyncio.wait_for(proc.stdout.readuntil(b"partial answer"), START_DEADLINE_S)
                assert out.endswith(b"partial answer")
                with Frozen(server) as t0:
                    code = await asyncio.wait_for(proc.wait(), LOST_DEADLINE + 2 * LIVENESS_MIN_S)
                    took = time.monotonic() - t0
                err = (await proc.stderr.read()).decode()
                assert code == 3, err
                assert "CONNECTION_LOST" in err and "no answer from the server" in err, err
                assert took >= 1.0, took                         # a quiet second is no loss
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        finally:
            assert await server.stop() == 0


async def test_the_tui_shows_reconnecting_when_the_server_freezes(tmp_path):
    """The TUI as built by the app, with its config's liveness_timeout_s (the default derived from the
    server's ping_interval_s is covered by the CLI test and test_the_liveness_timeout_default_and_setting):
    "reconnecting" once the frozen server misses its PING, "connected" again after it resumes
    (before: "connected" for as long as it stayed frozen)."""
    from client.tui.app import NpltApp
    from client.tui.status import StatusLine

    server = await ServerProcess.start(tmp_path / "data", "--ping-interval-s", "1")
    try:
        app = NpltApp(ClientConfig(host="127.0.0.1", port=server.port, reconnect_initial_s=0.05,
                                   reconnect_max_s=0.5, connect_timeout_s=1.0, liveness_timeout_s=0.5),
                      state_path=tmp_path / "tui.json")
        async with app.run_test(size=(100, 30)) as pilot:
            status = app.query_one(StatusLine)
            await wait_until(lambda: status.connection == "connected", pilot=pilot, what="connected")
            with Frozen(server):
                await wait_until(lambda: status.connection == "reconnecting", pilot=pilot,
                                 timeout=LOST_DEADLINE, what="reconnecting")
            await wait_until(lambda: status.connection == "connected", pilot=pilot, timeout=LOST_DEADLINE,
                             what="connected again")
    finally:
        assert await server.stop() == 0


# -- private files --------------------------------------------------------------------------------

@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_saved_inputs_are_private(tmp_path, umask_022):
    path = tmp_path / "state" / "nplt" / "tui.json"
    SavedState.update(path, added=["my password is hunter2"])
    assert SavedState.load(path).history == ["my password is hunter2"]
    assert _mode(path) == 0o600
    assert _mode(path.with_name("tui.json.lock")) == 0o600
    assert _mode(path.parent) == 0o700 and _mode(path.parent.parent) == 0o700   # the folders it made

    # a file and folder an older client left open to others are made private on the next save
    os.chmod(path, 0o644)
    os.chmod(path.parent, 0o755)
    SavedState.update(path, added=["another"])
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    assert SavedState.load(path).history == ["my password is hunter2", "another"]
    assert not list(path.parent.glob("*.tmp"))


def test_the_log_file_is_private(tmp_path, umask_022, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    log_path = paths.log_file()
    assert log_path == tmp_path / "xdg" / "nplt" / "log" / "client.log"
    assert _mode(log_path) == 0o600 and _mode(log_path.parent) == 0o700

    # the handler keeps every file of the set private, the ones a rollover starts too
    other = tmp_path / "open" / "client.log"
    other.parent.mkdir()
    other.write_text("an older log\n")
    os.chmod(other, 0o644)
    handler = paths.PrivateRotatingFileHandler(other, maxBytes=200, backupCount=2, encoding="utf-8")
    try:
        logger = logging.getLogger("nplt.test.s32.private")
        logger.propagate = False
        logger.addHandler(handler)
        try:
            for i in range(20):
                logger.warning("sent: my password is hunter2 (%d)", i)
        finally:
            logger.removeHandler(handler)
    finally:
        handler.close()
    files = sorted(other.parent.iterdir())
    assert [f.name for f in files] == ["client.log", "client.log.1", "client.log.2"]
    assert all(_mode(f) == 0o600 for f in files), [(f.name, oct(_mode(f))) for f in files]


# -- an upload the disk refuses -------------------------------------------------------------------

FSIZE_LIMIT = 65_536                 # bytes one file of the server may hold (RLIMIT_FSIZE)
UPLOAD_SIZE = 48 << 20               # far more than the socket buffers hold: sending it all takes a while


async def _start_limited(data_dir: Path) -> ServerProcess:
    """A real server process whose disk refuses any file over FSIZE_LIMIT bytes."""
    return await ServerProcess.start(data_dir, file_size_limit=FSIZE_LIMIT)


async def test_an_upload_the_disk_refuses_stops_sending(tmp_path):
    src = tmp_path / "big.log"
    with open(src, "wb") as f:
        line = b"the nightly backup copies /srv/data to the vault, then checks the copy\n"
        f.write(line * (UPLOAD_SIZE // len(line)))
    size = src.stat().st_size
    server = await _start_limited(tmp_path / "data")
    try:
        async with Client(*server.addr, reconnect=False) as c:
            sent = [0]
            send = c.send_data

            async def counting(msg_type: Any, handle: int, offset: int, data: bytes) -> None:
                await send(msg_type, handle, offset, data)
                sent[0] += len(data)

            c.send_data = counting                                  # type: ignore[method-assign]
            stages: list[tuple[str, int]] = []
            with pytest.raises(ClientError) as exc:
                await asyncio.wait_for(kbclient.upload(c, src, progress=lambda s, d, t: stages.append((s, d))),
                                       120)
            assert exc.value.code == "STORAGE_ERROR", exc.value
            assert "big.log" in exc.value.message and "File too large" in exc.value.message
            # it stopped soon after the refusal: not the whole file (what the socket buffers held, at most)
            assert 0 < sent[0] < size // 2, (sent[0], size)
            assert all(done <= FSIZE_LIMIT for stage, done in stages if stage == "receiving"), stages
            # the refusal was the upload's, not left in the event queue as an unsolicited error
            assert c.connected
            assert (await c.ping()).re is not None
            while c.link._queue.qsize():
                assert not isinstance(await c.next_event(1.0), ServerError)
    finally:
        assert await server.stop() == 0
