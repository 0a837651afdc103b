"""A node SIGKILLed in the middle of a turn (issue 17, item 2): the user message is stored, the
surviving node closes the turn as interrupted (its clients see the TURN_END), and the session keeps
working there. The dying node is a real ``nplt-server`` process whose LLM stalls mid-answer."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from protocol import MsgType as T
from testkit.scripted_llm import Reply, ScriptedLLM
from testkit.server import V3Client, answer_text

from cluster.conftest import node

START_DEADLINE_S = 30.0


async def start_node_process(tmp_path: Path, url: str, env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    """``python -m server.main`` on port 0 storing in ``url``; returns (process, port)."""
    port_file = tmp_path / "port"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NPLT_") and k != "OPENAI_API_KEY"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "server.main", "--port", "0", "--port-file", str(port_file),
         "--data-dir", str(tmp_path / "data"), "--storage-url", url, "--log-format", "json"],
        env={**clean, **env}, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + START_DEADLINE_S
    while not port_file.exists():
        if proc.poll() is not None:
            raise AssertionError(f"node exited with {proc.returncode}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise AssertionError("node did not write its port file")
        await asyncio.sleep(0.05)  # polling a file another process writes, with a deadline
    return proc, int(port_file.read_text())


async def test_a_node_killed_mid_turn_leaves_its_turn_closed_as_interrupted(tmp_path, pg_url):
    async with ScriptedLLM() as llm, node(tmp_path, pg_url, "survivor") as a:
        llm.push(Reply.stalled("partial ", "answer"))     # streams two pieces, then never finishes
        proc, port = await start_node_process(tmp_path, pg_url, {"NPLT_LLM_BASE_URL": llm.base_url})
        cb = ca = None
        try:
            cb = await V3Client.connect(("127.0.0.1", port))
            sid = cb.session_id
            ca = await V3Client.connect((a.host, a.port), session_id=sid)
            r = await cb.call(T.CHAT_TEXT, text="tell me a long story")
            tid = r["turn_id"]
            assert r["user_message"]["id"] == 1                  # stored before the reply
            streamed = ""
            while streamed != "partial answer":                   # the turn now waits on the LLM
                streamed += (await cb.wait_type(T.ANSWER_DELTA, timeout=30, turn_id=tid)).body["text"]
            followed = ""                                           # node A's client follows it
            while followed != "partial answer":
                followed += (await ca.wait_type(T.ANSWER_DELTA, timeout=30, turn_id=tid)).body["text"]

            proc.send_signal(signal.SIGKILL)
            assert await asyncio.to_thread(proc.wait, 30) == -signal.SIGKILL

            events = await ca.turn_events(tid, timeout=30)
            assert events[0].type == T.TURN_START and events[0].body["user_message"]["id"] == 1
            end = events[-1].body
            assert events[-1].type == T.TURN_END and end["finish_reason"] == "interrupted"
            meta = end["message"]["metadata"]
            assert meta["interrupted"] is True and meta["partial"] is True and meta["answers"] == 1
            page = await ca.call(T.HISTORY_REQUEST, limit=50)
            assert [(m["role"], m["content"]) for m in page["messages"]] == [
                ("user", "tell me a long story"), ("assistant", "")]
            assert a.services.cluster.interrupted == 1

            r = await ca.call(T.CHAT_TEXT, text="still there?")  # the session keeps working on A
            assert answer_text(await ca.turn_events(r["turn_id"], timeout=30)) == "echo: still there?"
            page = await ca.call(T.HISTORY_REQUEST, limit=50)
            assert [m["content"] for m in page["messages"]][2:] == ["still there?", "echo: still there?"]
        finally:
            for c in (cb, ca):
                if c is not None:
                    await c.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
