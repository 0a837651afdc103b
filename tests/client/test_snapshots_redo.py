"""Snapshot tests of the issue-16 dialogs (trash, purge question, clear, system prompt, edit and resend)
and of failed / cancelled answers, against the fake client (fixed ids, no times, no address).
Update with ``--snapshot-update``."""
from __future__ import annotations

from typing import Any

from textual.widgets import TextArea

from client.config import ClientConfig
from client.tui.app import NpltApp
from client.tui.chat import ChatView
from client.tui.clear import ClearModal
from client.tui.editor import TextEditModal
from client.tui.input import ChatInput
from client.tui.modals import ConfirmModal
from client.tui.trash import TrashScreen
from client_testlib import wait_until
from fake_client import FakeClient, stamp
from protocol.objects import ChatMessage, SessionInfo

TERMINAL = (100, 30)


def fake() -> FakeClient:
    client = FakeClient([SessionInfo("s1", "Nginx notes", stamp(0), stamp(5), 4)],
                        {"s1": [ChatMessage(1, "user", "how do I reload nginx?", stamp(1)),
                                ChatMessage(2, "assistant", "Run `nginx -s reload`.", stamp(2)),
                                ChatMessage(3, "user", "and check the config first?", stamp(3)),
                                ChatMessage(4, "assistant", "Use `nginx -t`", stamp(4),
                                            metadata={"error": "LLM_UNAVAILABLE", "attempts": 3, "partial": True,
                                                      "error_message": "provider answered 500",
                                                      "finish_reason": "error"})]})
    client.trash["t1"] = SessionInfo("t1", "Old disk check", stamp(0), stamp(3), 6, "df -h shows / at 91%")
    client.trash["t2"] = SessionInfo("t2", "Draft", stamp(0), stamp(2), 0)
    client.prompts["s1"] = "You are a terse Linux operations assistant."
    return client


def make_app() -> NpltApp:
    return NpltApp(ClientConfig(), show_times=False, show_address=False, client=fake())  # type: ignore[arg-type]


async def settled(pilot: Any) -> None:
    app = pilot.app
    await wait_until(lambda: app.client.connected and app.query_one(ChatView).session_id is not None
                     and app.controller._loads == 0 and not app.query_one(ChatView).backfilling
                     and bool(app.query_one("#session-list").option_count), pilot=pilot, what="a settled screen")
    app.query_one(ChatInput).cursor_blink = False


async def no_blink(pilot: Any) -> None:
    for area in pilot.app.screen.query(TextArea):
        area.cursor_blink = False


def test_failed_answer(snap_compare) -> None:
    assert snap_compare(make_app(), terminal_size=TERMINAL, run_before=settled)


def test_trash(snap_compare) -> None:
    async def run_before(pilot: Any) -> None:
        await settled(pilot)
        await pilot.press("f10")
        await wait_until(lambda: isinstance(pilot.app.screen, TrashScreen) and pilot.app.screen.loaded,
                         pilot=pilot, what="the trash")
    assert snap_compare(make_app(), terminal_size=TERMINAL, run_before=run_before)


def test_purge_question(snap_compare) -> None:
    async def run_before(pilot: Any) -> None:
        await settled(pilot)
        await pilot.press("f10")
        await wait_until(lambda: isinstance(pilot.app.screen, TrashScreen) and pilot.app.screen.loaded,
                         pilot=pilot, what="the trash")
        await pilot.press("p")
        await wait_until(lambda: isinstance(pilot.app.screen, ConfirmModal), pilot=pilot, what="the question")
    assert snap_compare(make_app(), terminal_size=TERMINAL, run_before=run_before)


def test_delete_question(snap_compare) -> None:
    async def run_before(pilot: Any) -> None:
        await settled(pilot)
        await pilot.press("f8")
        await wait_until(lambda: isinstance(pilot.app.screen, ConfirmModal), pilot=pilot, what="the question")
    assert snap_compare(make_app(), terminal_size=TERMINAL, run_before=run_before)


def test_clear_dialog(snap_compare) -> None:
    async def run_before(pilot: Any) -> None:
        await settled(pilot)
        await pilot.press("f9")
        await wait_until(lambda: isinstance(pilot.app.screen, ClearModal), pilot=pilot, what="the clear dialog")
    assert snap_compare(make_app(), terminal_size=TERMINAL, run_before=run_before)


def test_system_prompt_editor(snap_compare) -> None:
    async def run_before(pilot: Any) -> None:
        await settled(pilot)
        await pilot.press("ctrl+o")
        await wait_until(lambda: isinstance(pilot.app.screen, TextEditModal), pilot=pilot, what="the editor")
        await no_blink(pilot)
    assert snap_compare(make_app(), terminal_size=TERMINAL, run_before=run_before)


def test_edit_and_resend(snap_compare) -> None:
    async def run_before(pilot: Any) -> None:
        await settled(pilot)
        await pilot.press("f5")
        await wait_until(lambda: isinstance(pilot.app.screen, TextEditModal), pilot=pilot, what="the editor")
        await no_blink(pilot)
    assert snap_compare(make_app(), terminal_size=TERMINAL, run_before=run_before)
