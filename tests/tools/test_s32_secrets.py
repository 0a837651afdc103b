"""The processes tool never shows a process's arguments (review s32): a real child process whose argv[0]
carries a password, as `exec -a "tool --pw SECRET"` sets it."""
from __future__ import annotations

import shutil
import subprocess
import time

import orjson
import psutil
import pytest

from server.tools import ToolContext, ToolRegistry, ToolsConfig
from server.tools.system import process_name

CTX = ToolContext("alice", "s_1")
SECRET = "Zq7xK9mW2pL4vN8r"


@pytest.fixture
def disguised_child(tmp_path):
    """sleep, copied under a name longer than the kernel keeps (15 characters), started with an argv[0]
    that holds a password; killed at the end."""
    exe = tmp_path / "dbbackup_runner_tool"
    shutil.copy(shutil.which("sleep"), exe)
    child = subprocess.Popen([f"dbbackup_runner_tool --pw {SECRET}", "900"], executable=str(exe))
    try:
        # Popen may return (vfork) before the exec has set up the new argv: wait until it shows
        proc, deadline = psutil.Process(child.pid), time.monotonic() + 10
        while not proc.cmdline() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.cmdline()[0] == f"dbbackup_runner_tool --pw {SECRET}"
        yield child
    finally:
        child.kill()
        child.wait(timeout=10)


async def test_processes_never_shows_the_arguments_in_argv0(disguised_child):
    tools = ToolRegistry(ToolsConfig(cpu_sample_s=0.05))
    call = await tools.run("processes", {"name": "dbbackup", "limit": 50}, CTX)
    assert call.status == "success", call.result
    assert SECRET not in call.result and "--pw" not in call.result
    rows = {p["pid"]: p for p in orjson.loads(call.result)["processes"]}
    assert rows[disguised_child.pid]["name"] == "dbbackup_runner_tool"
    # the name filter decides on the name shown: it never tells whether a guess is in the arguments
    call = await tools.run("processes", {"name": SECRET[:8], "limit": 50}, CTX)
    assert call.status == "success", call.result
    assert orjson.loads(call.result)["matched"] == 0


def test_process_name_keeps_names_without_arguments(disguised_child):
    assert process_name(psutil.Process(disguised_child.pid)) == "dbbackup_runner_tool"
    me = psutil.Process()
    assert process_name(me) == me.name()        # a name without arguments is as psutil gives it
