"""The server's log file never grows past log_max_bytes: with log_backups = 0 too, where the stdlib's
RotatingFileHandler never rolls over (the file grew without bound); then its older half is cut and
the newest lines are kept, whole."""
from __future__ import annotations

import logging
import re

import pytest

from server.logs import LogFile

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO nplt\.test\.logfile: line (\d+) x+$")


def write_lines(path, backups: int, n: int) -> None:
    out = LogFile(str(path), "text", max_bytes=4096, backups=backups)
    logger = logging.getLogger("nplt.test.logfile")
    logger.propagate, logger.level = False, logging.INFO
    logger.addHandler(out.handler)
    try:
        for i in range(n):
            logger.info("line %d %s", i, "x" * 60)
    finally:
        logger.removeHandler(out.handler)
        out.close()


def test_no_backups_keeps_the_file_under_the_cap_with_the_newest_whole_lines(tmp_path):
    path = tmp_path / "logs" / "server.log"
    write_lines(path, backups=0, n=500)                       # ~50 KB written through a 4 KiB cap
    assert [p.name for p in path.parent.iterdir()] == ["server.log"]
    assert 2048 <= path.stat().st_size <= 4096
    numbers = []
    for line in path.read_text().splitlines():
        m = LINE.match(line)
        assert m, line                                        # only whole lines: cut at a line start
        numbers.append(int(m.group(1)))
    assert numbers == list(range(numbers[0], 500))            # the newest ones, in order, none missing


@pytest.mark.parametrize("backups", [1, 3])
def test_with_backups_it_rotates_as_before(tmp_path, backups):
    path = tmp_path / "server.log"
    write_lines(path, backups=backups, n=500)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server.log"] + [f"server.log.{i}" for i in
                                                                            range(1, backups + 1)]
    assert all(p.stat().st_size <= 4096 for p in tmp_path.iterdir())
    assert "line 499 " in path.read_text()
