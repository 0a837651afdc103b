"""The tools' blocking work runs in their own threads (``[tools] worker_threads``), never in asyncio's
default executor.

A tool call that overruns its timeout is abandoned, but its thread runs on until the function returns.
When the file tools ran in the default executor (``asyncio.to_thread``), six runaway reads (its size
on 2 CPUs) blocked every tool of every user and the server's other thread work (a knowledge-base upload
timed out), and the server could not stop: asyncio's shutdown and the interpreter's exit join the
default executor's threads (review: repro_hang.py).
"""
from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest

from server.tools import ToolContext, ToolRegistry, ToolsConfig
from server.tools import files

CTX = ToolContext("alice", "s_1")
DEADLINE = 10.0


@pytest.fixture
def stuck(monkeypatch):
    """read_file blocks until the test releases it (a runaway call)."""
    release, started = threading.Event(), threading.Semaphore(0)

    def read_file(*args, **kwargs):
        started.release()
        release.wait(60)
        return {"text": "late"}

    monkeypatch.setattr(files, "read_file", read_file)
    yield release, started
    release.set()


async def test_runaway_calls_never_take_the_servers_own_threads(tmp_path, stuck):
    release, started = stuck
    loop = asyncio.get_running_loop()
    default = ThreadPoolExecutor(2)                  # the default executor: storage, KB ingest, uploads
    loop.set_default_executor(default)
    tools = ToolRegistry(ToolsConfig(file_roots=[str(tmp_path)], worker_threads=2))
    calls = [tools.run("read_file", {"path": "x.log"}, CTX, timeout=0.3) for _ in range(4)]
    results = await asyncio.gather(*calls)
    assert [c.status for c in results] == ["timeout"] * 4
    assert started.acquire(timeout=DEADLINE) and started.acquire(timeout=DEADLINE)   # two threads are stuck
    # the server's other thread work still runs at once
    assert await asyncio.wait_for(asyncio.to_thread(lambda: 42), DEADLINE) == 42
    assert tools.threads.started == 2                # bounded by worker_threads
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("nplt-tool"))
    # the tools wait for a free thread of their own: a call now times out, and runs once one is free
    assert (await tools.run("list_dir", {"path": "."}, CTX, timeout=0.3)).status == "timeout"
    release.set()
    ok = await tools.run("list_dir", {"path": str(tmp_path)}, CTX, timeout=DEADLINE)
    assert ok.status == "success", ok.result
    tools.close()


async def test_close_cancels_the_queued_calls_without_waiting_for_a_stuck_one(tmp_path, stuck):
    release, started = stuck
    tools = ToolRegistry(ToolsConfig(file_roots=[str(tmp_path)], worker_threads=1))
    running = asyncio.ensure_future(tools.run("read_file", {"path": "x.log"}, CTX, timeout=DEADLINE))
    assert await asyncio.to_thread(started.acquire, True, DEADLINE)
    submitted, submit = threading.Event(), tools.threads.submit
    tools.threads.submit = lambda *args: (submit(*args), submitted.set())[0]
    queued = asyncio.ensure_future(tools.run("list_dir", {"path": str(tmp_path)}, CTX, timeout=DEADLINE))
    assert await asyncio.to_thread(submitted.wait, DEADLINE)       # queued behind the stuck call
    tools.close()
    call = await asyncio.wait_for(queued, DEADLINE)
    assert call.status == "error" and orjson.loads(call.result) == {"error": "the server is shutting down"}
    after = await tools.run("list_dir", {"path": str(tmp_path)}, CTX)
    assert after.status == "error" and orjson.loads(after.result) == {"error": "the server is shutting down"}
    release.set()
    assert (await asyncio.wait_for(running, DEADLINE)).status == "success"


def test_a_stuck_tool_thread_does_not_keep_the_process_from_exiting(tmp_path):
    """asyncio.run (as nplt-server's runner) returns and the interpreter exits while a tool's thread is
    still stuck: it used to wait for it forever."""
    script = textwrap.dedent(f"""
        import asyncio, threading
        from server.tools import ToolContext, ToolRegistry, ToolsConfig, files
        files.read_file = lambda *a, **k: threading.Event().wait()      # never returns
        async def main():
            tools = ToolRegistry(ToolsConfig(file_roots=[{str(tmp_path)!r}]))
            call = await tools.run("read_file", {{"path": "x.log"}}, ToolContext("alice"), timeout=0.2)
            print(call.status, flush=True)
        asyncio.run(main())
        print("returned", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["timeout", "returned"], done.stderr
    assert done.returncode == 0
