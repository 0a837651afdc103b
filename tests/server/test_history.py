"""History requests: paging with cursors and the page-size limit, search, export (fragmented)."""
from __future__ import annotations

import json

import pytest

from protocol import MsgType
from testkit.server import ReplyError, V3Client, running_server

T = MsgType


async def test_history_pages_newest_first_with_cursor(tmp_path):
    async with running_server(tmp_path, max_page_size=4) as (srv, addr):
        c = await V3Client.connect(addr)
        for i in range(5):  # 10 messages, ids 1..10
            r = await c.call(T.CHAT_TEXT, text=f"message {i}")
            await c.turn_events(r["turn_id"])
        p1 = await c.call(T.HISTORY_REQUEST, limit=4)
        assert [m["id"] for m in p1["messages"]] == [7, 8, 9, 10]
        assert p1["has_more"] is True and p1["next_before"] == 7 and p1["total"] == 10
        assert p1["session_id"] == c.session_id
        p2 = await c.call(T.HISTORY_REQUEST, limit=4, before=p1["next_before"])
        assert [m["id"] for m in p2["messages"]] == [3, 4, 5, 6]
        p3 = await c.call(T.HISTORY_REQUEST, limit=4, before=p2["next_before"])
        assert [m["id"] for m in p3["messages"]] == [1, 2] and p3["has_more"] is False
        m = p3["messages"][1]
        assert set(m) >= {"id", "role", "content", "timestamp", "tool_calls", "metadata"}
        with pytest.raises(ReplyError) as err:
            await c.call(T.HISTORY_REQUEST, limit=5)
        assert err.value.code == "INVALID_MESSAGE" and err.value.body["message"] == \
            "field 'limit': expected an integer in 1..4, got 5"
        with pytest.raises(ReplyError) as err:
            await c.call(T.HISTORY_REQUEST, limit="x")
        assert err.value.code == "INVALID_MESSAGE" and "'limit'" in err.value.body["message"]
        await c.close()


async def test_search_across_the_users_sessions(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        first = c.session_id
        r = await c.call(T.CHAT_TEXT, text="nginx keeps restarting")
        await c.turn_events(r["turn_id"])
        second = (await c.call(T.SESSION_NEW))["session"]["session_id"]
        r = await c.call(T.CHAT_TEXT, text="postgres is slow")
        await c.turn_events(r["turn_id"])
        hits = (await c.call(T.HISTORY_SEARCH, query="nginx"))["hits"]
        assert hits and {h["session_id"] for h in hits} == {first}
        assert set(hits[0]) >= {"session_id", "title", "message_id", "role", "snippet", "timestamp", "score"}
        assert (await c.call(T.HISTORY_SEARCH, query="nginx", session_id=second))["hits"] == []
        assert len((await c.call(T.HISTORY_SEARCH, query="nginx", session_id=first))["hits"]) == 2
        with pytest.raises(ReplyError) as err:
            await c.call(T.HISTORY_SEARCH, query="")
        assert err.value.code == "INVALID_MESSAGE"
        await c.close()


async def test_export_markdown_and_json_and_large_exports_are_fragmented(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        r = await c.call(T.CHAT_TEXT, text="export me")
        await c.turn_events(r["turn_id"])
        md = await c.call(T.HISTORY_EXPORT, format="markdown")
        assert md["format"] == "markdown" and "export me" in md["content"]
        js = await c.call(T.HISTORY_EXPORT, format="json")
        assert "echo: export me" in js["content"] and json.loads(js["content"])
        with pytest.raises(ReplyError) as err:
            await c.call(T.HISTORY_EXPORT, format="pdf")
        assert err.value.code == "INVALID_MESSAGE" and "'format'" in err.value.body["message"]
        r = await c.call(T.CHAT_TEXT, text="!big 300000")  # a 300 KB answer
        await c.turn_events(r["turn_id"])
        frames_before = c.codec.rx_seq
        big = await c.call(T.HISTORY_EXPORT, format="json")
        assert len(big["content"]) > 300_000
        assert (c.codec.rx_seq - frames_before) % 65536 >= 5  # arrived as several frames
        await c.close()


async def test_export_header_names_the_model_session_info_shows(tmp_path):
    """A session on the default model stores none; its export names the effective model anyway."""
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        r = await c.call(T.CHAT_TEXT, text="which model?")
        await c.turn_events(r["turn_id"])
        assert (await c.call(T.SESSION_INFO))["session"]["model"] == "echo"
        md = (await c.call(T.HISTORY_EXPORT, format="markdown"))["content"]
        assert "- Model: echo\n" in md
        assert json.loads((await c.call(T.HISTORY_EXPORT, format="json"))["content"])["session"]["model"] == "echo"
        await c.call(T.MODEL_SWITCH, model="echo-large")
        assert "- Model: echo-large\n" in (await c.call(T.HISTORY_EXPORT, format="markdown"))["content"]
        doc = json.loads((await c.call(T.HISTORY_EXPORT, format="json"))["content"])
        assert doc["session"]["model"] == "echo-large"
        await c.close()


async def test_export_over_the_message_cap_is_a_clear_error(tmp_path):
    async with running_server(tmp_path, max_message_size=65535) as (srv, addr):
        c = await V3Client.connect(addr)
        for _ in range(2):  # each answer fits the cap, the export of both does not
            r = await c.call(T.CHAT_TEXT, text="!big 40000")
            await c.turn_events(r["turn_id"])
        with pytest.raises(ReplyError) as err:
            await c.call(T.HISTORY_EXPORT, format="markdown")
        assert err.value.code == "MESSAGE_TOO_LARGE"
        assert (await c.call(T.PING))["re"]  # still usable
        await c.close()
