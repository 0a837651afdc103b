"""Snapshot tests (pytest-textual-snapshot) of the main screen states.

Deterministic: fixed terminal size, times and the server address hidden (``show_times=False``,
``show_address=False``), the echo agent, no cursor blink. The server runs in a background thread
because ``snap_compare`` runs the app in its own event loop. Update with ``--snapshot-update``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from client.config import ClientConfig
from client.tui.app import NpltApp
from client.tui.chat import ChatView
from client.tui.input import ChatInput
from client.tui.memory_panel import MemoryPanel
from client.tui.modals import ExportModal, HelpScreen
from client_testlib import ServerThread, wait_until
from fake_client import FakeClient

TERMINAL = (100, 30)


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[ServerThread]:
    with ServerThread(tmp_path) as st:
        st.run(st.srv.store.create("local"))   # the user's empty "New chat" (HELLO creates none)
        yield st


def make_app(st: ServerThread) -> NpltApp:
    return NpltApp(ClientConfig(host=st.addr[0], port=st.addr[1]), show_times=False, show_address=False)


async def settled(pilot: Any) -> None:
    app = pilot.app
    await wait_until(lambda: app.client.connected and app.query_one(ChatView).session_id is not None
                     and app.controller._loads == 0 and not app.query_one(ChatView).backfilling
                     and bool(app.query_one("#session-list").option_count), pilot=pilot, what="a settled screen")
    app.query_one(ChatInput).cursor_blink = False


def test_empty_session(srv: ServerThread, snap_compare) -> None:
    assert snap_compare(make_app(srv), terminal_size=TERMINAL, run_before=settled)


def test_conversation_with_tool_item(srv: ServerThread, snap_compare) -> None:
    async def run_before(pilot: Any) -> None:
        await settled(pilot)
        app = pilot.app
        box = app.query_one(ChatInput)
        box.load_text("!tool what is the answer")
        await pilot.press("enter")
        chat = app.query_one(ChatView)
        await wait_until(lambda: any(m.role == "assistant" and m.message_id for m in chat.messages())
                         and app.query_one("#session-list").option_count == 1
                         and app.controller.sidebar.sessions[chat.session_id].message_count == 2,
                         pilot=pilot, what="the finished turn")
    assert snap_compare(make_app(srv), terminal_size=TERMINAL, run_before=run_before)


def test_help_screen(srv: ServerThread, snap_compare) -> None:
    async def run_before(pilot: Any) -> None:
        await settled(pilot)
        await pilot.press("f1")
        await wait_until(lambda: isinstance(pilot.app.screen, HelpScreen), pilot=pilot)
    assert snap_compare(make_app(srv), terminal_size=TERMINAL, run_before=run_before)


def test_export_dialog(snap_compare, monkeypatch: pytest.MonkeyPatch) -> None:
    # a fake client (fixed session id "s1") and a fixed documents folder keep the path deterministic
    monkeypatch.setenv("XDG_DOCUMENTS_DIR", "/home/user/Documents")
    app = NpltApp(ClientConfig(), show_times=False, show_address=False, client=FakeClient())  # type: ignore[arg-type]

    async def run_before(pilot: Any) -> None:
        await settled(pilot)
        await pilot.press("ctrl+s")
        await wait_until(lambda: isinstance(pilot.app.screen, ExportModal), pilot=pilot, what="the export dialog")
        pilot.app.screen.query_one("#export-path").cursor_blink = False
    assert snap_compare(app, terminal_size=TERMINAL, run_before=run_before)


def test_memory_panel(snap_compare) -> None:
    from protocol.objects import MemoryItem
    fake = FakeClient()
    fake.memory = [MemoryItem("m1", "fact", "The prod DB host is db-prod-42.", "s_20261120_a", 3,
                              "2026-11-20T10:15:00+00:00"),
                   MemoryItem("m2", "preference", "以后请用中文回答。", "s_20261120_a", 5, "2026-11-20T10:16:00+00:00")]
    app = NpltApp(ClientConfig(), show_times=False, show_address=False, client=fake)  # type: ignore[arg-type]

    async def run_before(pilot: Any) -> None:
        await settled(pilot)
        await pilot.press("f7")
        await wait_until(lambda: isinstance(pilot.app.screen, MemoryPanel)
                         and pilot.app.screen.query_one("#memory-items").option_count == 2, pilot=pilot,
                         what="the memory panel with its items")
    assert snap_compare(app, terminal_size=TERMINAL, run_before=run_before)
