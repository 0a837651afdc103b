"""Delta coalescing in the TUI: queued ANSWER_DELTAs of a turn are rendered with one append."""
from __future__ import annotations

import asyncio
import pytest

from client.config import ClientConfig
from client.connection import Client
from client.events import Event, Reconnecting
from client.tui.app import NpltApp
from client.tui.batch import runs
from client.tui.state import join_deltas
from protocol.objects import SessionInfo
from protocol.server_events import AnswerDelta, Notice, SessionEvent, TurnEnd, TurnStart, TurnStatus
from client.tui.chat import ChatView
from client.tui.message import MessageView
from client.tui.status import StatusLine
from client_testlib import wait_until
from testkit.echo_agent import EchoAgent

SIZE = (110, 40)


def delta(turn: str, offset: int, text: str, session: str = "s1") -> AnswerDelta:
    return AnswerDelta(session, turn, text, offset)


def names(batch: list[Event]) -> list[list[str]]:
    return [[e.text if isinstance(e, AnswerDelta) else type(e).__name__ for e in run] for run in runs(batch)]


def test_runs_group_deltas_of_one_turn_until_an_event_that_matters() -> None:
    status = TurnStatus("s1", "t1", "generating")
    batch = [delta("t1", 0, "a"), delta("t1", 1, "b"), status, delta("t1", 2, "c"), delta("t2", 0, "x"),
             delta("t2", 1, "y", session="s2"), delta("t2", 2, "z", session="s2")]
    assert names(batch) == [["a", "b"], ["TurnStatus"], ["c"], ["x"], ["y", "z"]]
    assert runs([]) == []


def test_runs_neutral_events_do_not_split_a_run_and_follow_it() -> None:
    session = SessionEvent("updated", SessionInfo("s1", "title"))
    notice = Notice("info", "X", "m")
    state = Reconnecting(1, 0.1, "gone")
    end = TurnEnd("s1", "t1", None)
    batch = [delta("t1", 0, "a"), session, delta("t1", 1, "b"), notice, delta("t1", 2, "c"), end,
             delta("t2", 0, "x"), state, delta("t2", 1, "y")]
    assert names(batch) == [["a", "b", "c"], ["SessionEvent"], ["Notice"], ["TurnEnd"], ["x"], ["Reconnecting"], ["y"]]


def test_join_deltas_drops_what_is_already_shown() -> None:
    bodies = [delta("t1", 0, "hello "), delta("t1", 6, "wor"), delta("t1", 9, "ld")]
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
    async with Client(*addr) as c:        # the user's session (HELLO gives a user without one none)
        await c.session_new()
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
            if isinstance(event, TurnStart):
                held.set()
                await gate.wait()
        app.controller.on_turn_event = holding  # type: ignore[method-assign]
        await app.controller.send(f"!tokens {n}")
        await wait_until(held.is_set, pilot=pilot, what="TURN_START handled")
        # queued behind it: 2 TURN_STATUS, the n deltas, then SESSION_EVENT / TURN_END (the client's
        # queue is internal; its size is the only way to know every delta has arrived)
        await wait_until(lambda: app.client.link._queue.qsize() >= n + 3, pilot=pilot, what="all deltas queued")
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

