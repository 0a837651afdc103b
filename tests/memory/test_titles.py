"""SessionTitles: the titles long-term memory items name their sessions by (cached, TTL_S)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from server.memory.titles import MAX_TITLE_CHARS, TTL_S, SessionTitles, shown_title
from storage import StorageUnavailable


class Records:
    """A store's ``records`` over a dict of session id -> title, counting reads."""

    def __init__(self, **titles: str) -> None:
        self.titles = dict(titles)
        self.deleted: set[str] = set()
        self.auto: set[str] = set()
        self.reads: list[list[str]] = []
        self.fail = False

    async def records(self, session_ids):
        ids = list(session_ids)
        self.reads.append(ids)
        await asyncio.sleep(0)
        if self.fail:
            raise StorageUnavailable("storage down")
        return {sid: SimpleNamespace(title=self.titles[sid], deleted=sid in self.deleted, title_auto=sid in self.auto)
                for sid in ids if sid in self.titles}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_titles_are_read_once_then_kept_until_they_expire_or_are_forgotten():
    store, clock = Records(s1="Prod DB", s2="Staging"), Clock()
    titles = SessionTitles(store, clock)
    assert await titles.of(["s1", "s2", "s1"]) == {"s1": "Prod DB", "s2": "Staging"}
    assert store.reads == [["s1", "s2"]]                           # one read, each session once
    store.titles["s1"] = "Prod DB (renamed)"
    assert await titles.of(["s1"]) == {"s1": "Prod DB"}           # cached: no read
    assert len(store.reads) == 1
    clock.now += TTL_S                                             # expired: read again
    assert await titles.of(["s1"]) == {"s1": "Prod DB (renamed)"}
    store.titles["s2"] = "Staging 2"
    titles.forget("s2")                                            # this node renamed it: read at once
    assert await titles.of(["s2"]) == {"s2": "Staging 2"}
    assert store.reads[1:] == [["s1"], ["s2"]]


async def test_a_session_without_a_title_the_user_gave_it_is_left_out_so_its_id_names_it():
    store = Records(s1="", s2="Gone", s3="Down", s5="New chat", s6="The prod DB host is db-prod-42")
    store.deleted.add("s2")
    store.auto.add("s6")              # made from the first message: would quote it again
    titles = SessionTitles(store, Clock())
    assert await titles.of(["s1", "s2", "s4", "s5", "s6"]) == {}   # empty, deleted, gone, default, automatic
    store.fail = True
    assert await titles.of(["s3"]) == {}                           # storage down: named by its id
    store.fail = False
    assert await titles.of(["s3"]) == {"s3": "Down"}               # an error is not cached: read next turn


def test_a_title_is_quoted_on_one_line_without_double_quotes_and_cut():
    assert shown_title('  Prod\n"DB"\tnotes ') == "Prod 'DB' notes"
    long = shown_title("word " * 40)
    assert len(long) == MAX_TITLE_CHARS and long.endswith("…")
