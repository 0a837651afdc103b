"""ChatState without Textual and without I/O: typed events and replies in, Changes out."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from client.tui.state import (NOT_SAVED, AppendAnswer, ChatState, EndAnswer, OpenAnswer, SettleQueued, ShowMessage,
                              ShowQueued, ShowTool, StatusChanged, join_deltas)
from protocol import ErrorCode
from protocol.objects import ChatMessage, QueuedTurn, SessionInfo, ToolCall, TurnState
from protocol.replies import ChatSendReply, HistoryPageReply
from protocol.server_events import (AnswerDelta, ToolCallEvent, ToolResultEvent, TurnEnd, TurnError, TurnStart,
                                    TurnStatus)

S = SessionInfo("s1", "Chat")


def user(mid: int | None, text: str) -> ChatMessage:
    return ChatMessage(mid, "user", text, "t", metadata={} if mid is not None else {"queued": True})


def answer(mid: int, text: str) -> ChatMessage:
    return ChatMessage(mid, "assistant", text, "t")


def state() -> ChatState:
    st = ChatState()
    assert st.begin(S) == [StatusChanged(None)]
    return st


def kinds(changes: list) -> list[str]:
    return [type(c).__name__ for c in changes]


def test_a_turn_from_start_to_end() -> None:
    st = state()
    changes = st.apply(TurnStart("s1", "t1", user(1, "hi"), "echo"))
    assert kinds(changes) == ["ShowMessage", "OpenAnswer", "StatusChanged"]
    assert changes[0] == ShowMessage(user(1, "hi")) and changes[-1] == StatusChanged("thinking")
    assert st.live_turn == "t1"
    assert st.apply(TurnStatus("s1", "t1", "tool_call", "sys_monitor")) == [StatusChanged("tool_call", "sys_monitor")]
    call = ToolCall("c1", "sys_monitor", {"metric": "cpu"})
    assert st.apply(ToolCallEvent("s1", "t1", call)) == [ShowTool("t1", call)]
    done = ToolCall("c1", "sys_monitor", {"metric": "cpu"}, "5%", "success", 0.1)
    assert st.apply(ToolResultEvent("s1", "t1", done)) == [ShowTool("t1", done)]
    assert st.apply(AnswerDelta("s1", "t1", "hel", 0)) == [AppendAnswer("t1", "hel")]
    assert st.apply(AnswerDelta("s1", "t1", "lo", 3)) == [AppendAnswer("t1", "lo")]
    end = st.apply(TurnEnd("s1", "t1", answer(2, "hello"), finish_reason="stop"))
    assert end == [StatusChanged(None), EndAnswer("t1", answer(2, "hello"), "stop")]
    assert st.live_turn is None and st.status == StatusChanged(None)


def test_events_of_another_session_change_nothing() -> None:
    st = state()
    assert st.apply(TurnStart("s2", "t9", user(1, "x"), "m")) == []
    assert st.apply_deltas([AnswerDelta("s2", "t9", "x", 0)]) == []
    assert not st.live


def test_deltas_before_turn_start_open_the_answer_and_duplicates_are_dropped() -> None:
    st = state()
    changes = st.apply_deltas([AnswerDelta("s1", "t1", "ab", 0), AnswerDelta("s1", "t1", "ab", 0),
                               AnswerDelta("s1", "t1", "bcd", 1)])
    assert kinds(changes) == ["OpenAnswer", "AppendAnswer"] and changes[1] == AppendAnswer("t1", "abcd")
    assert st.apply(AnswerDelta("s1", "t1", "cd", 2)) == []   # all shown already


def test_reattach_shows_the_content_so_far_and_the_queue() -> None:
    st = state()
    running = TurnState("t1", "s1", user(1, "q"), "generating", "so far", started_at="x",
                        queued=(QueuedTurn("t2", user(None, "next")),))
    changes = st.attach(running)
    assert changes == [ShowMessage(user(1, "q")), OpenAnswer("t1", ChatMessage(None, "assistant", "so far", "x")),
                       ShowQueued("t2", user(None, "next")), StatusChanged("generating")]
    assert st.apply(AnswerDelta("s1", "t1", "so far", 0)) == []              # already shown
    assert st.apply(AnswerDelta("s1", "t1", " more", 6)) == [AppendAnswer("t1", " more")]
    # the queued turn starts: its stored message replaces the queued one
    st.apply(TurnEnd("s1", "t1", answer(2, "so far more")))
    changes = st.apply(TurnStart("s1", "t2", user(3, "next"), "m"))
    assert changes[0] == SettleQueued("t2", user(3, "next")) and not st.queued


def test_sent_reply_stored_or_queued() -> None:
    st = state()
    assert st.sent(ChatSendReply("t1", "s1", user(1, "now"))) == [ShowMessage(user(1, "now"))]
    st.apply(TurnStart("s1", "t1", user(1, "now"), "m"))
    assert st.sent(ChatSendReply("t2", "s1", user(None, "later"), 1)) == [ShowQueued("t2", user(None, "later"))]
    assert st.sent(ChatSendReply("t3", "s2", user(5, "elsewhere"))) == []
    assert list(st.queued) == ["t2"]


def test_sent_while_nothing_runs_here_says_queued() -> None:
    st = state()
    changes = st.sent(ChatSendReply("t2", "s1", user(None, "later"), 2))
    assert changes == [ShowQueued("t2", user(None, "later")), StatusChanged("queued", "2 ahead")]


def test_a_withdrawn_queued_turn_disappears() -> None:
    st = state()
    st.sent(ChatSendReply("t2", "s1", user(None, "later"), 1))
    withdrawn = TurnEnd("s1", "t2", None, finish_reason="cancelled", user_message=user(None, "later"), withdrawn=True)
    assert st.apply(withdrawn) == [SettleQueued("t2", None)]
    assert st.apply(withdrawn) == []      # twice: nothing left to remove


def test_a_cut_turn_end_keeps_the_streamed_text() -> None:
    st = state()
    st.apply_deltas([AnswerDelta("s1", "t1", "x" * 100, 0)])
    cut = answer(2, "x" * 10 + "[... cut]")
    changes = st.apply(TurnEnd("s1", "t1", cut, truncated=True))
    assert changes[-1] == EndAnswer("t1", answer(2, "x" * 100), "stop")
    st.apply_deltas([AnswerDelta("s1", "t3", "short", 0)])
    longer = answer(4, "the stored answer is longer")
    assert st.apply(TurnEnd("s1", "t3", longer, truncated=True))[-1].message == longer


def interrupted(mid: int, text: str = "") -> ChatMessage:
    """What a cluster node stores and publishes for the turn of a node that died (or a restarted
    server for its own): partial, interrupted, with the text it had saved (none)."""
    return ChatMessage(mid, "assistant", text, "t",
                       metadata={"partial": True, "interrupted": True, "finish_reason": "interrupted"})


def test_an_interrupted_turn_end_keeps_the_streamed_text_marked_not_saved() -> None:
    st = state()
    st.apply(TurnStart("s1", "t1", user(1, "q"), "m"))
    st.apply_deltas([AnswerDelta("s1", "t1", "what the user read", 0)])
    end = st.apply(TurnEnd("s1", "t1", interrupted(2), finish_reason="interrupted"))[-1]
    assert end.message.content == "what the user read" and end.message.metadata[NOT_SAVED] == 0
    assert end.message.metadata["finish_reason"] == "interrupted"
    st.apply(TurnStart("s1", "t3", user(3, "q2"), "m"))
    st.apply_deltas([AnswerDelta("s1", "t3", "abc", 0)])
    kept = interrupted(4, "abc and more")    # the server kept as much or more: its copy is shown
    assert st.apply(TurnEnd("s1", "t3", kept, finish_reason="interrupted"))[-1].message == kept
    st.apply(TurnStart("s1", "t5", user(5, "q3"), "m"))
    st.apply_deltas([AnswerDelta("s1", "t5", "a longer streamed text", 0)])
    whole = answer(6, "final")                # not partial: the stored answer is the answer
    assert st.apply(TurnEnd("s1", "t5", whole))[-1].message == whole


def test_the_streamed_text_outlives_a_reload_that_failed() -> None:
    st = state()
    st.apply(TurnStart("s1", "t1", user(1, "q"), "m"))
    st.apply_deltas([AnswerDelta("s1", "t1", "what the user read", 0)])
    st.begin(S)        # a reload after a crash, whose page never came (the link dropped again)
    st.begin(S)        # the next reload
    page = st.reloaded(HistoryPageReply("s1", (user(1, "q"), interrupted(2))))
    assert page.messages[1].content == "what the user read" and page.messages[1].metadata[NOT_SAVED] == 0
    st.begin(S)        # shown once: later reloads show the server's copy
    assert st.reloaded(HistoryPageReply("s1", (user(1, "q"), interrupted(2)))).messages[1].content == ""


def test_a_turn_error_keeps_the_partial_answer_and_shows_the_error() -> None:
    st = state()
    st.apply(TurnStart("s1", "t1", user(1, "q"), "m"))
    st.apply(TurnStart("s1", "t0", user(2, "other"), "m"))   # two live turns: the status stays
    changes = st.apply(TurnError("s1", "t1", ErrorCode.LLM_ERROR, "down", answer(3, "part")))
    assert changes == [EndAnswer("t1", answer(3, "part"), None, "Error LLM_ERROR: down")]
    assert st.live_turn == "t0"


def test_begin_forgets_the_previous_session() -> None:
    st = state()
    st.apply(TurnStart("s1", "t1", user(1, "q"), "m"))
    st.sent(ChatSendReply("t2", "s1", user(None, "later"), 1))
    st.begin(SessionInfo("s2", "Other"))
    assert st.session_id == "s2" and not st.live and not st.queued
    assert not st.session_changed(SessionInfo("s1", "renamed"))
    assert st.session_changed(SessionInfo("s2", "renamed")) and st.session.title == "renamed"


def test_join_deltas() -> None:
    deltas = [AnswerDelta("s", "t", "hello ", 0), AnswerDelta("s", "t", "wor", 6), AnswerDelta("s", "t", "ld", 9)]
    assert join_deltas(0, deltas) == "hello world"
    assert join_deltas(8, deltas) == "rld"


def test_chat_state_imports_no_textual_and_no_asyncio() -> None:
    src = Path(__file__).resolve().parents[2] / "src"
    code = ("import sys; import client.tui.state; "
            "bad = [m for m in ('textual', 'asyncio', 'client.connection', 'client.link') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": str(src)})
