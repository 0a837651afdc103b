"""v2 HISTORY_REQUEST: one frame per reply, cut by encoded size, errors as one JSON error document."""
from __future__ import annotations

import json

import pytest

from storage.models import ToolCall
from testkit.server import running_server
from testkit.v2client import CHAT_TEXT, HISTORY_REQUEST, V2Client, welcome_session

FRAME = 65535


async def _history(v2: V2Client, request: bytes | str = b"") -> tuple[dict, int]:
    v2.send(HISTORY_REQUEST, request)
    t, payload = await v2.recv()
    assert t == CHAT_TEXT and 0 < len(payload) <= FRAME
    return json.loads(payload.decode("utf-8")), len(payload)


async def test_one_oversized_message_keeps_as_much_content_as_fits(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)
        sid = welcome_session(welcome)
        cjk = "中" * 25000           # 75 KB of UTF-8
        quotes = '"' * 70000         # 70 KB, but 140 KB once JSON-escaped
        await srv.store.append(sid, "assistant", cjk)
        await srv.store.append(sid, "assistant", quotes)
        for before, full in ((3, quotes), (2, cjk)):  # one message per page
            doc, size = await _history(v2, json.dumps({"before": before, "limit": 1}))
            m = doc["messages"][0]
            assert m["metadata"]["truncated"] is True and m["content"].endswith("…")
            kept = m["content"][:-1]
            assert full.startswith(kept)
            assert size > FRAME - 1000  # nearly the whole frame is used
            assert len(json.dumps(kept, ensure_ascii=False).encode()) > FRAME - 1500
        assert v2.only_v2_codes()
        await v2.close()


async def test_tool_results_and_metadata_are_cut_before_the_content(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)
        sid = welcome_session(welcome)
        calls = [ToolCall(id=f"c{i}", tool_name="read_log", arguments={"path": "/var/log/x"},
                          result="é" * 15000) for i in range(3)]  # 3 x 30 KB of results
        await srv.store.append(sid, "assistant", "the answer itself", tool_calls=calls,
                               metadata={"blob": "y" * 50000, "model": "echo"})
        doc, size = await _history(v2)
        m = doc["messages"][0]
        assert m["content"] == "the answer itself"
        assert m["metadata"]["truncated"] is True and m["metadata"]["model"] == "echo"
        assert "blob" not in m["metadata"]  # a big metadata entry goes before the tool results
        assert [c["id"] for c in m["tool_calls"]] == ["c0", "c1", "c2"]
        results = [c["result"] for c in m["tool_calls"]]
        assert any(r.endswith("…") for r in results)
        assert all(r.rstrip("…") == "é" * len(r.rstrip("…")) for r in results)  # no split character
        assert sum(len(r) for r in results) > 25000  # cut only as much as needed
        assert size > FRAME - 2000
        await v2.close()


async def test_history_errors_are_json_error_documents(tmp_path):
    async with running_server(tmp_path, max_page_size=5) as (srv, addr):
        v2, _ = await V2Client.connect(addr)
        for i in range(4):
            v2.send(CHAT_TEXT, f"q{i}")
            await v2.read_answer()
        for bad, field in ((b'{"before": 0}', "before"), (b'{"limit": 0}', "limit"), (b'{"limit": -3}', "limit"),
                           (b'{"before": "12"}', "before"), (b'{"limit": true}', "limit"),
                           (b'{"limit": 1.5}', "limit"), (b"[1, 2]", None), (b"{broken", None)):
            doc, _ = await _history(v2, bad)
            assert set(doc) == {"error"}, bad
            assert doc["error"]["code"] == "INVALID_MESSAGE", bad
            assert field is None or f"'{field}'" in doc["error"]["message"], (bad, doc)
        doc, _ = await _history(v2, json.dumps({"before": "x" * 60000}))
        assert len(doc["error"]["message"]) < 300  # client input is not echoed in full
        doc, _ = await _history(v2, b'{"limit": 1000}')  # over max_page_size: clamped
        assert len(doc["messages"]) == 5 and doc["has_more"] is True
        doc, _ = await _history(v2, b'{"limit": null}')  # null: the default (50, clamped to 5)
        assert len(doc["messages"]) == 5
        assert v2.only_v2_codes()
        await v2.close()


@pytest.mark.parametrize("n", [3, 40])
async def test_a_page_too_big_for_one_frame_leaves_older_messages_for_the_next(tmp_path, n):
    async with running_server(tmp_path) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)
        sid = welcome_session(welcome)
        for i in range(n):
            await srv.store.append(sid, "user", f"{i:03d}" + "ü" * 6000)
        seen: list[str] = []
        request: dict = {}
        while True:
            doc, _ = await _history(v2, json.dumps(request))
            assert doc["messages"], doc
            seen[:0] = [m["content"][:3] for m in doc["messages"]]
            assert all(not m["metadata"].get("truncated") for m in doc["messages"])
            if not doc["has_more"]:
                break
            request = {"before": doc["next_before"]}
        assert seen == [f"{i:03d}" for i in range(n)]
        await v2.close()
