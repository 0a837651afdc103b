"""Defects found by the UX review of the TUI, each checked where it showed: a reload after a crash
keeps what was streamed, dialogs and the chat fit small terminals, the Knowledge panel asks before
replacing a file and its uploads can be cancelled and outlive it, a message that is not sent stays
in the input, side actions fail as notifications, the passage view words its location.

Most run under Pilot against the fake client (tests/client/fake_client.py); the upload cancel runs
against a real server with a knowledge base on loopback."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from textual import events
from textual.app import App
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Button, DataTable, Input, ProgressBar, TextArea

from client.config import ClientConfig
from client.errors import ClientError
from client.events import Connected, Reconnecting
from client.tui.app import NpltApp
from client.tui.citations import CitationList, PassageModal, location_text
from client.tui.editor import TextEditModal
from client.tui.input import ChatInput
from client.tui.knowledge import KnowledgeOps, KnowledgeScreen, Transfer, Uploads
from client.tui.modals import ConfirmModal, HelpScreen, RenameModal
from client.tui.sidebar import Sidebar
from client.tui.state import NOT_SAVED, ChatState
from client.tui.status import StatusLine
from client_testlib import SIZE, chat, push_download_panel, shown, type_and_send, wait_until
from tui_script import answer, interrupted, notes, scripted_app, user
from fake_client import FakeClient, stamp
from kb_wire.kbwire import kb_server, token
from protocol import ErrorCode
from protocol.kb import KbDocument, KbHit
from protocol.objects import SessionInfo
from protocol.replies import HistoryPageReply
from protocol.server_events import AnswerDelta, TurnStart

STREAMED = "慢速回答第0段。Slow answer part 0. " * 6


def notes_text(view: Widget) -> list[str]:
    return [str(n.render()) for n in view.query(".message-note")]


# -- 1. a reload after a crash keeps what was streamed -------------------------------------------------
def test_chat_state_keeps_the_streamed_text_of_an_answer_the_server_saved_shorter() -> None:
    session = SessionInfo("s1", "Chat")
    st = ChatState()
    st.begin(session)
    st.apply(TurnStart("s1", "t1", user(1, "q"), "m"))
    st.apply_deltas([AnswerDelta("s1", "t1", STREAMED, 0)])
    st.begin(session)   # the same session reloaded (reconnected after a restart)
    page = HistoryPageReply("s1", (user(1, "q"), interrupted(2), user(3, "next"), answer(4, "ok")))
    shown_page = st.reloaded(page)
    assert shown_page.messages[1].content == STREAMED and shown_page.messages[1].metadata[NOT_SAVED] == 0
    assert shown_page.messages[1].metadata["finish_reason"] == "interrupted"
    assert shown_page.messages[2:] == page.messages[2:]
    assert st.reloaded(page) == page          # used once: a later reload shows the server's copy

    st.apply(TurnStart("s1", "t2", user(5, "q2"), "m"))
    st.apply_deltas([AnswerDelta("s1", "t2", "short", 0)])
    st.begin(session)
    longer = HistoryPageReply("s1", (user(5, "q2"), answer(6, "short and more", partial=True,
                                                              finish_reason="cancelled")))
    assert st.reloaded(longer) == longer      # the server kept as much or more: its copy is shown

    st.apply(TurnStart("s1", "t3", user(7, "q3"), "m"))
    st.apply_deltas([AnswerDelta("s1", "t3", "text", 0)])
    st.begin(SessionInfo("s2", "Other"))       # another session: nothing carried over
    assert st.reloaded(HistoryPageReply("s2", (user(7, "q3"), interrupted(8)))).messages[1].content == ""


async def test_after_a_server_crash_the_reload_keeps_the_streamed_answer_marked_not_saved() -> None:
    fake = FakeClient(messages={"s1": []})
    async with scripted_app(fake) as (app, pilot):
        await fake.push(TurnStart("s1", "t1", user(1, "slow question"), "fake"), AnswerDelta("s1", "t1", STREAMED, 0))
        await wait_until(lambda: any(m.content == STREAMED for m in chat(app).messages()), pilot=pilot,
                         what="the streamed text")
        # the server is killed; at its restart it stores the running answer as interrupted, empty
        fake.messages["s1"] = [user(1, "slow question"), interrupted(2)]
        await fake.push(Reconnecting(1, 0.1, "connection lost"), Connected(fake.hello, reconnected=True))
        await wait_until(lambda: 2 in chat(app).by_id, pilot=pilot, what="the reloaded session")
        view = chat(app).by_id[2]
        assert view.content == STREAMED                     # what the user read is still there
        assert "interrupted" in view.header_text and "not saved" in view.header_text
        [note] = notes_text(view)
        assert "not saved on the server" in note and "none of it" in note
        assert "before any text" not in note


async def test_answers_stopped_by_a_server_shutdown_do_not_say_cancelled() -> None:
    fake = FakeClient(messages={"s1": [
        user(1, "a"), answer(2, "part of it", partial=True, finish_reason="cancelled", cancel_reason="shutdown"),
        user(3, "b"), answer(4, "", partial=True, finish_reason="cancelled", cancel_reason="shutdown"),
        user(5, "c"), interrupted(6)]})
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: len(chat(app).messages()) == 6, pilot=pilot, what="the history")
        views = chat(app).by_id
        for mid in (2, 4):
            assert "stopped: the server shut down" in views[mid].header_text
            assert "cancelled" not in views[mid].header_text
        assert notes_text(views[2]) == []
        assert notes_text(views[4]) == ["Stopped (the server shut down) before any text was streamed."]
        # a killed server saved nothing: it does not claim that nothing was streamed
        assert notes_text(views[6]) == ["Interrupted (the server stopped): no text of this answer was saved."]


# -- 2. dialogs fit the terminal -------------------------------------------------------------------
DIALOG_KEYS = ["f1", "f2", "f8", "f9", "f10", "ctrl+o", "f5", "ctrl+f", "ctrl+s", "f6", "f7", "f12"]


def visible(app: App[Any], widget: Widget) -> bool:
    """The widget is on screen and is what a click at its middle reaches (not cut, not covered)."""
    region = widget.region
    width, height = app.size
    if not region.width or not region.height or region.right > width or region.bottom > height:
        return False
    hit, _ = app.screen.get_widget_at(region.x + region.width // 2, region.y + region.height // 2)
    return hit is widget or widget in hit.ancestors


@pytest.mark.parametrize("size", [(80, 24), (40, 12)])
async def test_every_dialog_fits_and_its_buttons_can_be_pressed(size: tuple[int, int]) -> None:
    fake = FakeClient(messages={"s1": [user(1, "hello"), answer(2, "hi there")]})
    async with scripted_app(fake, size) as (app, pilot):
        for key in DIALOG_KEYS:
            app.query_one(ChatInput).focus()
            await pilot.press(key)
            await wait_until(lambda: isinstance(app.screen, ModalScreen) and app.screen.is_mounted
                             and bool(app.screen.query(".dialog")), pilot=pilot, what=f"the dialog of {key}")
            await pilot.pause()
            screen = app.screen
            dialog = screen.query_one(".dialog")
            assert dialog.region.right <= size[0] and dialog.region.bottom <= size[1], (key, dialog.region)
            for button in screen.query(Button):
                if button.display and not isinstance(button.parent.parent, Transfer):
                    assert visible(app, button), (key, type(screen).__name__, str(button.label), button.region)
            if isinstance(screen, TextEditModal):   # the text to edit is in view too
                area = screen.query_one("#editor-text", TextArea)
                assert visible(app, area) and area.region.height >= 3, (key, area.region)
            while len(app.screen_stack) > 1:
                await pilot.press("escape")
                await pilot.pause()


async def test_the_help_shows_keys_as_the_footer_does() -> None:
    fake = FakeClient()
    async with scripted_app(fake) as (app, pilot):
        await pilot.press("f1")
        await wait_until(lambda: shown(app, HelpScreen), pilot=pilot, what="the help")
        source = app.screen.query_one("#help-text").source
        assert "question_mark" not in source and "ctrl+" not in source and "escape" not in source
        assert "| `f1,?` |" in source and "| `^p` |" in source and "| `esc` |" in source


# -- 3. narrow terminals: the sidebar steps aside, the address is never cut ---------------------------
async def test_the_sidebar_hides_on_a_narrow_terminal_unless_the_user_chose() -> None:
    fake = FakeClient()
    async with scripted_app(fake, (60, 24)) as (app, pilot):
        sidebar = app.query_one(Sidebar)
        assert not sidebar.display and chat(app).region.width >= 55   # the chat has the width
        await pilot.resize_terminal(100, 24)
        await wait_until(lambda: sidebar.display, pilot=pilot, what="the sidebar back when wide")
        await pilot.press("ctrl+b")                                    # the user hides it: it stays hidden
        await pilot.resize_terminal(60, 24)
        await pilot.resize_terminal(110, 24)
        await pilot.pause()
        assert not sidebar.display
        await pilot.press("ctrl+b")                                    # and shown on a narrow one, it stays
        await pilot.resize_terminal(50, 24)
        await pilot.pause()
        assert sidebar.display


@pytest.mark.parametrize("width", [40, 52, 60])
async def test_the_status_line_leaves_the_address_out_rather_than_cutting_it(width: int) -> None:
    fake = FakeClient(messages={"s1": []})
    async with scripted_app(fake, (width, 20)) as (app, pilot):
        await fake.push(TurnStart("s1", "t1", user(1, "q"), "fake"))   # a running turn takes room too
        status = app.query_one(StatusLine)
        await wait_until(lambda: status.turn_status is not None, pilot=pilot, what="the running turn")
        await pilot.pause()
        conn = status.query_one(".connection-state")
        text = str(conn.render())                          # what the connection part holds...
        assert "127.0.0.1:9999" in text or "127.0" not in text, text
        assert conn.region.right <= status.region.right and conn.content_size.width >= len(text), \
            (text, conn.region)                          # ...fits in the room it got: nothing cut at the edge


# -- 4. downloads ask before replacing a file -------------------------------------------------------
def doc(doc_id: str, name: str) -> KbDocument:
    return KbDocument(doc_id, name, "m", "s", 5, 1, "user:me", stamp(1), "me")


async def test_a_download_asks_before_replacing_a_file(tmp_path: Path) -> None:
    existing = tmp_path / "runbook.md"
    existing.write_text("my own notes", encoding="utf-8")
    downloads: list[Path] = []

    async def listing() -> list[KbDocument]:
        return [doc("d1", "runbook.md")]

    async def download(_doc: KbDocument, dest: Path) -> KbDocument:
        downloads.append(dest)
        dest.write_text("the document", encoding="utf-8")
        return _doc

    app: App[None] = App()
    async with app.run_test(size=SIZE) as pilot:
        await push_download_panel(app, pilot, tmp_path, listing, download)
        await pilot.press("d")
        await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot, what="the replace question")
        assert str(existing) in str(app.screen.query_one(".question").render())
        await pilot.press("n")
        await wait_until(lambda: any("Not downloaded" in n for n in notes(app)), pilot=pilot, what="the note")
        assert downloads == [] and existing.read_text(encoding="utf-8") == "my own notes"
        await pilot.press("d")
        await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot, what="the question again")
        await pilot.press("y")
        await wait_until(lambda: any("Downloaded to" in n for n in notes(app)), pilot=pilot, what="the download")
        assert downloads == [existing] and existing.read_text(encoding="utf-8") == "the document"


# -- 5. uploads: cancellable, they outlive the panel, and say how they ended --------------------------
class Gate:
    """An upload function the test drives: it reports what the test says, then ends as told."""

    def __init__(self) -> None:
        self.report: asyncio.Queue[tuple[str, int, int]] = asyncio.Queue()
        self.finish: asyncio.Future[KbDocument | Exception] | None = None
        self.cancelled = asyncio.Event()

    async def __call__(self, path: Path, progress: Any) -> KbDocument:
        self.finish = asyncio.get_running_loop().create_future()
        try:
            while not self.finish.done():
                getter = asyncio.ensure_future(self.report.get())
                await asyncio.wait([getter, self.finish], return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    progress(*getter.result())
                else:
                    getter.cancel()
            outcome = self.finish.result()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def ops_for(tmp_path: Path, gate: Gate, uploads: Uploads | None = None) -> KnowledgeOps:
    async def listing() -> list[KbDocument]:
        return []

    async def unused(*_args: Any) -> Any:
        raise AssertionError("not called")
    return KnowledgeOps(listing, gate, unused, unused, tmp_path, uploads)


def row_text(row: Transfer) -> str:
    return str(row.query_one(".kb-transfer-title").render())


async def start_upload(pilot: Any, panel: KnowledgeScreen, path: Path) -> Transfer:
    panel.query_one("#kb-path", Input).value = str(path)
    panel.query_one("#kb-path", Input).focus()
    await pilot.press("enter")
    await wait_until(lambda: any(r.path == path for r in panel.query(Transfer)), pilot=pilot, what="the row")
    return next(r for r in panel.query(Transfer) if r.path == path)


async def test_a_running_upload_can_be_cancelled_and_a_long_stage_shows_no_fraction(tmp_path: Path) -> None:
    note = tmp_path / "big.log"
    note.write_text("x" * 100, encoding="utf-8")
    gate = Gate()
    panel = KnowledgeScreen(ops_for(tmp_path, gate))
    app: App[None] = App()
    async with app.run_test(size=SIZE) as pilot:
        await app.push_screen(panel)
        await wait_until(lambda: panel.loaded, pilot=pilot, what="the panel")
        row = await start_upload(pilot, panel, note)
        await gate.report.put(("parsing", 0, 1))      # one step: a big parse sits at 0/1 until done
        await wait_until(lambda: "parsing" in row_text(row), pilot=pilot, what="the parsing stage")
        assert row_text(row) == "big.log · parsing…" and row.query_one(ProgressBar).total is None
        panel.query_one("#kb-table", DataTable).focus()
        await pilot.press("c")
        await wait_until(lambda: gate.cancelled.is_set() and "cancelled" in row_text(row), pilot=pilot,
                         what="the upload cancelled")
        assert "may still add it" in row_text(row)     # the server had every byte
        assert not row.query_one(".kb-transfer-cancel", Button).display
        assert panel.uploads.jobs == []


async def test_an_upload_goes_on_when_the_panel_closes_and_its_end_is_notified(tmp_path: Path) -> None:
    files = [tmp_path / "note.md", tmp_path / "blob.bin"]
    for f in files:
        f.write_text("# Note\n", encoding="utf-8")
    gate = Gate()
    uploads = Uploads(gate)       # the app's: it outlives the panel
    app: App[None] = App()
    async with app.run_test(size=SIZE) as pilot:
        panel = KnowledgeScreen(ops_for(tmp_path, gate, uploads))
        await app.push_screen(panel)
        await wait_until(lambda: panel.loaded, pilot=pilot, what="the panel")
        await start_upload(pilot, panel, files[0])
        await gate.report.put(("receiving", 3, 7))
        await wait_until(lambda: uploads.jobs and uploads.jobs[0].stage == "receiving", pilot=pilot)
        await pilot.press("escape")                                 # the panel closes; the upload goes on
        await wait_until(lambda: not isinstance(app.screen, KnowledgeScreen), pilot=pilot)
        again = KnowledgeScreen(ops_for(tmp_path, gate, uploads))   # a panel opened meanwhile shows it
        await app.push_screen(again)
        await wait_until(lambda: again.loaded and bool(again.query(Transfer)), pilot=pilot, what="the row again")
        assert "receiving" in row_text(again.query_one(Transfer))
        await pilot.press("escape")
        await wait_until(lambda: not isinstance(app.screen, KnowledgeScreen), pilot=pilot)
        gate.finish.set_result(KbDocument("d1", "note.md", "m", "s", 7, 3, "user:me", stamp(1), "me"))
        await wait_until(lambda: "Upload of note.md: done, 3 chunks" in notes(app), pilot=pilot,
                         what="the end notified")
        # a refusal is notified with its reason
        panel = KnowledgeScreen(ops_for(tmp_path, gate, uploads))
        await app.push_screen(panel)
        await wait_until(lambda: panel.loaded, pilot=pilot)
        await start_upload(pilot, panel, files[1])
        await wait_until(lambda: gate.finish is not None and not gate.finish.done(), pilot=pilot)
        await pilot.press("escape")
        await wait_until(lambda: not isinstance(app.screen, KnowledgeScreen), pilot=pilot)
        gate.finish.set_result(ClientError(ErrorCode.UNSUPPORTED_MEDIA, "blob.bin: binary file"))
        await wait_until(lambda: any("Upload of blob.bin: failed" in n and "UNSUPPORTED_MEDIA" in n
                                     and "binary file" in n for n in notes(app)), pilot=pilot,
                         what="the refusal notified")
        assert list(app._notifications)[-1].severity == "error"


async def test_an_upload_to_a_real_server_is_cancelled_while_sending_and_the_next_one_works(tmp_path: Path) -> None:
    big = tmp_path / "big.md"
    big.write_text("# Big\n\n" + "line of text to index\n" * 200_000, encoding="utf-8")   # about 4.4 MB
    small = tmp_path / "small.md"
    small.write_text("# Small\n\nThe restore timeout is 300 seconds.\n", encoding="utf-8")
    async with kb_server(tmp_path / "srv") as (_srv, (host, port)):
        app = NpltApp(ClientConfig(host=host, port=port, token=token("alice")))
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(lambda: app.client.connected and app.controller._loads == 0, pilot=pilot)
            await pilot.press("f11")
            await wait_until(lambda: shown(app, KnowledgeScreen) and app.screen.loaded, pilot=pilot)
            panel = app.screen
            uploads = app.controller.uploads
            assert panel.uploads is uploads
            send_data = app.client.send_data
            sent: list[int] = []

            async def cancel_after_the_first_block(*args: Any) -> Any:   # the bytes start flowing: cancel
                await send_data(*args)
                sent.append(len(args[-1]))
                for job in uploads.jobs:
                    uploads.cancel(job)
            app.client.send_data = cancel_after_the_first_block  # type: ignore[method-assign]
            row = await start_upload(pilot, panel, big)
            await wait_until(lambda: not row.job.running, pilot=pilot, what="the cancelled upload")
            assert row.job.end is not None and row.job.end.startswith("cancelled") and sent
            await wait_until(lambda: "cancelled" in row_text(row), pilot=pilot, what="the row saying so")
            app.client.send_data = send_data  # type: ignore[method-assign]
            small_row = await start_upload(pilot, panel, small)   # the link is fine: the next one is stored
            await wait_until(lambda: "done" in row_text(small_row), pilot=pilot, what="the next upload")
            await wait_until(lambda: [d.name for d in panel.documents] == ["small.md"], pilot=pilot,
                             what="only the finished upload listed")


# -- 6. a message that is not sent stays in the input ----------------------------------------------
async def test_a_message_that_cannot_be_sent_stays_in_the_input() -> None:
    fake = FakeClient()
    fake.limits["max_text_chars"] = 10
    async with scripted_app(fake) as (app, pilot):
        box = app.query_one(ChatInput)
        await type_and_send(pilot, "x" * 11)
        await wait_until(lambda: any("at most 10" in n for n in notes(app)), pilot=pilot, what="the length note")
        assert box.text == "x" * 11 and not any(c[0] == "chat_send" for c in fake.calls)
        fake.state = "reconnecting"
        await type_and_send(pilot, "hello")
        await wait_until(lambda: any("reconnecting" in n for n in notes(app)), pilot=pilot, what="the note")
        assert box.text == "hello" and not any(c[0] == "chat_send" for c in fake.calls)
        fake.state = "connected"

        async def refuse(text: str, session_id: str | None = None) -> Any:
            fake.calls.append(("chat_send", text))
            raise ClientError(ErrorCode.QUEUE_FULL, "8 turns are queued")
        fake.chat_send = refuse  # type: ignore[method-assign]
        await type_and_send(pilot, "refused")
        await wait_until(lambda: ("chat_send", "refused") in fake.calls and box.text == "refused",
                         pilot=pilot, what="the refused message back in the input")


async def test_an_edit_longer_than_the_server_takes_is_refused_in_the_dialog() -> None:
    fake = FakeClient(messages={"s1": [user(1, "short"), answer(2, "ok")]})
    fake.limits["max_text_chars"] = 10
    async with scripted_app(fake) as (app, pilot):
        await pilot.press("f5")
        await wait_until(lambda: shown(app, TextEditModal), pilot=pilot, what="the edit dialog")
        app.screen.query_one("#editor-text", TextArea).load_text("y" * 11)
        await pilot.press("ctrl+s")
        await wait_until(lambda: any("at most 10" in n for n in notes(app)), pilot=pilot, what="the length note")
        assert shown(app, TextEditModal) and not any(c[0] == "chat_edit" for c in fake.calls)


# -- 7. side actions fail as notifications, worded for the action ----------------------------------
async def test_rename_says_what_is_wrong_and_a_refusal_is_a_notification() -> None:
    fake = FakeClient()
    async with scripted_app(fake) as (app, pilot):
        await pilot.press("f2")
        await wait_until(lambda: shown(app, RenameModal), pilot=pilot, what="the rename dialog")
        box = app.screen.query_one("#rename-input", Input)
        box.value = "   "
        await pilot.press("enter")
        await wait_until(lambda: any("empty" in n for n in notes(app)), pilot=pilot, what="the blank title note")
        assert shown(app, RenameModal)
        box.value = ""
        box.post_message(events.Paste("x" * 5000))                 # a paste is cut to the server's limit
        await wait_until(lambda: len(box.value) == 200, pilot=pilot, what="the cut paste")
        assert any("at most 200" in n for n in notes(app))

        async def refuse(title: str, session_id: str | None = None) -> Any:
            raise ClientError(ErrorCode.INVALID_MESSAGE, "the title is not allowed")
        fake.session_rename = refuse  # type: ignore[method-assign]
        await pilot.press("enter")
        await wait_until(lambda: any(n.startswith("Rename failed: the title is not allowed") for n in notes(app)),
                         pilot=pilot, what="the refusal notified")
        assert not chat(app).query(".error")                       # nothing in the conversation


async def test_a_citation_of_a_deleted_document_says_so_outside_the_chat() -> None:
    cites = [{"citation": "[runbook.md §Restore]", "doc_id": "d1", "name": "runbook.md", "chunk_id": "gone:1"}]
    fake = FakeClient(messages={"s1": [user(1, "timeout?"), answer(2, "300 s", citations=cites)]})
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: 2 in chat(app).by_id, pilot=pilot, what="the history")
        chat(app).by_id[2].query_one(CitationList).query_one(".citation", Button).press()
        await wait_until(lambda: any("document of this citation was deleted" in n for n in notes(app)),
                         pilot=pilot, what="the notification")
        assert not chat(app).query(".error") and not isinstance(app.screen, PassageModal)


# -- 8. the passage view words its location --------------------------------------------------------
def test_a_passage_location_in_words() -> None:
    assert location_text({"heading": ["Runbook", "Restore"], "lines": [3, 3]}) == "Runbook › Restore, line 3"
    assert location_text({"heading": ["Runbook"], "page": 2, "lines": [3, 7]}) == "Runbook, page 2, lines 3-7"
    assert location_text({"lines": "3-3"}) == "line 3" and location_text({}) == "" and location_text(None) == ""


async def test_the_passage_view_shows_the_location_in_words() -> None:
    cites = [{"citation": "[runbook.md §Runbook > Restore]", "doc_id": "d1", "name": "runbook.md", "chunk_id": "c1"}]
    fake = FakeClient(messages={"s1": [user(1, "timeout?"), answer(2, "300 s", citations=cites)]})
    fake.passages["c1"] = KbHit("d1", "runbook.md", "c1", "The restore timeout is 300 seconds.", 1.0,
                                {"heading": ["Runbook", "Restore"], "lines": [3, 7]}, "user:me", "[runbook.md]")
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: 2 in chat(app).by_id, pilot=pilot, what="the history")
        chat(app).by_id[2].query_one(CitationList).query_one(".citation", Button).press()
        await wait_until(lambda: shown(app, PassageModal), pilot=pilot, what="the passage")
        where = str(app.screen.query_one(".dialog-note").render())
        assert where == "runbook.md · user:me · Runbook › Restore, lines 3-7"


def test_the_header_words_how_a_tool_loop_was_stopped() -> None:
    from client.tui.message import ending
    assert ending({"finish_reason": "context_budget"}) == "context full: answered without more tools"
    assert ending({"finish_reason": "max_iterations"}) == "tool step limit: answered without more tools"
    assert ending({"finish_reason": "length"}) == "length" and ending({"finish_reason": "stop"}) is None
