"""Textual Pilot tests of the TUI against a real in-process server on 127.0.0.1:0."""
from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from textual.command import CommandPalette
from textual.widgets import Static

from client.config import ClientConfig
from client.connection import Client
from client.tui import commands
from client.tui.app import NpltApp
from client.tui.message import MessageView
from client.tui.input import ChatInput
from client.tui.clear import ClearModal
from client.tui.modals import ConfirmModal, ExportModal, HelpScreen, RenameModal, SearchModal
from client.tui.sidebar import Sidebar
from client.tui.status import StatusLine
from client.tui.toolcall import ToolCallItem
from client_testlib import shown, SIZE, chat, next_event_of, offline_agent, open_app, prefill, type_and_send, v3_server, wait_until
from testkit.echo_agent import EchoAgent
from protocol.server_events import TurnEnd



def contents(app: NpltApp) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in chat(app).messages()]


async def wait_answer(app: NpltApp, pilot: Any, content: str) -> MessageView:
    def done() -> bool:
        return any(m.role == "assistant" and m.content == content and m.message_id and m.turn_id is None
                   for m in chat(app).messages())
    await wait_until(done, pilot=pilot, what=f"answer {content!r}")
    return next(m for m in chat(app).messages() if m.content == content)


async def test_send_streams_answer_incrementally(server, echo: EchoAgent) -> None:
    _, addr = server
    async with open_app(addr) as (app, pilot):
        await type_and_send(pilot, "!block stream me")
        await echo.wait_blocked(1)
        live = chat(app).live
        await wait_until(lambda: live and next(iter(live.values())).content.startswith("echo:"), pilot=pilot)
        view = next(iter(live.values()))
        partial = view.content
        assert 0 < len(partial) < len("echo: !block stream me")  # first half shown while the turn runs
        status = app.query_one(StatusLine)
        assert status.turn_status == "generating" and status.query_one(".spinner").display
        echo.release()
        final = await wait_answer(app, pilot, "echo: !block stream me")
        assert final is view and view.content == "echo: !block stream me" and not view.is_live
        assert view.streamed_chars == len("echo: !block stream me")
        assert contents(app) == [("user", "!block stream me"), ("assistant", "echo: !block stream me")]
        assert status.turn_status is None


async def test_a_fresh_server_the_first_message_creates_the_session(server, echo: EchoAgent) -> None:
    """HELLO gives a user without sessions none: the TUI opens on an empty chat (header: the model
    the next session gets), the user types and sends, and that message creates the one session."""
    srv, addr = server
    async with open_app(addr, with_session=False) as (app, pilot):
        await wait_until(lambda: app.controller.models, pilot=pilot, what="the lists")
        assert app.client.hello is not None and app.client.hello.session is None
        assert app.controller.session_id is None and contents(app) == []
        assert app.title.endswith("· echo") and app.sub_title == "New chat"
        assert app.query_one(Sidebar).sessions == {}
        assert (await srv.store.list("local"))[0] == []             # opening the TUI created nothing
        await type_and_send(pilot, "!block my very first message")
        await echo.wait_blocked(1)
        echo.release()
        await wait_answer(app, pilot, "echo: !block my very first message")
        assert contents(app) == [("user", "!block my very first message"),
                                 ("assistant", "echo: !block my very first message")]
        recs, _ = await srv.store.list("local")
        assert [r.session_id for r in recs] == [app.controller.session_id]
        await wait_until(lambda: list(app.query_one(Sidebar).sessions) == [app.controller.session_id],
                         pilot=pilot, what="the sidebar lists the new session")
        await type_and_send(pilot, "and a second one")                 # now in that session
        await wait_answer(app, pilot, "echo: and a second one")
        assert len((await srv.store.list("local"))[0]) == 1 and len(contents(app)) == 4


async def test_offline_agent_tool_item_live_and_from_history(tmp_path: Path) -> None:
    async with v3_server(tmp_path, agent=offline_agent()) as (_, addr):
        async with open_app(addr) as (app, pilot):
            await type_and_send(pilot, "show cpu usage")
            await wait_until(lambda: any(m.message_id and m.role == "assistant" and m.content
                                         for m in chat(app).messages()), pilot=pilot, what="the answer")
            items = list(app.query(ToolCallItem))
            assert len(items) == 1 and items[0].status == "success"
            assert items[0].call.tool_name and "cpu" in json.dumps(items[0].call.encode()).lower()
            assert "success" in str(items[0].title) and items[0].collapsed
            items[0].query_one("CollapsibleTitle").focus()
            await pilot.press("enter")
            await wait_until(lambda: not items[0].collapsed, pilot=pilot, what="expanded tool item")
            assert "cpu" in str(items[0].query_one(".tool-args").render()).lower()
            # read back from history: a new session, then back to the first one
            first = app.controller.session_id
            await pilot.press("ctrl+n")
            await wait_until(lambda: app.controller.session_id != first and not chat(app).messages(), pilot=pilot)
            app.post_message(Sidebar.Selected(first))
            await wait_until(lambda: len(app.query(ToolCallItem)) == 1, pilot=pilot, what="tool item from history")
            assert app.query_one(ToolCallItem).status == "success"


async def test_switch_sessions_and_live_sidebar(server) -> None:
    _, addr = server
    async with open_app(addr) as (app, pilot):
        sidebar = app.query_one(Sidebar)
        mine = app.controller.session_id
        async with Client(*addr) as other:
            created = (await other.session_new(title="from elsewhere")).session
            reply = await other.chat_send("hello from elsewhere")
            await next_event_of(other, TurnEnd, pred=lambda e: e.turn_id == reply.turn_id)
        sid = created.session_id
        # the other session's turn updated only the sidebar, not the chat on screen
        await wait_until(lambda: sid in sidebar.sessions and sidebar.sessions[sid].message_count == 2, pilot=pilot,
                         what="live sidebar update")
        assert chat(app).session_id == mine and contents(app) == []
        sidebar.list.focus()
        sidebar.list.highlighted = sidebar.list.get_option_index(sid)
        await pilot.press("enter")
        await wait_until(lambda: chat(app).session_id == sid and len(contents(app)) == 2, pilot=pilot)
        assert contents(app) == [("user", "hello from elsewhere"), ("assistant", "echo: hello from elsewhere")]
        assert sidebar.current == sid and app.sub_title == "from elsewhere"


async def test_new_rename_delete_clear(server) -> None:
    _, addr = server
    async with open_app(addr) as (app, pilot):
        sidebar = app.query_one(Sidebar)
        first = app.controller.session_id
        await pilot.press("ctrl+n")
        await wait_until(lambda: app.controller.session_id not in (None, first) and len(sidebar.sessions) == 2,
                         pilot=pilot)
        second = app.controller.session_id
        await pilot.press("f2")
        await wait_until(lambda: shown(app, RenameModal), pilot=pilot)
        field = app.screen.query_one("#rename-input")
        field.value = "Renamed here"
        await pilot.press("enter")
        await wait_until(lambda: sidebar.sessions[second].title == "Renamed here", pilot=pilot)
        assert app.sub_title == "Renamed here"
        await type_and_send(pilot, "to be cleared")
        await wait_answer(app, pilot, "echo: to be cleared")
        await pilot.press("f9")
        await wait_until(lambda: shown(app, ClearModal), pilot=pilot)
        await pilot.press("c")   # clear (hide); "p" would also purge
        await wait_until(lambda: contents(app) == [] and sidebar.sessions[second].message_count == 0,
                         pilot=pilot, what="cleared session")
        await pilot.press("f8")
        await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot)
        await pilot.press("escape")  # cancelled: nothing happens
        await wait_until(lambda: not isinstance(app.screen, ConfirmModal), pilot=pilot)
        assert second in sidebar.sessions
        await pilot.press("f8")
        await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot)
        await pilot.click("#confirm-yes")
        await wait_until(lambda: second not in sidebar.sessions and app.controller.session_id == first,
                         pilot=pilot, what="deleted session")
        assert sidebar.current == first


async def test_scroll_to_top_loads_older_pages(server) -> None:
    srv, addr = server
    async with Client(*addr) as c:
        sid = (await c.session_new(title="long")).session.session_id
    await prefill(srv, sid, 120)
    async with open_app(addr, page_size=50) as (app, pilot):
        view = chat(app)
        assert view.session_id == sid
        ids = lambda: sorted(view.by_id)  # noqa: E731
        await wait_until(lambda: view.max_scroll_y > 0 and not view.backfilling, pilot=pilot)
        assert ids() == list(range(71, 121)) and view.has_more   # the newest page only
        assert len(view.messages()) == 50
        view.scroll_home(animate=False)
        await wait_until(lambda: len(view.by_id) == 100, pilot=pilot, what="second page")
        assert ids() == list(range(21, 121))
        await wait_until(lambda: view.scroll_y > 0, pilot=pilot, what="position kept after prepend")
        assert [m.message_id for m in view.messages()] == list(range(21, 121))   # older page on top, in order
        view.scroll_home(animate=False)
        await wait_until(lambda: len(view.by_id) == 120 and not view.has_more, pilot=pilot, what="last page")
        assert view.messages()[0].content == "message number 0"


async def test_cancel_with_escape(server, echo: EchoAgent) -> None:
    _, addr = server
    async with open_app(addr) as (app, pilot):
        await type_and_send(pilot, "!block cancel me")
        await echo.wait_blocked(1)
        await wait_until(lambda: bool(chat(app).live), pilot=pilot)
        await pilot.press("escape")
        # (the answer leaves ``live`` before it has settled into its stored message: wait for both)
        await wait_until(lambda: not chat(app).live and "finish_reason" in chat(app).messages()[-1].message.metadata,
                         pilot=pilot, what="cancelled turn, stored")
        view = chat(app).messages()[-1]
        assert view.message.metadata["partial"] is True
        assert view.message.metadata["finish_reason"] == "cancelled"
        assert "partial" in view.header_text and "cancelled" in view.header_text
        assert app.query_one(StatusLine).turn_status is None


async def test_turn_error_and_request_error_inline(tmp_path: Path) -> None:
    async with v3_server(tmp_path, agent=EchoAgent(), max_text_chars=20) as (_, addr):
        async with open_app(addr) as (app, pilot):
            await type_and_send(pilot, "!fail here")
            await wait_until(lambda: bool(app.query(".error")), pilot=pilot, what="turn error")
            assert "LLM_ERROR" in str(app.query(".error").first().render())
            box = app.query_one(ChatInput)
            await type_and_send(pilot, "x" * 30)   # over the server's max_text_chars (HELLO): not sent
            await wait_until(lambda: any("at most 20" in str(n.message) for n in app._notifications),
                             pilot=pilot, what="the too-long notice")
            assert box.text == "x" * 30 and not any("INVALID_MESSAGE" in str(e.render()) for e in app.query(".error"))
            del app.client.hello.limits["max_text_chars"]   # a server that does not say: it refuses the message
            await type_and_send(pilot, "y" * 30)
            await wait_until(lambda: any("INVALID_MESSAGE" in str(e.render()) for e in app.query(".error")),
                             pilot=pilot, what="request error")
            await wait_until(lambda: box.text == "y" * 30, pilot=pilot, what="the refused text back in the input")


async def test_reconnect_restores_session(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    first = v3_server(tmp_path, agent=EchoAgent(), port=port)
    _, addr = await first.__aenter__()
    app = NpltApp(ClientConfig(host=addr[0], port=port, reconnect_initial_s=0.05, reconnect_max_s=0.2))
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(lambda: app.client.connected, pilot=pilot)
        await type_and_send(pilot, "before restart")          # a fresh server: this creates the session
        await wait_answer(app, pilot, "echo: before restart")
        sid = chat(app).session_id
        status = app.query_one(StatusLine)
        await first.__aexit__(None, None, None)
        await wait_until(lambda: status.connection in ("reconnecting",), pilot=pilot, what="reconnecting state")
        async with v3_server(tmp_path, agent=EchoAgent(), port=port):
            await wait_until(lambda: status.connection == "connected" and app.controller._loads == 0
                             and len(contents(app)) == 2, pilot=pilot, what="reconnected")
            assert chat(app).session_id == sid
            assert contents(app) == [("user", "before restart"), ("assistant", "echo: before restart")]
            await type_and_send(pilot, "after restart")
            await wait_answer(app, pilot, "echo: after restart")


async def test_reattach_to_running_turn(server, echo: EchoAgent) -> None:
    _, addr = server
    async with Client(*addr) as other:
        await other.session_new(title="busy")
        await other.chat_send("!block long answer")
        await echo.wait_blocked(1)
        async with open_app(addr) as (app, pilot):
            live = chat(app).live
            await wait_until(lambda: bool(live), pilot=pilot, what="reattached turn")
            view = next(iter(live.values()))
            assert view.content and "echo: !block long answer".startswith(view.content)
            echo.release()
            await wait_answer(app, pilot, "echo: !block long answer")
            assert view.streamed_chars == len("echo: !block long answer")   # no delta shown twice


async def test_session_deleted_by_another_client(server) -> None:
    _, addr = server
    async with open_app(addr) as (app, pilot):
        first = app.controller.session_id
        await pilot.press("ctrl+n")
        await wait_until(lambda: app.controller.session_id not in (None, first), pilot=pilot)
        doomed = app.controller.session_id
        async with Client(*addr) as other:
            await other.session_delete(doomed)
        await wait_until(lambda: app.controller.session_id == first and doomed not in app.query_one(Sidebar).sessions,
                         pilot=pilot, what="moved off the deleted session")


async def test_search_jumps_to_an_old_message(server) -> None:
    srv, addr = server
    async with Client(*addr) as c:
        sid = (await c.session_new(title="haystack")).session.session_id
    await prefill(srv, sid, 29)
    await srv.store.append(sid, "user", "the needle is here")   # id 30 of 104
    await prefill(srv, sid, 74, start=30)
    async with open_app(addr, page_size=20) as (app, pilot):
        await pilot.press("ctrl+n")
        await wait_until(lambda: app.controller.session_id != sid and app.controller._loads == 0, pilot=pilot)
        await pilot.press("ctrl+f")
        await wait_until(lambda: shown(app, SearchModal), pilot=pilot)
        await pilot.press(*"needle", "enter")
        modal = app.screen
        await wait_until(lambda: bool(modal.hits), pilot=pilot, what="search hits")
        await pilot.press("enter")
        await wait_until(lambda: 30 in chat(app).by_id and chat(app).by_id[30].has_class("-found"), pilot=pilot,
                         what="message loaded by pages and marked")
        view = chat(app).by_id[30]
        assert chat(app).session_id == sid and view.content == "the needle is here"
        assert sorted(chat(app).by_id) == list(range(25, 105))  # 4 pages of 20, never the whole session
        await wait_until(lambda: chat(app).scroll_offset.y <= view.virtual_region.y <= chat(app).scroll_offset.y
                         + chat(app).size.height, pilot=pilot, what="scrolled to the message")


async def test_export_to_file(server, tmp_path: Path) -> None:
    _, addr = server
    async with open_app(addr) as (app, pilot):
        await type_and_send(pilot, "export this")
        await wait_answer(app, pilot, "echo: export this")
        await pilot.press("ctrl+s")
        await wait_until(lambda: shown(app, ExportModal), pilot=pilot)
        app.screen.query_one("#export-path").value = str(tmp_path / "out.md")
        await pilot.click("#export-json")
        target = tmp_path / "out.json"
        await wait_until(target.exists, pilot=pilot, what="export file")
        assert "echo: export this" in target.read_text()


async def test_export_asks_before_replacing_a_file(server, tmp_path: Path) -> None:
    _, addr = server
    target = tmp_path / "notes.md"
    target.write_text("my own notes")
    async with open_app(addr) as (app, pilot):
        await type_and_send(pilot, "export again")
        await wait_answer(app, pilot, "echo: export again")
        for answer in ("n", "y"):
            await pilot.press("ctrl+s")
            await wait_until(lambda: shown(app, ExportModal), pilot=pilot)
            app.screen.query_one("#export-path").value = str(target)
            await pilot.click("#export-markdown")
            await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot, what="the question")
            assert str(target) in str(app.screen.query_one(Static).render())
            await pilot.press(answer)
            await wait_until(lambda: not shown(app, ConfirmModal), pilot=pilot, what="the answer taken")
            if answer == "n":
                assert target.read_text() == "my own notes"      # kept, nothing written
        await wait_until(lambda: "echo: export again" in target.read_text(), pilot=pilot, what="the replaced file")


async def test_input_recall_newline_copy(server) -> None:
    _, addr = server
    async with open_app(addr) as (app, pilot):
        box = app.query_one(ChatInput)
        await type_and_send(pilot, "one")
        await type_and_send(pilot, "two")
        await wait_answer(app, pilot, "echo: two")
        await pilot.press("u", "p")
        await pilot.press("up")
        assert box.text == "two"
        await pilot.press("up")
        assert box.text == "one"
        await pilot.press("down")
        assert box.text == "two"
        await pilot.press("down")
        assert box.text == "up"   # the draft comes back
        box.clear()
        await pilot.press(*"```", "shift+enter", *"x = 1", "ctrl+j", *"```")
        assert box.text == "```\nx = 1\n```"
        await pilot.press("enter")
        await wait_answer(app, pilot, "echo: ```\nx = 1\n```")
        await pilot.press("f4")
        assert app.clipboard == "x = 1\n"
        await pilot.press("f3")
        assert app.clipboard == "echo: ```\nx = 1\n```"


async def test_palette_help_and_keymap(server) -> None:
    _, addr = server
    async with open_app(addr, keymap={"session.new": "f5"}) as (app, pilot):
        await wait_until(lambda: bool(app.controller.models), pilot=pilot, what="model list")
        titles = {c.title for c in app.get_system_commands(app.screen)}
        assert {a.title for a in commands.ACTIONS if a.action != "quit"} <= titles
        assert "Model: echo-large" in titles
        await pilot.press("ctrl+p")
        await wait_until(lambda: shown(app, CommandPalette), pilot=pilot)
        await pilot.press("escape")
        await wait_until(lambda: not isinstance(app.screen, CommandPalette), pilot=pilot)
        await pilot.press("f1")
        await wait_until(lambda: shown(app, HelpScreen), pilot=pilot)
        source = app.screen.query_one("#help-text").source
        assert "`session.new`" in source and "| `f5` |" in source
        await pilot.press("escape")
        await wait_until(lambda: not isinstance(app.screen, HelpScreen), pilot=pilot)
        first = app.controller.session_id
        await pilot.press("f5")  # remapped from ctrl+n
        await wait_until(lambda: app.controller.session_id not in (None, first), pilot=pilot, what="remapped key")
        app.set_focus(None)
        await pilot.press("ctrl+b")
        assert not app.query_one(Sidebar).display


async def test_auth_failure_is_shown_and_not_retried(tmp_path: Path) -> None:
    async with v3_server(tmp_path, agent=EchoAgent(), users=[("ann", "good")]) as (_, addr):
        app = NpltApp(ClientConfig(host=addr[0], port=addr[1], token="bad"))
        async with app.run_test(size=SIZE) as pilot:
            status = app.query_one(StatusLine)
            await wait_until(lambda: status.connection == "disconnected", pilot=pilot, what="disconnected state")
            assert "AUTH_FAILED" in status.connection_text
            assert any("AUTH_FAILED" in str(e.render()) for e in app.query(".error"))
            assert app.client.state == "disconnected"
