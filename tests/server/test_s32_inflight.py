"""Review s32: a ``turns_in_flight.log`` that is not a regular file does not keep the server from
starting, and the log says what was done with it.

- A directory holding a file there: a real ``nplt-server`` starts, the directory (and what it holds)
  is in ``quarantine/``, the marker is a regular file again, and the log names the move (before:
  the log said "removed", ``os.unlink`` failed with EISDIR and the server did not start).
- An empty directory there is removed, and the log says so.
- A symbolic link is moved to ``quarantine/`` itself, its target untouched.
"""
from __future__ import annotations

import json
import os

from server.inflight import MARKER_NAME, read_marker
from testkit.process import ServerProcess


def _records(log_path) -> list[dict]:
    out = []
    for line in log_path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


async def test_a_directory_in_place_of_the_marker_is_set_aside_and_the_server_starts(tmp_path):
    data = tmp_path / "data"
    marker = data / MARKER_NAME
    marker.mkdir(parents=True)
    (marker / "keep.txt").write_text("someone's file")
    srv = await ServerProcess.start(data)
    try:
        assert srv.proc.poll() is None
    finally:
        assert await srv.stop() == 0
    assert marker.is_file() and not marker.is_symlink()          # started anew
    aside = [p for p in (data / "quarantine").iterdir() if p.name.startswith(MARKER_NAME + ".")]
    assert len(aside) == 1 and (aside[0] / "keep.txt").read_text() == "someone's file"
    lines = [r.get("message", r.get("msg", "")) for r in _records(srv.log_path)]
    said = [m for m in lines if MARKER_NAME in m and "quarantine" in m]
    assert said and "moved" in said[0] and str(aside[0]) in said[0], lines
    assert not any("removed" in m for m in lines if MARKER_NAME in m)


def test_an_empty_directory_is_removed_and_a_link_moved_itself(tmp_path, caplog):
    marker = tmp_path / MARKER_NAME
    marker.mkdir()
    with caplog.at_level("ERROR"):
        assert read_marker(str(marker)) == []
    assert not os.path.lexists(marker)
    assert any("an empty directory" in r.getMessage() and "removed" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / "quarantine").exists()

    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"+s_precious\n")
    marker.symlink_to(outside)
    assert read_marker(str(marker)) == []
    aside = list((tmp_path / "quarantine").iterdir())
    assert not os.path.lexists(marker) and len(aside) == 1 and aside[0].is_symlink()
    assert outside.read_bytes() == b"+s_precious\n"
