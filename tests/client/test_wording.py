"""The clients' wording of counts and times: the server's UTC timestamps in the user's local zone."""
from __future__ import annotations

import time
from typing import Iterator

import pytest

from client.wording import clock, compact, counted, minute, stamp


@pytest.fixture
def shanghai(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "Asia/Shanghai")
    time.tzset()
    try:
        yield
    finally:
        monkeypatch.undo()
        time.tzset()


def test_counts_take_their_plural() -> None:
    assert [counted(n, "chunk") for n in (0, 1, 2)] == ["0 chunks", "1 chunk", "2 chunks"]


def test_times_are_shown_in_the_local_zone(shanghai: None) -> None:
    utc = "2026-11-20T22:15:09+00:00"                 # the next day in Shanghai (UTC+8)
    assert stamp(utc) == "2026-11-21 06:15 CST"
    assert stamp(utc, seconds=True) == "2026-11-21 06:15:09 CST"
    assert minute(utc) == "2026-11-21 06:15"
    assert clock(utc) == "06:15"
    assert compact(utc) == "2026-11-21"


def test_unparsable_times_are_not_invented() -> None:
    assert stamp("yesterday-ish") == "yesterday-ish" and stamp(None) == ""
    assert minute("x") == clock("x") == compact("") == ""
