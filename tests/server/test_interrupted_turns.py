"""Issue 15, item 5: a turn running when the server is SIGKILLed is closed at the next start with an
assistant message marked ``interrupted`` (partial, finish_reason "interrupted"), once.

The server is a real process whose LLM (the scripted OpenAI-compatible server) streams part of an
answer and stalls, so the turn is surely running when SIGKILL arrives.
"""
from __future__ import annotations

import asyncio
import json
import threading

from protocol import MsgType
from server.inflight import MARKER_NAME, InFlightTurns, read_marker
from storage import HistoryStore, StorageConfig
from testkit.process import ServerProcess
from testkit.scripted_llm import Reply, ScriptedLLM
from testkit.server import V3Client, poll

T = MsgType


async def test_a_turn_killed_mid_stream_is_closed_as_interrupted_once(tmp_path):
    data = tmp_path / "data"
    async with ScriptedLLM() as llm:
        env = {"NPLT_LLM_BASE_URL": llm.base_url}
        llm.push(Reply.text("first answer"), Reply.stalled("partial ", "answer"))
        srv = await ServerProcess.start(data, env=env)
        try:
            c = await V3Client.connect(srv.addr)
            sid = c.session_id
            first = await c.call(T.CHAT_TEXT, text="a finished question")
            assert (await c.turn_events(first["turn_id"], timeout=30))[-1].type == T.TURN_END
            r = await c.call(T.CHAT_TEXT, text="a question cut short")
            streamed = ""
            while streamed != "partial answer":   # the turn now waits on the stalled LLM
                streamed += (await c.wait_type(T.ANSWER_DELTA, timeout=30, turn_id=r["turn_id"])).body["text"]
        finally:
            srv.kill()
        await c.close()
        assert sid in read_marker(str(data / MARKER_NAME))

        for _ in range(2):   # restarted twice: closed by the first start, not again by the second
            srv = await ServerProcess.start(data, env=env)
            try:
                c = await V3Client.connect(srv.addr, session_id=sid)
                page = await c.call(T.HISTORY_REQUEST, session_id=sid)
                export = await c.call(T.HISTORY_EXPORT, session_id=sid, format="markdown")
                await c.close()
            finally:
                assert await srv.stop() == 0
    msgs = page["messages"]
    assert [(m["role"], m["content"]) for m in msgs] == [
        ("user", "a finished question"), ("assistant", "first answer"),
        ("user", "a question cut short"), ("assistant", "")]
    meta = msgs[-1]["metadata"]
    assert meta["interrupted"] is True and meta["partial"] is True and meta["finish_reason"] == "interrupted"
    assert meta["answers"] == msgs[-2]["id"] and meta["model"]
    assert "finish_reason" not in msgs[1]["metadata"] or msgs[1]["metadata"]["finish_reason"] == "stop"
    assert "interrupted" in json.dumps(export)
    assert read_marker(str(data / MARKER_NAME)) == []
    store = HistoryStore(StorageConfig(root=str(data)))
    try:
        assert [m.role for m in store.messages(sid)] == ["user", "assistant", "user", "assistant"]
    finally:
        store.close()


async def test_the_marker_names_running_sessions_only(tmp_path):
    path = str(tmp_path / MARKER_NAME)
    marker = InFlightTurns(path)
    await marker.started("a")
    await marker.started("b")
    marker.ended("a")
    await marker.started("c")
    await asyncio.to_thread(marker.close)
    assert read_marker(path) == ["b", "c"]
    with open(path, "rb") as f:
        assert b"a" not in f.read()   # an ended turn's session is not kept in the file
    with open(path, "ab") as f:
        f.write(b"-c\n+d")   # a torn last line still names its session
    assert read_marker(path) == ["b", "d"]
    assert read_marker(str(tmp_path / "missing")) == []


async def test_turn_ends_waiting_for_the_marker_thread_share_one_rewrite(tmp_path, monkeypatch):
    path = str(tmp_path / MARKER_NAME)
    marker = InFlightTurns(path)
    for sid in "abcdef":
        await marker.started(sid)
    rewrites: list[tuple[str, ...]] = []
    real = marker._rewrite
    monkeypatch.setattr(marker, "_rewrite", lambda keep: (rewrites.append(tuple(keep)), real(keep))[1])
    gate = threading.Event()
    marker._pool.submit(gate.wait, 30)              # the marker thread is busy meanwhile
    for sid in "abc":
        marker.ended(sid)                           # one rewrite queued, the next two join it
    fut = asyncio.ensure_future(marker.started("g"))   # its line is queued after that rewrite
    await poll(lambda: "g" in marker._running, 30, "started('g') has run")
    marker.ended("d")                               # so this end queues a rewrite of its own
    gate.set()
    await fut
    # d's rewrite, queued after the +g line, has run (else g's end would join it: a race)
    await poll(lambda: len(rewrites) >= 2, 30, "d's rewrite has run")
    marker.ended("g")                               # another rewrite, after the +g line
    await asyncio.to_thread(marker.close)
    assert rewrites == [("e", "f", "g"), ("e", "f", "g"), ("e", "f")]  # each writes what runs when it runs
    assert read_marker(path) == ["e", "f"]
    with open(path, "rb") as f:
        assert f.read() == b"+e\n+f\n"
