"""Replies and events over max_message_size: shrunk to fit (never dropped), exports refused."""
from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import MsgType
from server.fit import MARK, SLACK, cut_strings, fit_page, shrink_reply
from testkit.echo_agent import EchoAgent
from testkit.server import ReplyError, V3Client, running_server

T = MsgType


def size(body: dict) -> int:
    return len(orjson.dumps(body))


def test_a_body_that_fits_is_returned_as_is() -> None:
    body = {"message": {"content": "x" * 100}}
    assert cut_strings(body, 1000) is body


@pytest.mark.parametrize("text", ["x", "é", "✓", "\n", "\u0001", '"'])  # 1 to 6 bytes of JSON each
def test_the_longest_texts_are_cut_to_fit_and_marked(text: str) -> None:
    body = {"session_id": "s" * 40, "message": {"id": 3, "content": text * 50_000, "tool_calls": [
        {"id": "c1", "result": "r" * 30_000, "arguments": {"content": "kept: not a str leaf of a call"}},
        {"id": "c2", "result": "short"}]}, "usage": {"text": 5}}
    limit = 20_000
    cut = cut_strings(body, limit)
    assert size(cut) <= limit and cut["truncated"] is True
    assert body["message"]["content"] == text * 50_000          # the original is untouched
    content, result = cut["message"]["content"], cut["message"]["tool_calls"][0]["result"]
    assert content.startswith(text * 10) and "cut by the server" in content
    assert cut["message"]["tool_calls"][1]["result"] == "short"
    assert cut["session_id"] == body["session_id"] and cut["usage"] == {"text": 5}
    # the mark says how much is missing
    kept = content[:content.index(MARK.split("{")[0])]
    assert content.endswith(MARK.format(n=50_000 - len(kept)))
    assert result == "r" * 30_000 or "cut by the server" in result


def test_when_nothing_can_be_cut_the_body_stays_over() -> None:
    body = {"ids": list(range(5000))}
    assert size(cut_strings(body, 1000)) > 1000


def test_fit_page_keeps_the_newest_messages_and_at_least_one() -> None:
    msgs = [{"id": i, "content": "x" * 100} for i in range(11, 21)]
    one = size(msgs[0]) + 1
    assert fit_page(msgs, one * 3) == 3 and fit_page(msgs, one * 100) == 10 and fit_page(msgs, 5) == 1


def test_shrink_reply_pages_then_cuts() -> None:
    msgs = [{"id": i, "content": "x" * 1000} for i in range(1, 21)]
    body = {"session_id": "s", "messages": msgs, "has_more": False, "next_before": None, "total": 20}
    out = shrink_reply(body, 5000 + SLACK, page=True)
    assert size(out) <= 5000 and "truncated" not in out
    ids = [m["id"] for m in out["messages"]]
    assert ids == list(range(21 - len(ids), 21)) and out["has_more"] is True and out["next_before"] == ids[0]
    big = {**body, "messages": [{"id": 7, "content": "y" * 20_000}]}
    out = shrink_reply(big, 5000 + SLACK, page=True)
    assert size(out) <= 5000 and out["truncated"] is True and out["messages"][0]["id"] == 7


async def test_over_tcp_a_huge_answer_still_ends_its_turn_and_pages_through(tmp_path):
    limit = 65535
    async with running_server(tmp_path, EchoAgent(), max_message_size=limit) as (srv, addr):
        c = await V3Client.connect(addr)
        other = await V3Client.connect(addr, session_id=c.session_id)   # a second viewer of the session
        for i in range(3):
            await c.call(T.CHAT_TEXT, text=f"small {i}")
        reply = await c.call(T.CHAT_TEXT, text="!big 200000")
        events = await c.turn_events(reply["turn_id"])
        end = events[-1]
        assert end.type == T.TURN_END and end.body["truncated"] is True
        assert len(orjson.dumps(end.body)) <= limit
        assert "cut by the server" in end.body["message"]["content"]
        assert sum(len(e.body["text"]) for e in events if e.type == T.ANSWER_DELTA) == 200_000  # all streamed
        other_end = await other.wait_type(T.TURN_END, turn_id=reply["turn_id"])
        assert other_end.body["truncated"] is True
        stored = srv.store.sync.page(c.session_id, limit=1).messages[0]
        assert stored.content == "x" * 200_000                      # storage keeps it whole
        # paging walks through everything: the huge message alone (cut), then the older ones
        page = await c.call(T.HISTORY_REQUEST, limit=50)
        assert [m["role"] for m in page["messages"]] == ["assistant"] and page["truncated"] is True
        assert page["has_more"] is True and page["total"] == 8
        seen = page["messages"]
        while page["has_more"]:
            page = await c.call(T.HISTORY_REQUEST, limit=50, before=page["next_before"])
            seen = page["messages"] + seen
        assert [m["id"] for m in seen] == sorted(m["id"] for m in seen) and len(seen) == 8
        with pytest.raises(ReplyError) as info:                    # an export is never cut
            await c.call(T.HISTORY_EXPORT, format="json")
        assert info.value.code == "MESSAGE_TOO_LARGE"
        assert (await c.call(T.PING))["re"]                         # the connection is fine
        await c.close()
        await other.close()


@given(texts=st.lists(st.text(max_size=3000), min_size=1, max_size=6), limit=st.integers(600, 12_000))
def test_property_cut_texts_are_marked_prefixes_and_fit(texts: list[str], limit: int) -> None:
    body = {"id": 1, "calls": [{"result": t, "n": i} for i, t in enumerate(texts)]}
    cut = cut_strings(body, limit)
    floor = {"id": 1, "calls": [{"result": MARK.format(n=len(t)), "n": i} for i, t in enumerate(texts)],
             "truncated": True}                  # every text cut to nothing
    if size(floor) + 200 <= limit:
        assert size(cut) <= limit
    for t, call in zip(texts, cut["calls"]):
        got = call["result"]
        if got != t:
            kept = len(t) - int(got.rsplit(": ", 1)[1].split(" ")[0])
            assert got == t[:kept] + MARK.format(n=len(t) - kept) and cut["truncated"] is True
