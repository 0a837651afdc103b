"""TUI behaviour under Pilot against a fake client that replays scripted typed events (no server).

Each test states what the server says (typed events, typed replies of tests/client/fake_client.py)
and checks the screen. The end-to-end Pilot tests against a real server are in test_tui*.py.
"""
from __future__ import annotations

import os
import pty
import signal
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input

from client import paths
from client.events import Connected, Reconnecting
from client.tui.app import NpltApp
from client.tui.hangup import TerminalWatch
from client.tui.saved import SavedState
from client.tui.input import ChatInput
from client.tui.message import MessageView
from client.tui.modals import ConfirmModal, ExportModal, RenameModal
from client.tui.sidebar import Sidebar
from client.tui.status import StatusLine
from client.tui.toolcall import ToolCallItem
from client_testlib import shown, chat, type_and_send, wait_until
from tui_script import contents, scripted_app
from fake_client import FakeClient, stamp
from protocol import ErrorCode
from protocol.objects import ChatMessage, SessionInfo, ToolCall, TurnState
from protocol.server_events import (AnswerDelta, SessionEvent, ToolCallEvent, ToolResultEvent, TurnEnd, TurnError,
                                    TurnStart, TurnStatus)


def user(mid: int | None, text: str) -> ChatMessage:
    return ChatMessage(mid, "user", text, stamp(1), metadata={} if mid is not None else {"queued": True})


def answer(mid: int, text: str, **meta: Any) -> ChatMessage:
    return ChatMessage(mid, "assistant", text, stamp(2), metadata=meta)


def settled(app: NpltApp, text: str) -> bool:
    return any(m.role == "assistant" and m.content == text and m.message_id is not None and m.turn_id is None
               for m in chat(app).messages())


async def test_a_streamed_turn_with_status_and_tool_call() -> None:
    fake = FakeClient()
    async with scripted_app(fake) as (app, pilot):
        status = app.query_one(StatusLine)
        call = ToolCall("c1", "sys_monitor", {"metric": "cpu"})
        await fake.push(TurnStart("s1", "t1", user(1, "cpu?"), "fake"),
                        TurnStatus("s1", "t1", "tool_call", "sys_monitor"), ToolCallEvent("s1", "t1", call))
        await wait_until(lambda: bool(app.query(ToolCallItem)), pilot=pilot, what="the running tool item")
        item = app.query_one(ToolCallItem)
        assert item.status == "running" and status.turn_status == "tool_call" and status.detail == "sys_monitor"
        done = ToolCall("c1", "sys_monitor", {"metric": "cpu"}, "cpu 5%", "success", 0.25)
        await fake.push(ToolResultEvent("s1", "t1", done), TurnStatus("s1", "t1", "generating"),
                        AnswerDelta("s1", "t1", "CPU is ", 0))
        await wait_until(lambda: item.status == "success" and status.turn_status == "generating"
                         and bool(chat(app).live) and next(iter(chat(app).live.values())).content == "CPU is ",
                         pilot=pilot, what="the result and the first delta")
        await fake.push(AnswerDelta("s1", "t1", "low.", 7),
                        TurnEnd("s1", "t1", ChatMessage(2, "assistant", "CPU is low.", stamp(2), (done,)),
                                {"total_tokens": 3}, "stop"))
        await wait_until(lambda: settled(app, "CPU is low."), pilot=pilot, what="the settled answer")
        assert contents(app) == [("user", "cpu?"), ("assistant", "CPU is low.")]
        assert status.turn_status is None and not chat(app).live
        assert len(app.query(ToolCallItem)) == 1 and "0.250s" in str(app.query_one(ToolCallItem).title)


async def test_waiting_deltas_render_as_one_append(monkeypatch: pytest.MonkeyPatch) -> None:
    appends: list[str] = []
    plain = MessageView.append

    async def counting(self: MessageView, text: str) -> None:
        appends.append(text)
        await plain(self, text)
    monkeypatch.setattr(MessageView, "append", counting)
    fake = FakeClient()
    async with scripted_app(fake) as (app, pilot):
        deltas = [AnswerDelta("s1", "t1", "tok ", 4 * i) for i in range(200)]
        # queued all at once (nothing yields in between): one TURN_START, 200 deltas, the end
        await fake.push(TurnStart("s1", "t1", user(1, "go"), "fake"), *deltas,
                        TurnEnd("s1", "t1", answer(2, "tok " * 200)))
        await wait_until(lambda: settled(app, "tok " * 200), pilot=pilot, what="the answer")
        assert appends == ["tok " * 200]


async def test_events_of_another_session_only_update_the_sidebar() -> None:
    fake = FakeClient()
    async with scripted_app(fake) as (app, pilot):
        other = SessionInfo("s9", "Elsewhere", stamp(5), stamp(50), 2, running=True)
        await fake.push(SessionEvent("created", other), TurnStart("s9", "t1", user(1, "hi"), "fake"),
                        AnswerDelta("s9", "t1", "hello", 0), TurnEnd("s9", "t1", answer(2, "hello")))
        sidebar = app.query_one(Sidebar)
        await wait_until(lambda: "s9" in sidebar.sessions, pilot=pilot, what="the sidebar entry")
        await pilot.pause()
        assert contents(app) == [] and chat(app).session_id == "s1" and not chat(app).live
        assert "⟳" in str(sidebar.list.get_option("s9").prompt)


async def test_queued_message_waits_at_the_bottom_and_a_withdrawn_one_disappears() -> None:
    fake = FakeClient()
    async with scripted_app(fake) as (app, pilot):
        await fake.push(TurnStart("s1", "t0", user(1, "first"), "fake"), AnswerDelta("s1", "t0", "work", 0))
        await wait_until(lambda: bool(chat(app).live), pilot=pilot, what="a running turn")
        fake.busy = True
        await type_and_send(pilot, "second")
        await type_and_send(pilot, "third")
        view = chat(app)
        await wait_until(lambda: len(view.pending) == 2, pilot=pilot, what="two queued messages")
        assert [c for _, c in contents(app)] == ["first", "work", "second", "third"]
        assert all("queued" in m.header_text for m in view.pending.values())
        await fake.push(TurnEnd("s1", "t2", None, finish_reason="cancelled", user_message=user(None, "third"),
                                withdrawn=True))
        await wait_until(lambda: list(view.pending) == ["t1"], pilot=pilot, what="the withdrawn one removed")
        # the running answer ends above the queued message; then the queued turn starts
        await fake.push(TurnEnd("s1", "t0", answer(2, "work done")), TurnStart("s1", "t1", user(3, "second"), "fake"))
        await wait_until(lambda: not view.pending and settled(app, "work done"), pilot=pilot, what="settled order")
        assert [c for _, c in contents(app)] == ["first", "work done", "second", ""]
        assert view.by_id[3].content == "second" and "queued" not in view.by_id[3].header_text


async def test_escape_cancels_the_live_turn() -> None:
    fake = FakeClient()
    async with scripted_app(fake) as (app, pilot):
        await fake.push(TurnStart("s1", "t7", user(1, "long job"), "fake"))
        await wait_until(lambda: "t7" in chat(app).live, pilot=pilot, what="the live turn")
        await pilot.press("escape")
        await wait_until(lambda: ("chat_cancel", "t7") in fake.calls, pilot=pilot, what="the cancel request")
        await fake.push(TurnEnd("s1", "t7", answer(2, "", partial=True), finish_reason="cancelled"))
        # (the answer leaves ``live`` before it has settled into its stored message: wait for its id)
        await wait_until(lambda: not chat(app).live and 2 in chat(app).by_id
                         and "cancelled" in chat(app).by_id[2].header_text, pilot=pilot, what="the cancelled end")
        assert "partial" in chat(app).by_id[2].header_text


async def test_a_turn_error_keeps_the_partial_answer_with_the_error() -> None:
    fake = FakeClient()
    async with scripted_app(fake) as (app, pilot):
        await fake.push(TurnStart("s1", "t1", user(1, "q"), "fake"), AnswerDelta("s1", "t1", "half", 0),
                        TurnError("s1", "t1", ErrorCode.LLM_ERROR, "the model is down", answer(2, "half", partial=True)))
        await wait_until(lambda: 2 in chat(app).by_id and "-error" in chat(app).by_id[2].classes, pilot=pilot,
                         what="the partial answer marked as failed")
        assert "Error LLM_ERROR: the model is down" in str(chat(app).by_id[2].query(".error").first().render())
        assert app.query_one(StatusLine).turn_status is None


async def test_a_cut_turn_end_keeps_the_streamed_answer() -> None:
    fake = FakeClient()
    async with scripted_app(fake) as (app, pilot):
        full = "x" * 500
        await fake.push(TurnStart("s1", "t1", user(1, "big"), "fake"), AnswerDelta("s1", "t1", full, 0),
                        TurnEnd("s1", "t1", answer(2, "x" * 20 + "[... cut by the server]"), truncated=True))
        await wait_until(lambda: settled(app, full), pilot=pilot, what="the streamed text kept")


async def test_reattach_shows_the_answer_so_far_then_only_new_deltas() -> None:
    running = TurnState("t1", "s1", user(1, "question"), "generating", "so far", started_at=stamp(1))
    fake = FakeClient(running=running)
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: "t1" in chat(app).live, pilot=pilot, what="the reattached answer")
        await fake.push(AnswerDelta("s1", "t1", "so far", 0), AnswerDelta("s1", "t1", " and more", 6))
        await wait_until(lambda: chat(app).live["t1"].content == "so far and more", pilot=pilot, what="new deltas")
        assert app.query_one(StatusLine).turn_status == "generating"


async def test_the_session_on_screen_deleted_elsewhere_opens_the_newest_other() -> None:
    sessions = [SessionInfo("s1", "Current", stamp(0), stamp(30)), SessionInfo("s2", "Other", stamp(0), stamp(20))]
    fake = FakeClient(sessions, {"s2": [user(1, "in s2")]})
    async with scripted_app(fake) as (app, pilot):
        await fake.push(SessionEvent("deleted", sessions[0]))
        await wait_until(lambda: chat(app).session_id == "s2" and contents(app) == [("user", "in s2")],
                         pilot=pilot, what="the other session")
        assert ("session_switch", "s2") in fake.calls and "s1" not in app.query_one(Sidebar).sessions


async def test_rename_elsewhere_updates_the_title_and_the_sidebar() -> None:
    fake = FakeClient()
    async with scripted_app(fake) as (app, pilot):
        await fake.push(SessionEvent("renamed", SessionInfo("s1", "Renamed elsewhere", stamp(0), stamp(0))))
        await wait_until(lambda: app.sub_title == "Renamed elsewhere", pilot=pilot, what="the new title")
        assert app.query_one(Sidebar).sessions["s1"].title == "Renamed elsewhere"
        assert app.controller.session is not None and app.controller.session.title == "Renamed elsewhere"


async def test_connection_states_show_in_the_status_line() -> None:
    fake = FakeClient()
    async with scripted_app(fake) as (app, pilot):
        status = app.query_one(StatusLine)
        await fake.push(Reconnecting(2, 0.5, "connection reset"))
        await wait_until(lambda: status.connection_text == "reconnecting attempt 2", pilot=pilot, what="reconnecting")
        assert fake.hello is not None
        await fake.push(Connected(fake.hello, reconnected=True))
        await wait_until(lambda: status.connection == "connected", pilot=pilot, what="connected again")


# -- focus and the sidebar cursor after session operations (issue 16) --------------------------------
def highlighted(app: NpltApp) -> str | None:
    option = app.query_one(Sidebar).list.highlighted_option
    return option.id if option is not None else None


def two_sessions() -> FakeClient:
    return FakeClient([SessionInfo("s1", "Current", stamp(0), stamp(30)), SessionInfo("s2", "Other", stamp(0), stamp(20))],
                      {"s2": [user(1, "in s2")]})


async def test_ctrl_n_from_the_sidebar_focuses_the_input_and_moves_the_cursor() -> None:
    fake = two_sessions()
    async with scripted_app(fake) as (app, pilot):
        sidebar = app.query_one(Sidebar)
        app.action_focus_sessions()
        await pilot.pause()
        assert app.focused is sidebar.list and highlighted(app) == "s1"
        await pilot.press("ctrl+n")
        await wait_until(lambda: chat(app).session_id == "s3" and app.controller._loads == 0, pilot=pilot,
                         what="the new session")
        assert isinstance(app.focused, ChatInput) and highlighted(app) == "s3"
        await pilot.press("h", "i")                       # typed text is not lost
        assert app.query_one(ChatInput).text == "hi"


async def test_switching_from_the_sidebar_focuses_the_input() -> None:
    fake = two_sessions()
    async with scripted_app(fake) as (app, pilot):
        sidebar = app.query_one(Sidebar)
        sidebar.list.focus()
        sidebar.list.highlighted = sidebar.list.get_option_index("s2")
        await pilot.press("enter")
        await wait_until(lambda: chat(app).session_id == "s2" and contents(app) == [("user", "in s2")],
                         pilot=pilot, what="the other session")
        await wait_until(lambda: isinstance(app.focused, ChatInput), pilot=pilot, what="focus in the input")
        assert highlighted(app) == "s2" and sidebar.current == "s2"


async def test_rename_and_delete_give_the_focus_back_to_the_input() -> None:
    fake = two_sessions()
    async with scripted_app(fake) as (app, pilot):
        app.action_focus_sessions()
        await pilot.press("f2")
        await wait_until(lambda: shown(app, RenameModal), pilot=pilot, what="the rename dialog")
        app.screen.query_one("#rename-input", Input).value = "Renamed"
        await pilot.press("enter")
        await wait_until(lambda: app.sub_title == "Renamed" and isinstance(app.focused, ChatInput), pilot=pilot,
                         what="renamed, focus in the input")
        app.action_focus_sessions()
        await pilot.press("f8")
        await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot, what="the delete dialog")
        await pilot.click("#confirm-yes")
        await wait_until(lambda: chat(app).session_id == "s2" and app.controller._loads == 0
                         and isinstance(app.focused, ChatInput), pilot=pilot, what="deleted, the other session")
        assert highlighted(app) == "s2" and "s1" not in app.query_one(Sidebar).sessions


async def test_export_dialog_one_at_a_time_enter_saves_to_the_user_folder(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DOCUMENTS_DIR", str(tmp_path / "docs"))
    assert paths.export_dir() == tmp_path / "docs" / "NPLT"     # platformdirs honours the XDG folder
    fake = FakeClient(messages={"s1": [user(1, "keep this")]})
    async with scripted_app(fake) as (app, pilot):
        await pilot.press("ctrl+s")
        await wait_until(lambda: shown(app, ExportModal), pilot=pilot, what="the export dialog")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert sum(isinstance(s, ExportModal) for s in app.screen_stack) == 1
        assert app.screen.query_one("#export-path", Input).value == str(tmp_path / "docs" / "NPLT" / "nplt-s1.md")
        await pilot.press("enter")
        target = tmp_path / "docs" / "NPLT" / "nplt-s1.md"
        await wait_until(target.exists, pilot=pilot, what="the export file")
        assert target.read_text() == "keep this" and not isinstance(app.screen, ExportModal)


async def test_long_sidebar_titles_end_with_an_ellipsis() -> None:
    long_title = "A very long session title that would wrap over several lines of the sidebar"
    fake = FakeClient([SessionInfo("s1", long_title, stamp(0), stamp(1))])
    async with scripted_app(fake) as (app, pilot):
        sidebar = app.query_one(Sidebar)
        await pilot.pause()
        first_line = str(sidebar.list.get_option("s1").prompt).splitlines()[0]
        width = sidebar.list.scrollable_content_region.width
        assert first_line.endswith("…") and len(first_line) < width and first_line.startswith("● A very long")
        assert len(str(sidebar.list.get_option("s1").prompt).splitlines()) == 2   # title + details, no wrap
        assert sidebar.list.get_option_at_index(0).id == "s1"
        assert app.sub_title == long_title                       # the header keeps the whole title


async def test_the_palette_theme_and_the_input_history_survive_a_restart() -> None:
    async with scripted_app(FakeClient()) as (app, pilot):
        assert app.theme == "textual-dark"
        await type_and_send(pilot, "remember me")
        app.theme = "nord"                          # as picked in the command palette
        await wait_until(lambda: paths.state_file().exists()
                         and '"nord"' in paths.state_file().read_text()
                         and "remember me" in paths.state_file().read_text(), pilot=pilot, what="the saved state")
    async with scripted_app(FakeClient()) as (app, pilot):
        await wait_until(lambda: app.theme == "nord", pilot=pilot, what="the theme restored")
        box = app.query_one(ChatInput)
        box.focus()
        await pilot.press("up")
        assert box.text == "remember me"


async def test_sighup_exits_the_tui() -> None:
    async with scripted_app(FakeClient()) as (app, pilot):
        os.kill(os.getpid(), signal.SIGHUP)
        await wait_until(lambda: app.return_code == 129, pilot=pilot, what="the exit on SIGHUP")
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL     # the handler was removed with the app


def test_a_hung_up_terminal_is_noticed() -> None:
    master, slave = pty.openpty()
    reasons: list[str] = []
    try:
        watch = TerminalWatch(reasons.append, fd=slave)
        assert watch.watching_tty
        watch.check()
        assert reasons == []
        os.close(master)             # the other side went away (SSH drop, closed pane)
        watch.check()
        watch.check()
        assert reasons == ["the terminal hung up"]   # once
    finally:
        os.close(slave)
    assert not TerminalWatch(reasons.append, fd=None).watching_tty


async def test_retries_show_in_the_status_line_then_the_answer_settles() -> None:
    """The agent reports a retry as TURN_STATUS detail ``retrying N/M in D s (REASON)`` (docs/agent.md)."""
    fake = FakeClient()
    async with scripted_app(fake) as (app, pilot):
        status = app.query_one(StatusLine)
        await fake.push(TurnStart("s1", "t1", user(1, "cpu?"), "fake"),
                        TurnStatus("s1", "t1", "thinking", "retrying 2/3 in 1 s (HTTP 429)"))
        await wait_until(lambda: status.detail == "retrying 2/3 in 1 s (HTTP 429)", pilot=pilot, what="the retry")
        assert "Thinking: retrying 2/3 in 1 s (HTTP 429)" in str(status._turn.render())
        await fake.push(TurnStatus("s1", "t1", "generating"), AnswerDelta("s1", "t1", "fine", 0),
                        TurnEnd("s1", "t1", answer(2, "fine"), {}, "stop", {}))
        await wait_until(lambda: settled(app, "fine") and status.turn_status is None, pilot=pilot,
                         what="the answer after the retry")
        assert status.detail == ""


async def test_the_header_names_the_sessions_model_and_follows_a_switch() -> None:
    fake = FakeClient(sessions=[SessionInfo("s1", "First", stamp(0), stamp(0), model="qwen2.5:7b")])
    async with scripted_app(fake) as (app, pilot):
        assert app.title == "NPLT Assistant · qwen2.5:7b" and app.sub_title == "First"
        await fake.push(SessionEvent("model", SessionInfo("s1", "First", stamp(0), stamp(0), model="deepseek-chat")))
        await wait_until(lambda: app.title == "NPLT Assistant · deepseek-chat", pilot=pilot, what="the new model")
        await fake.push(SessionEvent("model", SessionInfo("s9", "Other", stamp(0), stamp(0), model="other-model")))
        await pilot.pause()
        assert app.title == "NPLT Assistant · deepseek-chat"        # another session's switch changes nothing


def long_history(n: int) -> list[ChatMessage]:
    return [user(i, f"question {i}") if i % 2 else answer(i, f"answer {i}\n\n" + "more text " * 30)
            for i in range(1, n + 1)]


def at_bottom(app: NpltApp) -> bool:
    view = chat(app)
    return view.max_scroll_y > 0 and view.scroll_y >= view.max_scroll_y


async def test_sending_while_scrolled_up_follows_the_answer_but_other_updates_do_not_yank_the_view() -> None:
    fake = FakeClient(messages={"s1": long_history(30)})
    async with scripted_app(fake) as (app, pilot):
        view = chat(app)
        await wait_until(lambda: len(view.messages()) == 30 and not view.backfilling and at_bottom(app),
                         pilot=pilot, what="the history, at the bottom")
        view.focus()
        await pilot.press("pageup", "pageup")
        await wait_until(lambda: 0 < view.scroll_y < view.max_scroll_y - 10, pilot=pilot, what="scrolled up")
        where = view.scroll_y
        # another client's turn in this session appends below: the reader stays where they are
        await fake.push(TurnStart("s1", "t9", user(31, "from elsewhere"), "fake"),
                        AnswerDelta("s1", "t9", "their answer " * 40, 0),
                        TurnEnd("s1", "t9", answer(32, "their answer " * 40)))
        await wait_until(lambda: settled(app, "their answer " * 40), pilot=pilot, what="the other client's turn")
        await pilot.pause()
        assert view.scroll_y == where
        await type_and_send(pilot, "my own question")
        await wait_until(lambda: ("user", "my own question") in contents(app), pilot=pilot, what="the sent message")
        await fake.push(TurnStart("s1", "t1", ChatMessage(1001, "user", "my own question", stamp(1)), "fake"),
                        *[AnswerDelta("s1", "t1", f"line {i}\n\n", len("".join(f"line {k}\n\n" for k in range(i))))
                          for i in range(30)])
        await wait_until(lambda: bool(view.live) and next(iter(view.live.values())).content.endswith("line 29\n\n")
                         and at_bottom(app), pilot=pilot, what="the streaming answer, followed at the bottom")


async def test_up_and_down_move_between_the_rows_of_a_wrapped_line_before_recalling() -> None:
    long_line = " ".join(f"word{i}" for i in range(60))          # one line, several rows on screen
    async with scripted_app(FakeClient()) as (app, pilot):
        box = app.query_one(ChatInput)
        await type_and_send(pilot, "earlier")
        box.load_text(long_line)
        box.move_cursor((0, len(long_line)))                      # typed: the cursor at its end
        rows = len(box.wrapped_document.get_offsets(0)) + 1
        assert rows >= 3
        for _ in range(rows - 1):                                 # up a row at a time, the text stays
            column = box.cursor_location[1]
            await pilot.press("up")
            assert box.text == long_line and box.cursor_location[1] < column
        await pilot.press("up")                                   # on the first row: recall
        assert box.text == "earlier"
        await pilot.press("down")                                 # back to the draft, cursor at its end
        assert box.text == long_line and box.cursor_location == (0, len(long_line))
        await type_and_send(pilot, long_line)
        await pilot.press("up")                                   # recalled: cursor on its last row
        assert box.text == long_line
        box.move_cursor((0, 0))
        for _ in range(rows - 1):                                 # down a row at a time while recalling
            column = box.cursor_location[1]
            await pilot.press("down")
            assert box.text == long_line and box.cursor_location[1] > column
        await pilot.press("down")                                 # on the last row: past the newest, the draft
        assert box.text == ""


async def test_enter_on_the_open_session_in_the_sidebar_returns_to_the_input() -> None:
    async with scripted_app(FakeClient()) as (app, pilot):
        sidebar = app.query_one(Sidebar)
        await wait_until(lambda: "s1" in sidebar.sessions, pilot=pilot, what="the sidebar")
        await pilot.press("ctrl+g")
        await wait_until(lambda: app.focused is sidebar.list, pilot=pilot, what="the sidebar focused")
        await pilot.press("enter")                                 # the session already open
        await wait_until(lambda: isinstance(app.focused, ChatInput), pilot=pilot, what="the input focused")
        assert chat(app).session_id == "s1" and ("session_switch", "s1") not in app.client.calls


async def test_two_tuis_keep_each_others_input_history() -> None:
    async with scripted_app(FakeClient()) as (app, pilot):
        await type_and_send(pilot, "mine first")
        await wait_until(lambda: SavedState.load(paths.state_file()).history == ["mine first"], pilot=pilot,
                         what="the first save")
        # another TUI (started earlier, so it never loaded "mine first") saves an input meanwhile
        SavedState(None, ["mine first", "typed in the other TUI"]).save(paths.state_file())
        await type_and_send(pilot, "mine again")
        await wait_until(lambda: "mine again" in SavedState.load(paths.state_file()).history, pilot=pilot,
                         what="the second save")
        assert SavedState.load(paths.state_file()).history == ["mine first", "typed in the other TUI", "mine again"]
