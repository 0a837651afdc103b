"""No PostgreSQL process outlives the process that started it: not when it exits with an error
(atexit), not when it is SIGKILLed (parent-death signal), and the fixture's stop() ends the whole
process group."""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import asyncpg
import psutil
import pytest

from pg.pgserver import EmbeddedPostgres
from testkit.server import poll

TESTS = str(Path(__file__).resolve().parent.parent)
CHILD = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from pg.pgserver import EmbeddedPostgres
s = EmbeddedPostgres().start()
print(s.pid, s.dir, flush=True)
sys.stdin.readline()
if {mode!r} == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
raise RuntimeError("a failing test run")
"""


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running (a zombie has ended: PID 1 of a container may never reap it)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.parametrize("mode", ["kill", "fail"])
async def test_postgres_dies_with_the_process_that_started_it(mode):
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD.format(tests=TESTS, mode=mode), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    line = (await asyncio.wait_for(child.stdout.readline(), 60)).decode().split()
    pid, data_dir = int(line[0]), line[1]
    con = None
    procs: list[psutil.Process] = []
    try:
        assert os.getpgid(pid) == pid                  # the postmaster leads its own process group
        con = await asyncpg.connect(f"postgresql://postgres@/postgres?host={data_dir}/data")
        backend = await con.fetchval("SELECT pg_backend_pid()")
        procs = _tree(pid)
        assert backend in {p.pid for p in procs}
        child.stdin.write(b"go\n")
        await child.stdin.drain()
        assert await asyncio.wait_for(child.wait(), 60) != 0
        await poll(lambda: not _alive(procs), timeout=30)
        if mode == "fail":
            assert not os.path.exists(data_dir)      # atexit stopped it and removed its files
    finally:
        if con is not None:
            con.terminate()
        for p in _alive(procs):
            p.kill()
        shutil.rmtree(data_dir, ignore_errors=True)


async def test_stop_ends_the_postmaster_and_its_backends():
    server = EmbeddedPostgres().start()
    con = None
    try:
        con = await asyncpg.connect(server.url())
        backend = await con.fetchval("SELECT pg_backend_pid()")
        procs = server.processes()
        assert backend in {p.pid for p in procs}
    finally:
        server.destroy()
        if con is not None:
            con.terminate()
    assert not _alive(procs) and not server.dir.exists()
