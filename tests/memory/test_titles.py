"""SessionTitles: the titles long-term memory items name their sessions by (cached, TTL_S)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from server.memory.titles import MAX_TITLE_CHARS, TTL_S, SessionTitles, shown_title
from storage import NotFound


class Records:
    """A store's ``get`` over a dict of session id -> (title, deleted), counting reads."""

    def __init__(self, **titles: str) -> None:
        self.titles = dict(titles)
        self.deleted: set[str] = set()
        self.auto: set[str] = set()
        self.reads: list[str] = []
        self.fail: set[str] = set()

    async def get(self, session_id: str):
        self.reads.append(session_id)
        await asyncio.sleep(0)
        if session_id in self.fail:
            raise OSError("storage down")
        if session_id not in self.titles:
            raise NotFound(session_id)
        return SimpleNamespace(title=self.titles[session_id], deleted=session_id in self.deleted,
                               title_auto=session_id in self.auto)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_titles_are_read_once_then_kept_until_they_expire_or_are_forgotten():
    store, clock = Records(s1="Prod DB", s2="Staging"), Clock()
    titles = SessionTitles(store, clock)
    assert await titles.of(["s1", "s2", "s1"]) == {"s1": "Prod DB", "s2": "Staging"}
    assert sorted(store.reads) == ["s1", "s2"]                     # each session read once
    store.titles["s1"] = "Prod DB (renamed)"
    assert await titles.of(["s1"]) == {"s1": "Prod DB"}           # cached: no read
    assert len(store.reads) == 2
    clock.now += TTL_S                                             # expired: read again
    assert await titles.of(["s1"]) == {"s1": "Prod DB (renamed)"}
    store.titles["s2"] = "Staging 2"
    titles.forget("s2")                                            # this node renamed it: read at once
    assert await titles.of(["s2"]) == {"s2": "Staging 2"}
    assert store.reads.count("s2") == 2


async def test_a_session_without_a_title_the_user_gave_it_is_left_out_so_its_id_names_it():
    store = Records(s1="", s2="Gone", s3="Down", s5="New chat", s6="The prod DB host is db-prod-42")
    store.deleted.add("s2")
    store.fail.add("s3")
    store.auto.add("s6")              # made from the first message: would quote it again
    titles = SessionTitles(store, Clock())
    assert await titles.of(["s1", "s2", "s3", "s4", "s5", "s6"]) == {}   # empty, deleted, error, not found,
    #                                                                       default, automatic
    store.fail.clear()
    assert await titles.of(["s3"]) == {"s3": "Down"}               # an error is not cached: read next turn


async def test_cancellation_is_not_swallowed():
    class Cancelling(Records):
        async def get(self, session_id: str):
            raise asyncio.CancelledError()
    with pytest.raises(asyncio.CancelledError):
        await SessionTitles(Cancelling(s1="x"), Clock()).of(["s1"])


def test_a_title_is_quoted_on_one_line_without_double_quotes_and_cut():
    assert shown_title('  Prod\n"DB"\tnotes ') == "Prod 'DB' notes"
    long = shown_title("word " * 40)
    assert len(long) == MAX_TITLE_CHARS and long.endswith("…")
