"""nplt-server opens its log file only once it holds its data directory (the store's lock): a second
server started on a locked directory reports on stderr and exits 1, and writes nothing into the log
file of the server that runs there (it used to append its "cannot start" lines to it)."""
from __future__ import annotations

import json
import logging
import os

import pytest

from server.logs import StartupRecords, add_log_file
from server.main import main
from storage import HistoryStore, StorageConfig


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for var in list(os.environ):
        if var.startswith("NPLT_") or var == "OPENAI_API_KEY":
            monkeypatch.delenv(var)
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    yield
    root.handlers[:] = saved[0]          # main() set up the process's logging
    root.setLevel(saved[1])


def test_a_server_refused_the_lock_leaves_the_running_servers_log_alone(tmp_path, capsys):
    data = tmp_path / "data"
    running = HistoryStore(StorageConfig(root=str(data)))       # the server already running there
    log_file = data / "logs" / "nplt-server.log"
    log_file.parent.mkdir(parents=True)
    log_file.write_text("the running server's own line\n")
    try:
        assert main(["--port", "0", "--data-dir", str(data)]) == 1
    finally:
        running.close()
    err = capsys.readouterr().err
    assert "nplt-server: cannot start: StorageLocked" in err and "already in use" in err
    assert "logging to" not in err
    assert log_file.read_text() == "the running server's own line\n"


def test_an_unwritable_log_file_is_exit_code_1_and_releases_the_directory(tmp_path, capsys):
    data = tmp_path / "data"
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    assert main(["--port", "0", "--data-dir", str(data), "--log-file", str(blocker / "x.log")]) == 1
    assert f"nplt-server: cannot write the log file {blocker / 'x.log'}" in capsys.readouterr().err
    HistoryStore(StorageConfig(root=str(data))).close()          # the lock was given back


async def test_what_was_logged_before_the_lock_is_written_to_the_log_file_first(tmp_path):
    """The store's own start-up lines (logged while it opens, before the log file may be opened) are
    in the log file too, before the server's, with their original times."""
    from testkit.process import ServerProcess
    server = await ServerProcess.start(tmp_path / "data")
    assert await server.stop() == 0
    err = server.log_path.read_text()
    assert err.index("rebuilding it from the session files") < err.index("nplt-server: logging to")
    lines = [json.loads(line) for line in (tmp_path / "data" / "logs" / "nplt-server.log").read_text().splitlines()]
    msgs = [line["msg"] for line in lines]
    first = next(i for i, m in enumerate(msgs) if "rebuilding it from the session files" in m)
    assert first < next(i for i, m in enumerate(msgs) if m.startswith("listening on"))
    assert msgs[-1] == "stopped" and [line["ts"] for line in lines] == sorted(line["ts"] for line in lines)


def test_startup_records_keep_the_newest_and_count_the_rest(tmp_path):
    root = logging.getLogger()
    earlier = StartupRecords(2)
    root.addHandler(earlier)
    for i in range(5):
        logging.getLogger("nplt.test.startup").warning("early %d", i)
    out = add_log_file(str(tmp_path / "x.log"), earlier=earlier)
    try:
        logging.getLogger("nplt.test.startup").warning("late")
    finally:
        root.removeHandler(out.handler)
        out.close()
    assert earlier not in root.handlers and earlier.dropped == 3
    assert [line.split(": ", 1)[1] for line in (tmp_path / "x.log").read_text().splitlines()] == \
        ["early 3", "early 4", "late"]
