"""Honest delete over real TCP: the trash (SESSION_LIST deleted), SESSION_RESTORE, SESSION_PURGE and
CLEAR_REQUEST purge; the files on disk are read to prove purged text is gone."""
from __future__ import annotations

from pathlib import Path

import pytest

from protocol import MsgType as T
from storage.models import SummaryRecord
from testkit.server import ReplyError, V3Client, running_server

SECRET = "zanzibar-7731"


def disk_has(root: Path, needle: str) -> list[str]:
    """The files under ``root`` whose bytes contain ``needle``."""
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


async def chat(c: V3Client, text: str, **extra) -> None:
    r = await c.call(T.CHAT_TEXT, text=text, **extra)
    await c.turn_events(r["turn_id"])


async def test_delete_goes_to_the_trash_and_restore_brings_it_back(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        sid = c.session_id
        await chat(c, "remember the trash")
        other = (await c.call(T.SESSION_NEW, title="other"))["session"]["session_id"]
        await c.call(T.SESSION_DELETE, session_id=sid)
        live = await c.call(T.SESSION_LIST)
        trash = await c.call(T.SESSION_LIST, deleted=True)
        assert [s["session_id"] for s in live["sessions"]] == [other]
        assert [s["session_id"] for s in trash["sessions"]] == [sid]
        with pytest.raises(ReplyError) as err:
            await c.call(T.SESSION_SWITCH, session_id=sid)
        assert err.value.code == "NOT_FOUND"

        restored = await c.call(T.SESSION_RESTORE, session_id=sid)
        assert restored["session"]["session_id"] == sid and restored["session"]["message_count"] == 2
        ev = await c.wait_type(T.SESSION_EVENT, kind="restored")
        assert ev.body["session"]["session_id"] == sid
        assert (await c.call(T.SESSION_LIST, deleted=True))["sessions"] == []
        assert {s["session_id"] for s in (await c.call(T.SESSION_LIST))["sessions"]} == {sid, other}
        page = await c.call(T.HISTORY_REQUEST, session_id=sid)
        assert [m["content"] for m in page["messages"]] == ["remember the trash", "echo: remember the trash"]
        # restoring a live session changes nothing; another user's (or a missing) one is NOT_FOUND
        assert (await c.call(T.SESSION_RESTORE, session_id=sid))["session"]["session_id"] == sid
        with pytest.raises(ReplyError) as err:
            await c.call(T.SESSION_RESTORE, session_id="s_20260101_000000000000")
        assert err.value.code == "NOT_FOUND"
        await c.close()


async def test_purge_removes_the_session_from_disk_and_search(tmp_path):
    root = tmp_path / "history"
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        sid = c.session_id
        await chat(c, f"the code word is {SECRET}")
        await srv.store.add_summary(sid, SummaryRecord(f"they talked about {SECRET}", 1, 2))
        keep = (await c.call(T.SESSION_NEW, title="keep"))["session"]["session_id"]
        await chat(c, "nothing secret here")
        await c.call(T.SESSION_DELETE, session_id=sid)
        srv.store.sync.flush()
        assert disk_has(root, SECRET)                      # deleted = in the trash: still stored

        reply = await c.call(T.SESSION_PURGE, session_id=sid)
        assert reply["session_id"] == sid and reply["current"]["session_id"] == keep
        ev = await c.wait_type(T.SESSION_EVENT, kind="purged")
        assert ev.body["session"]["session_id"] == sid
        assert disk_has(root, SECRET) == [] and disk_has(root, sid) == []
        assert (await c.call(T.SESSION_LIST, deleted=True))["sessions"] == []
        assert (await c.call(T.HISTORY_SEARCH, query=SECRET))["hits"] == []
        for req in (T.SESSION_RESTORE, T.SESSION_PURGE, T.SESSION_INFO):
            with pytest.raises(ReplyError) as err:
                await c.call(req, session_id=sid)
            assert err.value.code == "NOT_FOUND"
        await c.close()
    assert disk_has(root, SECRET) == []                     # nor after the store's close (compaction, index)


async def test_purging_a_live_session_deletes_it_first_and_moves_its_clients(tmp_path):
    root = tmp_path / "history"
    async with running_server(tmp_path) as (srv, addr):
        a = await V3Client.connect(addr)
        keep = a.session_id                                    # an older session, left where it is
        sid = (await a.call(T.SESSION_NEW))["session"]["session_id"]
        await chat(a, f"live {SECRET}")
        b = await V3Client.connect(addr, session_id=sid)
        reply = await a.call(T.SESSION_PURGE, session_id=sid)
        assert reply["current"]["session_id"] == keep
        kinds = [(await b.wait_type(T.SESSION_EVENT, kind=k)).body["kind"] for k in ("deleted", "purged")]
        assert kinds == ["deleted", "purged"]
        page = await b.call(T.HISTORY_REQUEST)                 # b was moved with the delete
        assert page["session_id"] == reply["current"]["session_id"] and page["total"] == 0
        assert disk_has(root, SECRET) == []
        await a.close()
        await b.close()


async def test_clear_drops_the_summary_and_purge_removes_the_hidden_text(tmp_path):
    root = tmp_path / "history"
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        sid = c.session_id
        await c.call(T.SESSION_RENAME, title="plain")      # the title is not cleared: not from the text
        await chat(c, f"first {SECRET}")
        await srv.store.add_summary(sid, SummaryRecord("SUMMARY-TEXT of the first turn", 1, 2))
        assert (await c.call(T.SESSION_INFO))["session"]["summary"]["text"].startswith("SUMMARY-TEXT")

        cleared = await c.call(T.CLEAR_REQUEST)
        assert cleared["cleared"] == 2 and cleared["session"]["summary"] is None
        assert (await c.call(T.SESSION_INFO))["session"]["summary"] is None
        for fmt in ("markdown", "json"):
            text = (await c.call(T.HISTORY_EXPORT, format=fmt))["content"]
            assert "SUMMARY-TEXT" not in text and SECRET not in text
        srv.store.sync.flush()
        assert disk_has(root, SECRET)           # a plain clear hides: the text is still stored

        await chat(c, "after the clear")
        cleared = await c.call(T.CLEAR_REQUEST, purge=True)
        assert cleared["cleared"] == 2
        assert disk_has(root, SECRET) == [] and disk_has(root, "SUMMARY-TEXT") == []
        assert disk_has(root, "after the clear") == []
        await chat(c, "a new start")
        page = await c.call(T.HISTORY_REQUEST)
        assert [m["content"] for m in page["messages"]] == ["a new start", "echo: a new start"]
        await c.close()
    async with running_server(tmp_path) as (srv, addr):    # and after a restart
        c = await V3Client.connect(addr, session_id=sid)
        page = await c.call(T.HISTORY_REQUEST)
        assert [m["content"] for m in page["messages"]] == ["a new start", "echo: a new start"]
        await c.close()
    assert disk_has(root, SECRET) == []


async def test_purge_option_also_removes_text_hidden_by_an_earlier_clear(tmp_path):
    root = tmp_path / "history"
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        await c.call(T.SESSION_RENAME, title="plain")
        await chat(c, f"old {SECRET}")
        await c.call(T.CLEAR_REQUEST)
        assert (await c.call(T.CLEAR_REQUEST, purge=True))["cleared"] == 0
        assert disk_has(root, SECRET) == []
        await c.close()
