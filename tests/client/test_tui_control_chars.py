"""The TUI never passes terminal controls of the server's text (another user's document quoted in an
answer, a model's output, a passage, a tool result, a name, an error) to the terminal: what Textual
would write for the screen holds no OSC (title, clipboard), no hidden-text SGR from the text, no C1
control. The text is shown with its controls as ``\\uXXXX`` (``client.wording.printable``).

The screen is rendered as the terminal would receive it (the compositor's full update, as
``App._display`` writes it; the headless driver writes nothing itself)."""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from textual.app import App
from textual.command import CommandPalette
from textual.widgets import Input, OptionList

from client.config import ClientConfig
from client.errors import ClientError
from client.events import Disconnected, ServerError
from client.tui.app import NpltApp
from client.tui.citations import PassageModal
from client.tui.clear import ClearModal
from client.tui.knowledge import KnowledgeOps, KnowledgeScreen
from client.tui.memory_panel import MemoryPanel
from client.tui.message import SEGMENT_CHARS, Segment
from client.tui.modals import ConfirmModal, RenameModal, SearchModal
from client.tui.status import StatusLine
from client.tui.toolcall import ToolCallItem
from client.tui.trash import TrashScreen
from client.tui.why import WhyScreen
from client_testlib import SIZE, chat, shown, wait_until
from fake_client import FakeClient, stamp
from protocol import ErrorCode, MsgType
from protocol.kb import KbDocument, KbHit
from protocol.objects import ChatMessage, MemoryItem, ModelInfo, SearchHit, SessionInfo, ToolCall, TurnState
from protocol.replies import (ErrorReply, HistorySearchReply, MemoryForgetReply, MemoryListReply, ModelListReply,
                              SessionListReply)
from protocol.server_events import (AnswerDelta, Notice, ToolCallEvent, ToolResultEvent, TurnError, TurnStart,
                                    TurnStatus)

# set the window title, hide what follows, write the clipboard (OSC 52), and an 8-bit CSI (U+009B)
ATTACK = ("The backup rotation keeps seven copies. \x1b]0;PWNED-TITLE\x07\x1b[8mhidden text\x1b[0m "
          "\x1b]52;c;ZWNobyBwd25lZA==\x07 \x9b31mred\x9b0m done")
# what the text may make the terminal do: none of it may reach the terminal (Textual's own output
# uses CSI cursor moves and colours, never OSC, conceal, BEL or 8-bit controls)
RAW = ("\x1b]", "\x1b[8m", "\x07", "\x9b")


def named(word: str) -> str:
    """A name or a short text from the server (a session title, a document's name, a tool's name,
    an error), short enough to be seen where names are cut to a column: ``word`` tells where it is
    shown, between the controls."""
    return f"\x1b]0;{word}\x07\x1b[8m{word.lower()}\x9b1m"


@asynccontextmanager
async def scripted_app(fake: FakeClient, size: tuple[int, int] = SIZE) -> AsyncIterator[tuple[NpltApp, Any]]:
    """``tui_script.scripted_app`` with the notifications shown (``run_test`` leaves them out)."""
    app = NpltApp(ClientConfig(), client=fake)  # type: ignore[arg-type]
    async with app.run_test(size=size, notifications=True) as pilot:
        await wait_until(lambda: fake.connected and chat(app).session_id is not None and app.controller._loads == 0
                         and bool(app.controller.models), pilot=pilot, what="the first session and the lists")
        yield app, pilot


def terminal_output(app: NpltApp) -> str:
    """What the app writes to the terminal for a full repaint of its screen."""
    update = app.screen._compositor.render_update(full=True)
    return update.render_segments(app.console)


def assert_shown_safely(app: NpltApp, *words: str) -> None:
    screen = terminal_output(app)
    for word in words or ("PWNED-TITLE",):
        assert word in screen, f"{word} is not on screen"   # the text is on screen ...
    raw = [seq for seq in RAW if seq in screen]                               # ... its controls are not
    where = [word for word in words if f"\x1b]0;{word}" in screen]
    assert not raw, f"terminal controls of the server's text reach the terminal: {raw} (at {where})"


async def test_an_answer_and_a_message_from_history() -> None:
    fake = FakeClient(messages={"s1": [ChatMessage(1, "user", "quote it: " + ATTACK, stamp(1)),
                                       ChatMessage(2, "assistant", "From your documents:\n\n> " + ATTACK, stamp(2))]})
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: len(chat(app).messages()) == 2, pilot=pilot, what="the history")
        await pilot.pause()
        assert_shown_safely(app)


async def test_a_streamed_answer_and_a_tool_result() -> None:
    fake = FakeClient()
    async with scripted_app(fake) as (app, pilot):
        call = ToolCall("c1", "search_knowledge", {"query": "rotation"})
        done = ToolCall("c1", "search_knowledge", {"query": "rotation"}, ATTACK, "success", 0.01)
        await fake.push(TurnStart("s1", "t1", ChatMessage(1, "user", "rotation?", stamp(1)), "fake"),
                        ToolCallEvent("s1", "t1", call), ToolResultEvent("s1", "t1", done),
                        AnswerDelta("s1", "t1", "> " + ATTACK, 0))
        await wait_until(lambda: bool(app.query(ToolCallItem)) and app.query_one(ToolCallItem).status == "success"
                         and any("PWNED" in m.content for m in chat(app).live.values()),
                         pilot=pilot, what="the tool result and the streamed answer")
        app.query_one(ToolCallItem).collapsed = False       # its result is shown
        await pilot.pause()
        assert_shown_safely(app)


async def test_a_passage() -> None:
    cites: list[dict[str, Any]] = [{"citation": "[rotation.txt §lines 1-3]", "doc_id": "d1", "name": "rotation.txt",
                                    "chunk_id": "c1", "location": {"lines": "1-3"}}]
    fake = FakeClient(messages={"s1": [ChatMessage(1, "user", "rotation?", stamp(1)),
                                       ChatMessage(2, "assistant", "seven [rotation.txt §lines 1-3]", stamp(2),
                                                   metadata={"citations": cites})]})
    fake.passages["c1"] = KbHit("d1", named("PASSAGENAME"), "c1", ATTACK, 1.0, {"lines": "1-3"}, named("GROUP"),
                                named("CITATION"))
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: len(chat(app).messages()) == 2, pilot=pilot, what="the history")
        chat(app).by_id[2].query_one(".citation").press()
        await wait_until(lambda: isinstance(app.screen, PassageModal) and bool(app.screen.query("#passage-text")),
                         pilot=pilot, what="the passage")
        await pilot.pause()
        assert_shown_safely(app, "PWNED-TITLE", "PASSAGENAME", "GROUP", "CITATION")


async def test_titles_names_and_a_stored_error() -> None:
    """The sidebar's titles, the header (the session's title and model), a stored answer's error
    line and finish reason, stored tool calls (name, status, arguments: JSON escapes C0 controls,
    not C1 ones; a result that only looks like JSON) and a citation's label."""
    cites = [{"citation": named("CITED"), "doc_id": "d1", "name": "n", "chunk_id": "c1"}]
    calls = (ToolCall("c1", named("TOOLNAME"), {"path": named("TOOLARG")}, "ok", "success", 0.01),
             ToolCall("c2", "read_file", {}, "{not json " + named("BADJSON"), named("TOOLSTATUS"), 0.01))
    stored = ChatMessage(2, "assistant", "Partly answered.", stamp(2), calls,
                         {"citations": cites, "partial": True, "finish_reason": named("FINISH"),
                          "error": "UPSTREAM", "error_message": named("ERRORLINE")})
    fake = FakeClient(sessions=[SessionInfo("s1", named("CURRENT"), stamp(0), stamp(9), model=named("MODEL")),
                                SessionInfo("s2", named("OTHER"), stamp(0), stamp(1))],
                      messages={"s1": [ChatMessage(1, "user", "rotation?", stamp(1)), stored]})
    async with scripted_app(fake, size=(110, 60)) as (app, pilot):
        await wait_until(lambda: len(chat(app).messages()) == 2
                         and app.query_one("#session-list", OptionList).option_count == 2,
                         pilot=pilot, what="the history and the sidebar")
        for item in app.query(ToolCallItem):
            item.collapsed = False                           # their arguments and results are shown
        await pilot.pause()
        assert_shown_safely(app, "CURRENT", "OTHER", "MODEL", "ERRORLINE", "FINISH", "TOOLNAME", "TOOLARG",
                            "TOOLSTATUS", "BADJSON", "CITED")


async def test_live_status_notices_errors_and_a_long_streamed_answer() -> None:
    """The turn status (an unknown one, a detail), a notice, an error frame, a streamed answer long
    enough that its first paragraph is frozen into a static segment (the rest of that batch and the
    next delta stay live), the turn's error, and a lost connection."""
    fake = FakeClient()
    first = ("Frozen paragraph " + named("FROZEN") + " " + "word " * (SEGMENT_CHARS // 5) + "\n\n"
             + "Rest " + named("REST") + " ")
    async with scripted_app(fake, size=(160, 40)) as (app, pilot):   # wide: the status line shows its detail whole
        status = app.query_one(StatusLine)
        await fake.push(TurnStart("s1", "t1", ChatMessage(1, "user", "rotation?", stamp(1)), "fake"),
                        TurnStatus("s1", "t1", named("TSTAGE")))
        await wait_until(lambda: status.turn_status not in (None, "thinking"), pilot=pilot, what="the turn status")
        await pilot.pause()
        assert_shown_safely(app, "tstage")   # an unknown status is shown capitalized (the rest lowercased)
        await fake.push(TurnStatus("s1", "t1", "tool_call", named("STATUS")))
        await wait_until(lambda: status.detail != "", pilot=pilot, what="the status detail")
        await pilot.pause()
        assert_shown_safely(app, "STATUS")
        await fake.push(Notice("warning", named("NCODE"), named("NOTICE")),
                        ServerError(ErrorReply(ErrorCode.INTERNAL, named("SERVERERR"))),
                        AnswerDelta("s1", "t1", first, 0))
        await wait_until(lambda: bool(chat(app).query(Segment)), pilot=pilot, what="the frozen segment")
        await fake.push(AnswerDelta("s1", "t1", "Live " + named("LIVE"), len(first)))
        await wait_until(lambda: any("LIVE" in m.content for m in chat(app).live.values()), pilot=pilot,
                         what="the live part")
        await pilot.pause()
        assert_shown_safely(app, "NCODE", "NOTICE", "SERVERERR", "FROZEN", "REST", "LIVE")
        app.clear_notifications()   # the toasts would cover the status line's connection state
        await fake.push(TurnError("s1", "t1", ErrorCode.LLM_ERROR, named("TURNERR")),
                        Disconnected(named("DCODE"), named("DISCONNECT")))
        await wait_until(lambda: len(chat(app).query(".error")) == 2, pilot=pilot, what="the errors")
        await pilot.pause()
        assert_shown_safely(app, "TURNERR", "DCODE", "DISCONNECT")


async def test_a_reattached_answer() -> None:
    """The answer so far of a turn running when the session is opened (the live Markdown's start)."""
    running = TurnState("t1", "s1", ChatMessage(1, "user", "rotation?", stamp(1)), "generating",
                        "So far " + named("SOFAR"), started_at=stamp(1))
    fake = FakeClient(running=running)
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: bool(chat(app).live), pilot=pilot, what="the running answer")
        await pilot.pause()
        assert_shown_safely(app, "SOFAR")


async def test_the_knowledge_memory_and_trash_panels() -> None:
    """Documents' names and collections, and the confirmation that quotes a name; remembered items
    (kind, text, id, the title of the session they were said in); deleted sessions' titles and
    previews."""
    fake = FakeClient(sessions=[SessionInfo("s1", named("SAIDIN"), stamp(0), stamp(1))])
    fake.documents = [KbDocument("d1", named("DOCNAME"), "m", "s", 10, 1, named("COLLECTION"), stamp(1), "u")]
    fake.memory = [MemoryItem(named("MEMID"), named("KIND"), named("MEMTEXT"), "s1", 1, stamp(1))]
    fake.trash["s9"] = SessionInfo("s9", named("TRASHED"), stamp(0), stamp(1), 2, named("PREVIEW"))
    async with scripted_app(fake, size=(160, 40)) as (app, pilot):
        await pilot.press("f12")
        await wait_until(lambda: shown(app, KnowledgeScreen) and app.screen.loaded, pilot=pilot, what="the panel")
        await pilot.pause()
        assert_shown_safely(app, "DOCNAME", "COLLECTION")
        app.screen.action_delete()
        await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot, what="the confirmation")
        await pilot.pause()
        assert_shown_safely(app, "DOCNAME")
        await pilot.press("n")
        await pilot.press("escape")
        await wait_until(lambda: not app.screen.is_modal, pilot=pilot, what="the panel closed")
        await pilot.press("f7")
        await wait_until(lambda: shown(app, MemoryPanel) and bool(app.screen.items), pilot=pilot, what="the memory")
        await pilot.pause()
        assert_shown_safely(app, "MEMID", "KIND", "MEMTEXT", "SAIDIN")
        await pilot.press("escape")
        await wait_until(lambda: not app.screen.is_modal, pilot=pilot, what="the memory panel closed")
        await pilot.press("f10")
        await wait_until(lambda: shown(app, TrashScreen) and app.screen.loaded, pilot=pilot, what="the trash")
        await pilot.pause()
        assert_shown_safely(app, "TRASHED", "PREVIEW")


class Refusing(FakeClient):
    """A server whose errors quote controls: listing the documents, the memory and the trash, forgetting
    and searching fail."""

    async def request(self, msg_type: MsgType, body: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        if msg_type == MsgType.KB_LIST:
            raise ClientError(ErrorCode.INTERNAL, named("LISTERR"))
        return await super().request(msg_type, body, timeout)

    async def memory_list(self) -> MemoryListReply:
        if not self.memory:
            raise ClientError(ErrorCode.INTERNAL, named("MEMERR"))
        return await super().memory_list()

    async def memory_forget(self, item_id: str) -> MemoryForgetReply:
        raise ClientError(ErrorCode.INTERNAL, named("FORGETERR"))

    async def session_list(self, before: str | None = None, limit: int | None = None,
                           deleted: bool | None = None) -> SessionListReply:
        if deleted:
            raise ClientError(ErrorCode.INTERNAL, named("TRASHERR"))
        return await super().session_list(before, limit, deleted)

    async def search(self, query: str, session_id: str | None = None, limit: int | None = None) -> HistorySearchReply:
        raise ClientError(ErrorCode.INTERNAL, named("SEARCHERR"))


async def test_the_errors_the_panels_show() -> None:
    fake = Refusing()
    async with scripted_app(fake, size=(160, 40)) as (app, pilot):
        for key, screen, what in (("f12", KnowledgeScreen, "LISTERR"), ("f7", MemoryPanel, "MEMERR"),
                                  ("f10", TrashScreen, "TRASHERR")):
            await pilot.press(key)
            await wait_until(lambda: shown(app, screen) and what in terminal_output(app), pilot=pilot, what=what)
            assert_shown_safely(app, what)
            await pilot.press("escape")
            await wait_until(lambda: not app.screen.is_modal, pilot=pilot, what=f"{what}: the panel closed")
        await pilot.press("ctrl+f")
        await wait_until(lambda: shown(app, SearchModal), pilot=pilot, what="the search")
        await pilot.press(*"seven", "enter")
        await wait_until(lambda: "SEARCHERR" in terminal_output(app), pilot=pilot, what="the search's error")
        assert_shown_safely(app, "SEARCHERR")
        await pilot.press("escape")
        await wait_until(lambda: not app.screen.is_modal, pilot=pilot, what="the search closed")
        fake.memory = [MemoryItem("m1", "fact", "The prod DB host is db-prod-42.", "s1", 1, stamp(1))]
        await pilot.press("f7")
        await wait_until(lambda: shown(app, MemoryPanel) and bool(app.screen.items), pilot=pilot, what="the memory")
        await pilot.press("delete")
        await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot, what="the confirmation")
        await pilot.press("y")
        await wait_until(lambda: "FORGETERR" in terminal_output(app), pilot=pilot, what="the forget error")
        assert_shown_safely(app, "FORGETERR")


async def test_an_upload_s_stages_and_refusal(tmp_path: Path) -> None:
    """The stage the server reports for an upload, and the reason it refuses it."""
    note = tmp_path / "note.md"
    note.write_text("# A note\n", encoding="utf-8")
    reported, refuse = asyncio.Event(), asyncio.Event()

    async def upload(path: Path, progress: Callable[[str, int, int], None]) -> KbDocument:
        progress(named("STAGE"), 0, 1)
        reported.set()
        await refuse.wait()
        raise ClientError(ErrorCode.UNSUPPORTED_MEDIA, named("REFUSED"))

    async def listing() -> list[KbDocument]:
        return []
    panel = KnowledgeScreen(KnowledgeOps(listing, upload, upload, upload, tmp_path))   # type: ignore[arg-type]
    app: App[None] = App()
    async with app.run_test(size=(160, 40)) as pilot:
        await app.push_screen(panel)
        await wait_until(lambda: panel.loaded, pilot=pilot, what="the panel")
        panel.query_one("#kb-path", Input).value = str(note)
        panel.query_one("#kb-path", Input).focus()
        await pilot.press("enter")
        await wait_until(lambda: reported.is_set() and "STAGE" in terminal_output(app), pilot=pilot,
                         what="the stage")
        assert_shown_safely(app, "STAGE")
        refuse.set()
        await wait_until(lambda: "REFUSED" in terminal_output(app), pilot=pilot, what="the refusal")
        assert_shown_safely(app, "REFUSED")


async def test_search_why_rename_and_the_model_palette() -> None:
    """Search hits (title, role, snippet), the "why this answer" view, the rename and clear dialogs
    (the session's title), and the models the palette offers."""
    context = {"turns_kept": 1, "pipeline": {"route": {"decision": "chat", "reason": named("WHY")}}}
    fake = FakeClient(sessions=[SessionInfo("s1", named("TITLE"), stamp(0), stamp(1))],
                      messages={"s1": [ChatMessage(1, "user", "rotation?", stamp(1)),
                                       ChatMessage(2, "assistant", "seven " + named("SNIPPET"), stamp(2),
                                                   metadata={"context": context})]})

    async def model_list(session_id: str | None = None) -> ModelListReply:
        return ModelListReply((ModelInfo("fake", True, True), ModelInfo(named("MODELNAME"))), "fake")

    async def search(query: str, session_id: str | None = None, limit: int | None = None) -> HistorySearchReply:
        return HistorySearchReply((SearchHit("s1", named("TITLE"), 2, named("ROLE"), "seven " + named("SNIPPET")),))
    fake.model_list = model_list  # type: ignore[method-assign]
    fake.search = search  # type: ignore[method-assign]
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: len(chat(app).messages()) == 2, pilot=pilot, what="the history")
        await pilot.press("ctrl+f")
        await wait_until(lambda: shown(app, SearchModal), pilot=pilot, what="the search")
        await pilot.press(*"seven", "enter")
        await wait_until(lambda: bool(app.screen.hits), pilot=pilot, what="the hit")
        await pilot.pause()
        assert_shown_safely(app, "TITLE", "ROLE", "SNIPPET")
        await pilot.press("escape")
        await wait_until(lambda: not app.screen.is_modal, pilot=pilot, what="the search closed")
        await pilot.press("f6")
        await wait_until(lambda: shown(app, WhyScreen), pilot=pilot, what="the why view")
        await pilot.pause()
        assert_shown_safely(app, "WHY")
        await pilot.press("escape")
        await wait_until(lambda: not app.screen.is_modal, pilot=pilot, what="the why view closed")
        await pilot.press("f2")
        await wait_until(lambda: shown(app, RenameModal), pilot=pilot, what="the rename dialog")
        await pilot.pause()
        assert_shown_safely(app, "TITLE")
        await pilot.press("escape")
        await wait_until(lambda: not app.screen.is_modal, pilot=pilot, what="the rename dialog closed")
        await pilot.press("f9")
        await wait_until(lambda: shown(app, ClearModal), pilot=pilot, what="the clear dialog")
        await pilot.pause()
        assert_shown_safely(app, "TITLE")
        await pilot.press("escape")
        await wait_until(lambda: not app.screen.is_modal, pilot=pilot, what="the clear dialog closed")
        await pilot.press("ctrl+p")
        await wait_until(lambda: shown(app, CommandPalette), pilot=pilot, what="the palette")
        await pilot.press(*"model")
        await wait_until(lambda: "MODELNAME" in terminal_output(app), pilot=pilot, what="the model offered")
        assert_shown_safely(app, "MODELNAME")


async def test_a_notification_quoting_the_server_is_plain_text_not_markup() -> None:
    """A document name or an error such as "[@click=app.quit]x[/]" would make a clickable action (or
    eat the text) if the toast read it as markup."""
    fake = FakeClient()
    async with scripted_app(fake, size=(120, 30)) as (app, pilot):
        app.notify("Deleted [@click=app.quit]MARKUPNAME[/] and [b]BOLDNAME[/b]")
        await wait_until(lambda: "MARKUPNAME" in terminal_output(app), pilot=pilot, what="the toast")
        screen = terminal_output(app)
        assert "[@click=app.quit]MARKUPNAME[/]" in screen and "[b]BOLDNAME[/b]" in screen


async def test_names_the_server_sends_are_not_read_as_markup() -> None:
    """A citation, a passage's title and a document's name or collection holding "[b]...[/b]" (or a
    "[@click=...]" action) are shown as written, in buttons, labels and table cells alike."""
    cite = "[b]CITEMARK[/b] §lines 1-3"
    cites: list[dict[str, Any]] = [{"citation": cite, "doc_id": "d1", "name": "r.txt", "chunk_id": "c1",
                                    "location": {"lines": "1-3"}}]
    fake = FakeClient(messages={"s1": [ChatMessage(1, "user", "rotation?", stamp(1)),
                                       ChatMessage(2, "assistant", "seven", stamp(2), metadata={"citations": cites})]})
    fake.passages["c1"] = KbHit("d1", "r.txt", "c1", "text", 1.0, {"lines": "1-3"}, "personal", "[b]TITLEMARK[/b]")
    fake.documents = [KbDocument("d1", "[b]DOCMARK[/b].txt", "m", "s", 10, 1, "[i]COLLMARK[/i]", stamp(1), "u")]
    async with scripted_app(fake, size=(160, 40)) as (app, pilot):
        await wait_until(lambda: "CITEMARK" in terminal_output(app), pilot=pilot, what="the citation button")
        assert "[b]CITEMARK[/b]" in terminal_output(app)
        chat(app).by_id[2].query_one(".citation").press()
        await wait_until(lambda: isinstance(app.screen, PassageModal) and "TITLEMARK" in terminal_output(app),
                         pilot=pilot, what="the passage")
        assert "[b]TITLEMARK[/b]" in terminal_output(app)
        await pilot.press("escape")
        await wait_until(lambda: not app.screen.is_modal, pilot=pilot, what="the passage closed")
        await pilot.press("f12")
        await wait_until(lambda: shown(app, KnowledgeScreen) and app.screen.loaded, pilot=pilot, what="the panel")
        await pilot.pause()
        screen = terminal_output(app)
        assert "[b]DOCMARK[/b].txt" in screen and "[i]COLLMARK[/i]" in screen
