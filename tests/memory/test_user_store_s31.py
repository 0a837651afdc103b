"""Long-term user memory store and learning, review s31, on both backends (JSON files and
PostgreSQL share ``DocUserMemoryStore``): an item names every statement of it, so clearing one
session keeps what another still says; a withdrawn correction brings back what it replaced; a
request to forget removes what it names (that user's only) and is never kept; documents of the
earlier format are read. The wire tests run a real server over loopback."""
from __future__ import annotations

import hashlib
import json
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import pytest

from memory_testlib import OfflineStub, ScriptedSummarizer, store_turn
from protocol import MsgType as T
from server.app import Server
from server.memory import MemoryConfig, MemoryManager
from server.memory.user_files import JsonUserMemoryStore
from server.memory.user_memory import item_subject, retraction
from server.memory.user_store import DocUserMemoryStore, MemoryItem, UserDoc
from storage.config import StorageConfig
from testkit.server import V3Client, make_config, poll

WHEN = "2026-11-27T10:00:00+00:00"


def said(text: str, session: str, message: int, item_id: str | None = None) -> MemoryItem:
    return MemoryItem(item_id or f"m{session}{message}", "fact", text, session, message, WHEN)


@pytest.fixture(params=["json", "pg"])
async def stores(request, tmp_path) -> AsyncIterator[Any]:
    """``stores()``: a new store on one backend (another process, no cache), all closed at the end;
    ``stores.raw(user, doc)`` writes a stored document as it is."""
    opened: list = []
    if request.param == "json":
        root = tmp_path / "um"

        def make() -> DocUserMemoryStore:
            opened.append(JsonUserMemoryStore(root))
            return opened[-1]

        async def raw(user: str, doc: dict) -> None:
            root.mkdir(parents=True, exist_ok=True)
            (root / (hashlib.sha256(user.encode()).hexdigest()[:32] + ".json")).write_text(json.dumps(doc))
    else:
        from pg.dbs import fresh_database
        from pg.pgserver import shared_server
        from server.memory.user_store_pg import PgUserDocs
        from storage.pg.link import PgLink
        link = PgLink(StorageConfig(url=await fresh_database(shared_server()), pg_retry_backoff_ms=10))
        await link.open()

        def make() -> DocUserMemoryStore:
            opened.append(DocUserMemoryStore(PgUserDocs(link)))
            return opened[-1]

        async def raw(user: str, doc: dict) -> None:
            await link.run(lambda con: con.execute(
                "INSERT INTO nplt_user_memory (user_id, doc, version) VALUES ($1, $2::jsonb, 1)",
                user, json.dumps(doc)), write=True)
    make.raw = raw                                      # type: ignore[attr-defined]
    try:
        yield make
    finally:
        for s in opened:
            await s.close()
        if request.param == "pg":
            await link.close()


async def texts_and_sessions(store: DocUserMemoryStore, user: str = "alice") -> list[tuple[str, list[str]]]:
    return [(i.text, [s for s, _, _ in i.statements()]) for i in await store.list(user)]


# -- 2: a fact another live session states stays ----------------------------------------------------

async def test_a_fact_stated_in_two_sessions_stays_until_its_last_statement_goes(stores):
    s = stores()
    assert await s.add("alice", [said("The backup host is bk-prod-7.", "A", 1)], learned=("A", 1)) != []
    assert await s.add("alice", [said("the backup host is  bk-prod-7", "B", 2)], learned=("B", 2)) == []  # known
    assert await texts_and_sessions(stores()) == [("The backup host is bk-prod-7.", ["A", "B"])]   # stored
    assert await s.forget_session("alice", "A") == 0                 # B still says it
    [item] = await stores().list("alice")
    assert (item.text, item.session_id, item.message_id) == ("The backup host is bk-prod-7.", "B", 2)
    assert await s.forget_messages("alice", "B", [2]) == 1           # its last statement: it goes
    assert await s.list("alice") == []


async def test_a_crash_between_mark_and_removal_keeps_what_another_session_says(stores):
    s = stores()
    await s.add("alice", [said("The vault host is vault-7.", "A", 1), said("Our region is eu-2.", "A", 1, "r")])
    await s.add("alice", [said("The vault host is vault-7.", "B", 4)])
    await s.mark_forgetting("alice", "A")                            # a clear of A began; the process dies
    assert await texts_and_sessions(stores()) == [("The vault host is vault-7.", ["B"])]


async def test_documents_of_the_earlier_format_are_read(stores):
    old = {"user_id": "alice", "learned": {"A": 1}, "forgotten": [["A", 9, "0" * 32]], "pending": [],
           "items": [{"id": "m1", "kind": "fact", "text": "The vault host is vault-7.", "session_id": "A",
                      "message_id": 1, "created_at": WHEN, "source": "rules"}]}
    await stores.raw("alice", old)
    s = stores()
    assert await texts_and_sessions(s) == [("The vault host is vault-7.", ["A"])]
    assert await s.learned("alice", "A") == 1
    await s.add("alice", [said("The vault host is vault-7.", "B", 2)])     # written in the new format
    assert await texts_and_sessions(stores()) == [("The vault host is vault-7.", ["A", "B"])]


def test_a_document_keeps_statements_and_replaced_items_across_a_round_trip():
    item = said("The DB host is db-1.", "A", 1).stated([("A", 1, WHEN), ("B", 3, WHEN)])
    doc = UserDoc([item], {"A": 1}, [], [], [(said("The DB host is db-0.", "A", 0), ("m9", "C", 2))])
    assert UserDoc.from_json(json.loads(json.dumps(doc.to_json("alice")))) == doc


# -- 3: a withdrawn correction brings back what it replaced ----------------------------------------

async def test_a_withdrawn_correction_brings_back_the_fact_it_replaced(stores):
    s = stores()
    await s.add("alice", [said("The prod DB host is db-prod-41.", "D", 1)], key=item_subject)
    await s.add("alice", [said("The prod DB host is db-prod-99 now.", "E", 1)], key=item_subject)
    assert await texts_and_sessions(s) == [("The prod DB host is db-prod-99 now.", ["E"])]
    assert await s.forget_messages("alice", "E", [1]) == 1           # E's message edited away
    assert await texts_and_sessions(stores()) == [("The prod DB host is db-prod-41.", ["D"])]
    # it is an item again: forgetting it holds, and its tombstone from the correction is gone
    [item] = await s.list("alice")
    assert await s.forget("alice", item.id)
    assert await s.add("alice", [said("The prod DB host is db-prod-41.", "D", 1)], key=item_subject) == []


async def test_a_cleared_correction_brings_back_each_fact_it_replaced_whose_session_is_left(stores):
    s = stores()
    await s.add("alice", [said("The DB host is db-1.", "D", 1), said("Answer in Chinese.", "D", 2, "p")],
                key=item_subject)
    await s.add("alice", [said("The DB host is db-2.", "E", 1)], key=item_subject)
    await s.add("alice", [said("The DB host is db-3.", "F", 1)], key=item_subject)
    assert await s.forget_messages("alice", "E", [1]) == 0          # db-2, already replaced, goes for good
    assert await s.forget_session("alice", "F") == 1                  # db-3 goes: db-1 is the newest left
    assert sorted(t for t, _ in await texts_and_sessions(stores())) == ["Answer in Chinese.", "The DB host is db-1."]
    await s.add("alice", [said("The DB host is db-4.", "G", 1)], key=item_subject)
    assert await s.forget_session("alice", "D") == 1                  # (its own session gone: not coming back)
    assert await s.forget_session("alice", "G") == 1
    assert await s.list("alice") == []


async def test_forgetting_a_correction_forgets_what_it_replaced(stores):
    s = stores()
    await s.add("alice", [said("The DB host is db-1.", "D", 1)], key=item_subject)
    [new] = await s.add("alice", [said("The DB host is db-2.", "E", 1)], key=item_subject)
    assert await s.forget("alice", new.id)
    assert await s.forget_session("alice", "E") == 0
    assert await s.list("alice") == []


# -- 1 and 6, through the learning: take back, for that user only -----------------------------------

def manager(store, tmp_path) -> MemoryManager:
    cfg = MemoryConfig.from_dict({"summarization": {"enabled": False}})
    return MemoryManager(cfg, store, OfflineStub(), None, "SYS", user_store=JsonUserMemoryStore(tmp_path / "um"))


def user_file(tmp_path, user: str) -> dict:
    return json.loads((tmp_path / "um" / (hashlib.sha256(user.encode()).hexdigest()[:32] + ".json")).read_text())


async def test_a_request_to_forget_removes_what_it_names_for_that_user_only(store, tmp_path):
    mm = manager(store, tmp_path)
    for user in ("alice", "bob"):
        a = (await store.create(user)).session_id
        await store_turn(store, mm, a, user, "My home address is 12 Elm Street. 我的手机号是13800138000。 "
                         "The DB host is db-1.", "noted")
    await mm.wait_idle()
    b = (await store.create("alice")).session_id
    for text in ("Please forget that my home address is 12 Elm Street.", "别记住我的手机号是13800138000",
                 "Don't remember that my manager is Bob."):
        await store_turn(store, mm, b, "alice", text, "ok")
    await mm.wait_idle()
    assert [i.text for i in await mm.user_memory.list("alice")] == ["The DB host is db-1."]
    assert len(await mm.user_memory.list("bob")) == 3                 # another user's memory is untouched
    doc = user_file(tmp_path, "alice")
    assert "Elm" not in json.dumps(doc) and "13800138000" not in json.dumps(doc)   # not even as replaced
    assert len(doc["forgotten"]) == 2                                 # recorded as forgotten: tombstones
    c = (await store.create("alice")).session_id
    ctx, _ = await store_turn(store, mm, c, "alice", "home address manager 手机号 DB host", "ok")
    prompt = str(ctx.messages[:-1])
    assert "Elm" not in prompt and "13800138000" not in prompt and "Bob" not in prompt and "db-1" in prompt
    await mm.aclose()


async def test_a_value_said_to_hold_no_longer_is_removed_and_comes_back_when_that_is_edited(store, tmp_path):
    mm = manager(store, tmp_path)
    a = (await store.create("alice")).session_id
    b = (await store.create("alice")).session_id
    await store_turn(store, mm, a, "alice", "The prod DB host is db-prod-41.", "noted")
    await store_turn(store, mm, b, "alice", "The prod DB host is db-prod-40 now.", "noted")
    await store_turn(store, mm, b, "alice", "The prod DB host is not db-prod-40 anymore.", "noted")
    await mm.wait_idle()
    assert await mm.user_memory.list("alice") == []
    said_no = [m for m in await store.messages(b) if m.role == "user"][-1]
    await mm.before_supersede(b, "alice", [said_no])                  # that message is edited away
    assert [i.text for i in await mm.user_memory.list("alice")] == ["The prod DB host is db-prod-40 now."]
    await mm.aclose()


async def test_the_summary_model_cannot_keep_what_a_message_asks_to_forget(store, tmp_path):
    agent = ScriptedSummarizer(['[{"kind": "fact", "text": "My home address is 12 Elm Street."}]'])   # every time
    cfg = MemoryConfig.from_dict({"summarization": {"enabled": False, "model": "small"}})
    mm = MemoryManager(cfg, store, agent, None, "SYS", user_store=JsonUserMemoryStore(tmp_path / "um"))
    a = (await store.create("alice")).session_id
    await store_turn(store, mm, a, "alice", "My home address is 12 Elm Street.", "noted")
    await mm.wait_idle()
    assert [i.text for i in await mm.user_memory.list("alice")] == ["My home address is 12 Elm Street."]
    b = (await store.create("alice")).session_id
    await store_turn(store, mm, b, "alice", "Please forget that my home address is 12 Elm Street.", "ok")
    await mm.wait_idle()
    assert len(agent.calls) == 2 and await mm.user_memory.list("alice") == []
    await mm.aclose()


async def test_a_request_to_forget_also_drops_what_the_forgotten_fact_had_replaced(stores):
    s = stores()
    await s.add("alice", [said("The DB host is db-1.", "D", 1)], key=item_subject)
    await s.add("alice", [said("The DB host is db-2.", "E", 1)], key=item_subject)
    await s.add("alice", [retraction("F", 1, ("forget", "the DB host"))], key=item_subject)
    assert await s.list("alice") == []
    assert await s.forget_messages("alice", "E", [1]) == 0              # db-1 does not come back either
    assert await stores().list("alice") == []


# -- over the wire --------------------------------------------------------------------------------

@asynccontextmanager
async def server(tmp_path) -> AsyncIterator[tuple[str, int]]:
    """A real server, offline agent, two users."""
    srv = Server(make_config(tmp_path, users=[("alice", "token-a"), ("bob", "token-b")]))
    addr = await srv.start()
    try:
        yield addr
    finally:
        await srv.stop()


async def turn(c: V3Client, text: str, session_id: str) -> str:
    r = await c.call(T.CHAT_TEXT, text=text, session_id=session_id)
    end = (await c.turn_events(r["turn_id"]))[-1]
    assert end.type == T.TURN_END, end.body
    return end.body["message"]["content"]


async def new_session(c: V3Client) -> str:
    return (await c.call(T.SESSION_NEW))["session"]["session_id"]


async def listed(c: V3Client) -> list[tuple[str, str]]:
    return [(i["text"], i["session_id"]) for i in (await c.call(T.MEMORY_LIST))["items"]]


async def test_over_the_wire_forget_requests_clears_and_edits(tmp_path):
    async with server(tmp_path) as addr:
        alice = await V3Client.connect(addr, token="token-a")
        bob = await V3Client.connect(addr, token="token-b")
        # 1: a request to forget is no fact, and takes back what it names
        a, b = await new_session(alice), await new_session(alice)
        assert (await turn(alice, "My home address is 12 Elm Street.", a)).startswith("Noted:")
        await turn(bob, "My home address is 12 Elm Street.", bob.session_id)
        assert "Noted" not in await turn(alice, "Please forget that my home address is 12 Elm Street.", b)
        assert "Noted" not in await turn(alice, "别记住我的手机号是13800138000", b)
        assert await listed(alice) == []                                   # stored before TURN_END
        assert await listed(bob) == [("My home address is 12 Elm Street.", bob.session_id)]
        # 2: the same fact in two sessions: clearing one keeps the other's
        c, d = await new_session(alice), await new_session(alice)
        await turn(alice, "The backup host is bk-prod-7.", c)
        await turn(alice, "The backup host is bk-prod-7.", d)
        assert await listed(alice) == [("The backup host is bk-prod-7.", c)]
        await alice.call(T.CLEAR_REQUEST, session_id=c)
        await poll(lambda: _is(listed(alice), [("The backup host is bk-prod-7.", d)]), what="the item moved to d")
        e = await new_session(alice)
        assert "bk-prod-7" in await turn(alice, "what is the backup host?", e)     # from long-term memory
        # 3: a correction edited away brings back what it replaced
        f, g = await new_session(alice), await new_session(alice)
        await turn(alice, "The prod DB host is db-prod-41.", f)
        await turn(alice, "The prod DB host is db-prod-99 now.", g)
        assert ("The prod DB host is db-prod-99 now.", g) in await listed(alice)
        page = await alice.call(T.HISTORY_REQUEST, session_id=g)
        mid = [m for m in page["messages"] if m["role"] == "user"][0]["id"]
        r = await alice.call(T.CHAT_EDIT, session_id=g, message_id=mid, text="what time is it")
        await alice.turn_events(r["turn_id"])
        await poll(lambda: _has(listed(alice), ("The prod DB host is db-prod-41.", f)), what="db-prod-41 back")
        assert not [t for t, _ in await listed(alice) if "db-prod-99" in t]
        await alice.close()
        await bob.close()


async def _is(got, want) -> bool:
    return await got == want


async def _has(got, want) -> bool:
    return want in await got
