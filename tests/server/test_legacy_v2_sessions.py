"""v2 session requests: a deleted current session, one-frame replies, ambiguous prefixes."""
from __future__ import annotations

import asyncio
import json
import time

from protocol import MsgType
from protocol.textsplit import cut_text_utf8
from testkit.echo_agent import EchoAgent
from testkit.server import V3Client, running_server
from testkit.v2client import (CHAT_TEXT, CLEAR_REQUEST, HISTORY_REQUEST, MODEL_SWITCH, SESSION_DELETE, SESSION_LIST,
                              V2Client, welcome_session)

FRAME = 65535


def _current(text: str) -> str:
    """The session id after "you are now in session "."""
    return text.split("you are now in session ")[1].split()[0].rstrip(".")


async def test_requests_in_a_session_deleted_behind_its_back_move_the_connection(tmp_path):
    """Belt and braces: a session deleted without SessionService.delete (which moves attached
    connections itself, see the next test) is noticed by the next request that uses it."""
    async with running_server(tmp_path) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)
        first = welcome_session(welcome)
        v3 = await V3Client.connect(addr)
        other = (await v3.call(MsgType.SESSION_NEW))["session"]["session_id"]

        await srv.store.delete(first)
        v2.send(HISTORY_REQUEST)
        doc = json.loads(await v2.recv_text())
        assert doc["error"]["code"] == "NOT_FOUND"
        assert f"Session {first} was deleted" in doc["error"]["message"]
        assert _current(doc["error"]["message"]) == other
        v2.send(HISTORY_REQUEST)  # now served from the new session
        assert json.loads(await v2.recv_text())["session_id"] == other

        await srv.store.delete(other)
        v2.send(CLEAR_REQUEST)
        text = await v2.recv_text()
        assert f"Session {other} was deleted" in text and "Nothing was cleared" in text
        third = _current(text)
        assert third not in (first, other)  # no session was left: a new one was made

        await srv.store.delete(third)
        v2.send(MODEL_SWITCH, "echo-large")
        text = await v2.recv_text()
        assert f"Session {third} was deleted" in text and "not switched" in text
        fourth = _current(text)

        await srv.store.delete(fourth)
        v2.send(CHAT_TEXT, "lost?")
        _, text, chunks = await v2.read_answer()
        assert chunks == 1 and f"Session {fourth} was deleted" in text and "not sent" in text
        fifth = _current(text)
        v2.send(CHAT_TEXT, "hello again")
        _, text, _ = await v2.read_answer()
        assert text == "echo: hello again"

        await srv.store.delete(fifth)
        v2.send(SESSION_LIST)
        text = await v2.recv_text()
        sixth = _current(text)
        assert text.startswith(f"Session {fifth} was deleted") and f"* {sixth}" in text
        sessions = (await v3.call(MsgType.SESSION_LIST))["sessions"]
        assert [s["session_id"] for s in sessions] == [sixth]
        assert v2.only_v2_codes()
        await v2.close()
        await v3.close()


async def test_session_deleted_by_a_v3_client_is_told_after_the_running_answer(tmp_path):
    """The delete moves the v2 connection and tells it in text, never inside an answer."""
    agent = EchoAgent()
    async with running_server(tmp_path, agent) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)
        first = welcome_session(welcome)
        second = await v2.new_session()
        v2.send(CHAT_TEXT, "!block long answer")
        await agent.wait_blocked(1)
        v3 = await V3Client.connect(addr, session_id=first)
        await v3.call(MsgType.SESSION_DELETE, session_id=second)   # cancels the v2 client's turn
        _, text, _ = await v2.read_answer()
        assert text and "echo: !block long answer".startswith(text)   # the partial answer, then its end
        assert await v2.recv_text() == f"Session {second} was deleted; you are now in session {first}."
        v2.send(HISTORY_REQUEST)
        assert json.loads(await v2.recv_text())["session_id"] == first
        assert v2.only_v2_codes()
        agent.release()
        await v2.close()
        await v3.close()


async def test_a_session_list_over_one_frame_is_cut_and_says_so(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)
        first = welcome_session(welcome)
        for i in range(700):  # about 250 bytes a line: 170 KB
            await srv.store.create("local", title=f"session number {i} " + "標題" * 90)
        v2.send(SESSION_LIST)
        t, payload = await v2.recv()
        assert t == CHAT_TEXT and len(payload) <= FRAME
        text = payload.decode("utf-8")
        assert text.startswith("Sessions (701):")
        shown = [line for line in text.splitlines() if line.startswith(("* ", "  "))]
        assert 100 < len(shown) < 701
        assert f"{701 - len(shown)} older sessions not listed" in text
        assert f"Current session: {first}" in text  # the oldest: left out, but named
        v2.send(CHAT_TEXT, "HEARTBEAT")  # still in step: the next frame is the next reply
        assert await v2.recv_text() == "HEARTBEAT"
        await v2.close()


async def test_an_unknown_model_name_is_not_echoed_in_full(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        v2, _ = await V2Client.connect(addr)
        v2.send(MODEL_SWITCH, "m" * 65530)  # the largest v2 payload: an echo would take two frames
        t, payload = await v2.recv()
        assert t == CHAT_TEXT and len(payload) < 1000
        assert payload.decode().startswith("Unknown model 'mmm") and "Available: echo, echo-large" in payload.decode()
        v2.send(CHAT_TEXT, "HEARTBEAT")
        assert await v2.recv_text() == "HEARTBEAT"
        await v2.close()


async def test_delete_with_an_ambiguous_prefix_deletes_nothing(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)
        first = welcome_session(welcome)
        second = await v2.new_session()
        v2.send(SESSION_DELETE, json.dumps({"session_id": "s_"}))
        text = await v2.recv_text()
        assert text.startswith("Error:") and "ambiguous" in text and "'s_'" in text
        v2.send(SESSION_DELETE, "s_")  # bare form too
        assert "ambiguous" in await v2.recv_text()
        v2.send(SESSION_LIST)
        listing = await v2.recv_text()
        assert listing.startswith("Sessions (2):") and first in listing and f"* {second}" in listing
        assert v2.only_v2_codes()
        await v2.close()


def test_cut_text_utf8_keeps_whole_characters():
    """The backstop of every one-frame reply: cut by UTF-8 size, never inside a character."""
    assert cut_text_utf8("short", 10) == "short"
    for text in ("x" * 70000, "中" * 30000, "a😀" * 20000):
        cut = cut_text_utf8(text, 65535)
        data = cut.encode()
        assert len(data) <= 65535 and len(data) > 65535 - 4 - 3
        assert cut.endswith("…") and text.startswith(cut[:-1])


async def test_a_v2_chat_queued_behind_a_v3_turn_and_withdrawn_by_a_clear_ends_cleanly(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)
        sid = welcome_session(welcome)
        v3 = await V3Client.connect(addr, session_id=sid)
        r = await v3.call(MsgType.CHAT_TEXT, text="!block v3 turn")
        await agent.wait_blocked(1)
        v2.send(CHAT_TEXT, "queued behind it")
        await v3.wait_for(lambda m: m.type == MsgType.SESSION_EVENT and m.body["session"]["running"] is True)
        await _wait_queued(srv, sid)
        cleared = await v3.call(MsgType.CLEAR_REQUEST)
        assert cleared["cleared"] == 2
        _, text, _ = await v2.read_answer()
        assert text == "[cancelled before it started; nothing was stored]"
        assert (await v3.turn_events(r["turn_id"]))[-1].body["finish_reason"] == "cancelled"
        v2.send(CHAT_TEXT, "after the clear")
        _, text, _ = await v2.read_answer()
        assert text == "echo: after the clear"
        assert v2.only_v2_codes()
        await v2.close()
        await v3.close()


async def _wait_queued(srv, sid: str, timeout: float = 10.0) -> None:
    """Poll (with a deadline) until the session has a queued turn."""
    deadline = time.monotonic() + timeout
    while not (sid in srv.runner.lanes and srv.runner.lanes[sid].waiting):
        assert time.monotonic() < deadline, "no queued turn"
        await asyncio.sleep(0.005)


async def test_a_v2_connection_failing_on_a_turn_event_is_closed_and_others_are_served(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)
        sid = welcome_session(welcome)
        v3 = await V3Client.connect(addr, session_id=sid)
        conn = next(c for c in srv.connections if c.legacy is not None)

        def broken(*args):
            raise RuntimeError("simulated bug in the v2 translation")
        conn.legacy.on_turn_event = broken
        r = await v3.call(MsgType.CHAT_TEXT, text="still answered")
        events = await v3.turn_events(r["turn_id"])
        assert events[-1].type == MsgType.TURN_END and events[-1].body["message"]["content"] == "echo: still answered"
        assert conn.closing
        await v3.close()
