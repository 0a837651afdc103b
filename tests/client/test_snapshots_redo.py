"""Snapshot tests of the issue-16 dialogs (trash, purge question, clear, system prompt, edit and resend),
of failed answers, and of the knowledge panel and citations (issue 14), against the fake client (fixed ids, no times, no address).
Update with ``--snapshot-update``."""
from __future__ import annotations

from typing import Any

from textual.widgets import TextArea

from client.config import ClientConfig
from client.tui.app import NpltApp
from client.tui.chat import ChatView
from client.tui.citations import PassageModal
from client.tui.clear import ClearModal
from client.tui.editor import TextEditModal
from client.tui.input import ChatInput
from client.tui.knowledge import KnowledgeScreen
from client.tui.modals import ConfirmModal
from client.tui.trash import TrashScreen
from client_testlib import wait_until
from fake_client import FakeClient, stamp
from protocol.kb import KbDocument, KbHit
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


def kb_app() -> NpltApp:
    client = fake()
    cites = [{"citation": "[runbook.md §Restore]", "doc_id": "d1", "name": "runbook.md", "chunk_id": "c1",
              "location": {"heading": "Restore"}},
             {"citation": "[nginx.conf L12-20]", "doc_id": "d2", "name": "nginx.conf", "chunk_id": "c2",
              "location": {"lines": "12-20"}}]
    client.messages["s1"] = [ChatMessage(1, "user", "what is the restore timeout?", stamp(1)),
                             ChatMessage(2, "assistant", "It defaults to 300 seconds [runbook.md §Restore].",
                                         stamp(2), metadata={"citations": cites})]
    client.passages["c1"] = KbHit("d1", "runbook.md", "c1", "The restore timeout defaults to 300 seconds.", 1.0,
                                  {"heading": "Restore", "lines": "3-3"}, "user:local", "[runbook.md §Restore]")
    client.documents = [KbDocument("d1", "runbook.md", "0" * 32, "0" * 64, 27_000, 41, "user:local",
                                   "2026-11-22T10:00:00+00:00", "local"),
                        KbDocument("d2", "nginx.conf", "1" * 32, "1" * 64, 2_300, 3, "group:ops",
                                   "2026-11-21T09:30:00+00:00", "bob")]
    return NpltApp(ClientConfig(), show_times=False, show_address=False, client=client)  # type: ignore[arg-type]


def test_citations_and_passage(snap_compare) -> None:
    async def run_before(pilot: Any) -> None:
        await settled(pilot)
        pilot.app.query_one(ChatView).by_id[2].query_one(".citation").press()
        await wait_until(lambda: isinstance(pilot.app.screen, PassageModal), pilot=pilot, what="the passage")
    assert snap_compare(kb_app(), terminal_size=TERMINAL, run_before=run_before)


def test_knowledge_panel(snap_compare) -> None:
    async def run_before(pilot: Any) -> None:
        await settled(pilot)
        await pilot.press("f12")
        await wait_until(lambda: isinstance(pilot.app.screen, KnowledgeScreen) and pilot.app.screen.loaded,
                         pilot=pilot, what="the knowledge panel")
        pilot.app.screen.query_one("#kb-path").cursor_blink = False
    assert snap_compare(kb_app(), terminal_size=TERMINAL, run_before=run_before)
