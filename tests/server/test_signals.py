"""A real ``nplt-server`` process: SIGTERM / SIGINT (also while a turn is running) and its log level.

For the running turn, the server's LLM is a scripted OpenAI-compatible server on loopback
(``NPLT_LLM_BASE_URL``, an existing config path) that streams part of an answer and then stalls, so
the turn is reliably still running when the signal arrives. The client must get the turn's cancelled
TURN_END with the partial answer, then ERROR SHUTTING_DOWN; the process exits 0 and its store is
compacted (empty journal) and complete.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from protocol import MsgType
from storage import HistoryStore, StorageConfig
from testkit.scripted_llm import Reply, ScriptedLLM
from testkit.server import V3Client

T = MsgType
START_DEADLINE_S = 30.0


async def start_server(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, int]:
    """``python -m server.main`` on port 0 with data in tmp_path/data; returns (process, port).

    The caller's NPLT_* and OPENAI_API_KEY variables are removed so they cannot change the server.
    """
    port_file = tmp_path / "port"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NPLT_") and k != "OPENAI_API_KEY"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "server.main", "--port", "0", "--port-file", str(port_file),
         "--data-dir", str(tmp_path / "data"), "--log-format", "json", *args],
        env={**clean, **(env or {})}, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + START_DEADLINE_S
    while not port_file.exists():
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise AssertionError("server did not write its port file")
        await asyncio.sleep(0.05)  # polling a file another process writes, with a deadline
    return proc, int(port_file.read_text())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_signal_during_a_turn_saves_the_partial_answer(tmp_path, sig):
    async with ScriptedLLM() as llm:
        llm.push(Reply.stalled("partial ", "answer"))  # streams two pieces, then never finishes
        proc, port = await start_server(tmp_path, env={"NPLT_LLM_BASE_URL": llm.base_url})
        try:
            c = await V3Client.connect(("127.0.0.1", port))
            assert c.hello["agent"]["offline"] is False
            sid = c.session_id
            r = await c.call(T.CHAT_TEXT, text="tell me a long story")
            tid = r["turn_id"]
            streamed = ""
            while streamed != "partial answer":  # the turn is now waiting on the stalled LLM
                streamed += (await c.wait_type(T.ANSWER_DELTA, timeout=30, turn_id=tid)).body["text"]
            assert proc.poll() is None
            proc.send_signal(sig)
            end = (await c.turn_events(tid, timeout=30))[-1]
            assert end.type == T.TURN_END and end.body["finish_reason"] == "cancelled"
            assert end.body["message"]["content"] == "partial answer"
            assert end.body["message"]["metadata"]["partial"] is True
            err = await c.wait_type(T.ERROR, timeout=30)
            assert err.body["code"] == "SHUTTING_DOWN" and err.body["fatal"] is True
            await c.wait_closed(timeout=30)
            await c.close()
            assert await asyncio.to_thread(proc.wait, 30) == 0
            log = proc.stderr.read()
            assert '"msg":"stopped"' in log, log
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stderr.close()
    data = tmp_path / "data"
    journals = list(data.glob(f"session_*_{sid}.journal"))
    assert journals and all(j.stat().st_size == 0 for j in journals)  # compacted on close
    store = HistoryStore(StorageConfig(root=str(data)))
    try:
        msgs = store.messages(sid)
        assert [(m.role, m.content) for m in msgs] == [("user", "tell me a long story"),
                                                        ("assistant", "partial answer")]
        meta = msgs[1].metadata
        assert meta["partial"] is True and meta["cancel_reason"] == "shutdown"
    finally:
        store.close()


async def stop(proc: subprocess.Popen) -> str:
    """SIGTERM, expect exit code 0, return what the server wrote on stderr."""
    proc.send_signal(signal.SIGTERM)
    try:
        assert await asyncio.to_thread(proc.wait, 30) == 0
        return proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def log_lines(stderr: str) -> list[dict]:
    """The JSON log lines (other stderr lines, e.g. "nplt-server listening on ...", are not logs)."""
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


async def test_entry_point_serves_and_stops_on_sigterm(tmp_path):
    proc, port = await start_server(tmp_path)
    try:
        c = await V3Client.connect(("127.0.0.1", port))
        assert c.hello["agent"]["offline"] is True  # no LLM configured: the offline agent
        r = await c.call(T.CHAT_TEXT, text="what time is it")
        end = (await c.turn_events(r["turn_id"], timeout=30))[-1]
        assert end.type == T.TURN_END and end.body["message"]["content"]
    finally:
        log = await stop(proc)
    err = await c.wait_type(T.ERROR)
    assert err.body["code"] == "SHUTTING_DOWN"
    await c.close()
    assert '"msg":"listening on 127.0.0.1:' in log and "what time is it" not in log


async def test_log_level_from_the_environment_any_case(tmp_path):
    proc, port = await start_server(tmp_path, env={"NPLT_LOG_LEVEL": "DEBUG"})
    try:
        c = await V3Client.connect(("127.0.0.1", port))
        await c.close()
    finally:
        lines = log_lines(await stop(proc))
    levels = {line["level"] for line in lines}
    assert {"debug", "info"} <= levels, lines
    assert any(line["level"] == "debug" and line["msg"].startswith("connection 1 from 127.0.0.1:") for line in lines)


async def test_log_level_flag_beats_the_environment_and_filters(tmp_path):
    # --max-clients 1: a second connection is refused, which logs a WARNING
    proc, port = await start_server(tmp_path, "--log-level", "warning", "--max-clients", "1",
                                    env={"NPLT_LOG_LEVEL": "debug"})
    try:
        c = await V3Client.connect(("127.0.0.1", port))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # refused after legacy_grace_ms: one v2 CHAT_TEXT saying why, then the close
        assert (await asyncio.wait_for(reader.read(), 30)).endswith(b"Server is full (1 clients); try again later.")
        writer.close()
        await c.close()
    finally:
        lines = log_lines(await stop(proc))
    assert {line["level"] for line in lines} <= {"warning", "error"}, lines  # no info, no debug
    assert any(line["level"] == "warning" and "refused: max_clients reached" in line["msg"] for line in lines)


async def test_the_log_file_is_written_rotating_and_kept(tmp_path):
    proc, port = await start_server(tmp_path)
    try:
        c = await V3Client.connect(("127.0.0.1", port))
        await c.close()
    finally:
        err = await stop(proc)
    path = tmp_path / "data" / "logs" / "nplt-server.log"       # in the data folder by default
    assert f"nplt-server: logging to {path}" in err
    lines = log_lines(path.read_text())
    assert any(line["msg"].startswith("listening on 127.0.0.1:") for line in lines)
    assert lines[-1]["msg"] == "stopped"
    (tmp_path / "port").unlink()                                   # so start_server waits for the new one
    proc, port = await start_server(tmp_path, "--log-file", "off")  # the old file is kept, not appended
    await stop(proc)
    assert log_lines(path.read_text()) == lines


async def test_an_unwritable_log_file_refuses_to_start(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    proc = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "server.main", "--port", "0",
                                                    "--data-dir", str(tmp_path / "data"),
                                                    "--log-file", str(blocker / "x.log")],
                                   capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "cannot write the log file" in proc.stderr
