"""A snapshot whose record is not the session its file name says (a backup restored under the wrong
name, another user's file copied over a session) is a corrupt snapshot: moved to quarantine/ with
an ERROR naming both ids, never served. Before, it loaded silently: the other session was listed
twice and its search hits doubled, the copy could be neither renamed, deleted nor purged (NOT_FOUND)
yet stayed listed across restarts, and a session overwritten by another user's file vanished
from its owner without a word (and that user's listing showed it under the wrong id).

Over a real server (TCP loopback, two users), then the same at the store level for a file
replaced while the store runs, and for a record that gives the session to another user."""
from __future__ import annotations

import json
import shutil

import pytest

from protocol import MsgType as T
from server.auth import hash_token
from storage import HistoryStore, StorageConfig
from storage.errors import CorruptSession, NotFound
from storage.ids import journal_name, snapshot_name
from testkit.process import ServerProcess
from testkit.server import ReplyError, V3Client

GHOST = "s_20261127_aaaaaaaaaaaa"


async def chat(c: V3Client, sid: str, text: str) -> None:
    r = await c.call(T.CHAT_TEXT, session_id=sid, text=text)
    assert (await c.turn_events(r["turn_id"], timeout=30))[-1].type == T.TURN_END


def errors(srv: ServerProcess) -> list[str]:
    recs = [json.loads(line) for line in srv.log_path.read_text().splitlines() if line.startswith("{")]
    return [r["msg"] for r in recs if r["level"] == "error"]


async def test_a_copied_or_misplaced_snapshot_is_quarantined_not_served(tmp_path) -> None:
    data, config = tmp_path / "data", tmp_path / "server.toml"
    config.write_text('[auth]\nusers = [{ user_id = "alice", token_sha256 = "%s" }, '
                      '{ user_id = "bob", token_sha256 = "%s" }]\n' % (hash_token("ta"), hash_token("tb")))
    srv = await ServerProcess.start(data, "--config", str(config))
    try:
        a = await V3Client.connect(srv.addr, token="ta")
        alice = a.session_id
        await chat(a, alice, "alice private note")
        b = await V3Client.connect(srv.addr, token="tb")
        bob = b.session_id
        await chat(b, bob, "bob secret kumquat")
        await a.close()
        await b.close()
    finally:
        assert await srv.stop() == 0
    # a copy of bob's session under another name, and bob's session file over alice's
    shutil.copy(data / snapshot_name(bob), data / snapshot_name(GHOST))
    shutil.copy(data / snapshot_name(bob), data / snapshot_name(alice))

    for restart in range(2):              # the second start finds nothing left to quarantine
        srv = await ServerProcess.start(data, "--config", str(config))
        try:
            b = await V3Client.connect(srv.addr, token="tb", new_session=False)
            listed = [s["session_id"] for s in (await b.call(T.SESSION_LIST))["sessions"]]
            assert listed == [bob]                                    # once, under its own id
            hits = (await b.call(T.HISTORY_SEARCH, query="kumquat"))["hits"]
            assert [h["session_id"] for h in hits] == [bob]           # not doubled
            for sid in (GHOST, alice):
                with pytest.raises(ReplyError) as ei:
                    await b.call(T.HISTORY_REQUEST, session_id=sid)
                assert ei.value.code == "NOT_FOUND"
            await b.close()
            a = await V3Client.connect(srv.addr, token="ta", new_session=False)
            assert [s["session_id"] for s in (await a.call(T.SESSION_LIST))["sessions"]] == []
            with pytest.raises(ReplyError) as ei:
                await a.call(T.HISTORY_REQUEST, session_id=alice)     # not bob's conversation
            assert ei.value.code == "NOT_FOUND"
            await a.close()
        finally:
            assert await srv.stop() == 0
        if restart == 0:
            errs = errors(srv)
            assert any(f"session '{bob}' of user 'bob', not session '{GHOST}'" in m for m in errs)
            assert any(f"session '{bob}' of user 'bob', not session '{alice}'" in m for m in errs)
    quarantined = sorted(p.name.rsplit(".", 1)[0] for p in (data / "quarantine").iterdir())
    assert quarantined == sorted([snapshot_name(GHOST), snapshot_name(alice), journal_name(alice)])
    assert not (data / snapshot_name(GHOST)).exists() and not (data / snapshot_name(alice)).exists()
    assert (data / snapshot_name(bob)).exists()


def test_a_snapshot_replaced_while_the_store_runs_is_refused_at_its_next_load(tmp_path) -> None:
    root = tmp_path / "history"
    store = HistoryStore(StorageConfig(root=str(root)))
    try:
        mine = store.create("alice")
        store.append(mine.session_id, "user", "mine")
        other = store.create("bob")
        store.append(other.session_id, "user", "bob's")
        store.compact(other.session_id)
        store.cache.close_session(store.cache.get(mine.session_id))     # (evicted: read again next)
        shutil.copy(root / snapshot_name(other.session_id), root / snapshot_name(mine.session_id))
        with pytest.raises(CorruptSession):
            store.messages(mine.session_id)
        assert store.list("alice")[0] == [] and [r.session_id for r in store.list("bob")[0]] == [other.session_id]
        assert [m.content for m in store.messages(other.session_id)] == ["bob's"]
    finally:
        store.close()


def test_a_record_that_gives_the_session_to_another_user_is_refused(tmp_path) -> None:
    root = tmp_path / "history"
    store = HistoryStore(StorageConfig(root=str(root)))
    sid = store.create("alice").session_id
    store.append(sid, "user", "alice's words")
    store.close()
    path = root / snapshot_name(sid)
    doc = json.loads(path.read_text())
    doc["session"]["user_id"] = "mallory"
    path.write_text(json.dumps(doc))
    store = HistoryStore(StorageConfig(root=str(root)))       # (index.json still says alice)
    try:
        assert store.list("alice")[0] == [] and store.list("mallory")[0] == []
        with pytest.raises(NotFound):
            store.get(sid)
    finally:
        store.close()
    assert sorted(p.name.rsplit(".", 1)[0] for p in (root / "quarantine").iterdir()) == sorted(
        [snapshot_name(sid), journal_name(sid)])
