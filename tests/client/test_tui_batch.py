"""Delta coalescing in the TUI: queued ANSWER_DELTAs of a turn are rendered with one append."""
from __future__ import annotations

import asyncio
import pytest

from client.config import ClientConfig
from client.events import Event
from client.tui.app import NpltApp
from client.tui.batch import join_deltas, runs
from client.tui.chat import ChatView
from client.tui.message import MessageView
from client.tui.status import StatusLine
from client_testlib import wait_until
from testkit.echo_agent import EchoAgent

SIZE = (110, 40)


def delta(turn: str, offset: int, text: str, session: str = "s1") -> Event:
    return Event("ANSWER_DELTA", {"session_id": session, "turn_id": turn, "offset": offset, "text": text})


def names(batch: list[Event]) -> list[list[str]]:
    return [[e.body["text"] if e.type == "ANSWER_DELTA" else e.type for e in run] for run in runs(batch)]


def test_runs_group_deltas_of_one_turn_until_an_event_that_matters() -> None:
    status = Event("TURN_STATUS", {"session_id": "s1", "turn_id": "t1", "status": "generating"})
    batch = [delta("t1", 0, "a"), delta("t1", 1, "b"), status, delta("t1", 2, "c"), delta("t2", 0, "x"),
             delta("t2", 1, "y", session="s2"), delta("t2", 2, "z", session="s2")]
    assert names(batch) == [["a", "b"], ["TURN_STATUS"], ["c"], ["x"], ["y", "z"]]
    assert runs([]) == []


def test_runs_neutral_events_do_not_split_a_run_and_follow_it() -> None:
    session = Event("SESSION_EVENT", {"kind": "updated", "session": {"session_id": "s1"}})
    notice = Event("NOTICE", {"code": "X", "message": "m"})
    state = Event("STATE", {"state": "reconnecting"})
    end = Event("TURN_END", {"session_id": "s1", "turn_id": "t1"})
    batch = [delta("t1", 0, "a"), session, delta("t1", 1, "b"), notice, delta("t1", 2, "c"), end,
             delta("t2", 0, "x"), state, delta("t2", 1, "y")]
    assert names(batch) == [["a", "b", "c"], ["SESSION_EVENT"], ["NOTICE"], ["TURN_END"], ["x"], ["STATE"], ["y"]]


def test_join_deltas_drops_what_is_already_shown() -> None:
    bodies = [{"offset": 0, "text": "hello "}, {"offset": 6, "text": "wor"}, {"offset": 9, "text": "ld"}]
    assert join_deltas(0, bodies) == "hello world"
    assert join_deltas(8, bodies) == "rld"        # reattached with 8 characters shown: overlap keeps its tail
    assert join_deltas(11, bodies) == ""          # everything is a duplicate
    # a re-sent delta inside a run is dropped, as appending one by one would
    assert join_deltas(0, bodies[:2] + bodies[1:2] + bodies[2:]) == "hello world"


async def test_queued_deltas_render_as_one_append(server, echo: EchoAgent,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _, addr = server
    n = 300
    appends: list[str] = []
    plain_append = MessageView.append

    async def counting_append(self: MessageView, text: str) -> None:
        appends.append(text)
        await plain_append(self, text)
    monkeypatch.setattr(MessageView, "append", counting_append)
    app = NpltApp(ClientConfig(host=addr[0], port=addr[1]))
    async with app.run_test(size=SIZE) as pilot:
        chat = app.query_one(ChatView)
        await wait_until(lambda: app.client.connected and chat.session_id is not None
                         and app.controller._loads == 0, pilot=pilot, what="the first session")
        # hold the event consumer right after TURN_START, so the whole answer queues up in the client
        held, gate = asyncio.Event(), asyncio.Event()
        plain_on_turn = app.controller.on_turn_event

        async def holding(event: Event) -> None:
            await plain_on_turn(event)
            if event.type == "TURN_START":
                held.set()
                await gate.wait()
        app.controller.on_turn_event = holding  # type: ignore[method-assign]
        await app.controller.send(f"!tokens {n}")
        await wait_until(held.is_set, pilot=pilot, what="TURN_START handled")
        # queued behind it: 2 TURN_STATUS, the n deltas, then SESSION_EVENT / TURN_END (the client's
        # queue is internal; its size is the only way to know every delta has arrived)
        await wait_until(lambda: app.client._queue.qsize() >= n + 3, pilot=pilot, what="all deltas queued")
        assert appends == []
        gate.set()
        answer = "tok " * n

        def finished() -> bool:
            return any(m.role == "assistant" and m.message_id and m.turn_id is None and m.content == answer
                       for m in chat.messages())
        await wait_until(finished, pilot=pilot, what="the finished answer")
        assert appends == [answer]     # n deltas, one render
        view = next(m for m in chat.messages() if m.role == "assistant")
        assert view.streamed_chars == len(answer) and not view.is_live and not chat.live
        assert app.query_one(StatusLine).turn_status is None

