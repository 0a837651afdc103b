"""Review s34 of the TUI's editors, against real servers where the wire matters: the edit (F5) and
system-prompt (Ctrl+O) dialogs show stored control characters (ESC sequences, OSC, bidi) as
escapes, never write them to the terminal, and keep them on save where they were left untouched;
a system prompt over MAX_PROMPT_CHARS is refused in the editor (the text stays), and one the
server refuses opens the editor again with the text."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from textual.widgets import TextArea

from client.connection import Client
from client.errors import ClientCode, ClientError
from client.tui.editor import CONTROLS_NOTE, TextEditModal, restored
from client.wording import CONTROLS, printable
from client_testlib import chat, open_app, shown, type_and_send, v3_server, wait_until
from fake_client import FakeClient
from protocol.messages import MAX_PROMPT_CHARS
from testkit.echo_agent import EchoAgent
from tui_script import notes, scripted_app

EVIL = "keep \x1b]0;pwned\x07 the \x1b[8mhidden\x1b[0m text \u202eevil\u202c and \x9b2J end"


def no_controls(text: str) -> bool:
    return not any(ord(c) in CONTROLS for c in text)


def test_restored_keeps_untouched_controls_and_typed_text() -> None:
    shown_text = printable(EVIL)
    assert restored(EVIL, shown_text) == EVIL
    assert restored(EVIL, shown_text.replace("evil", "good")) == EVIL.replace("evil", "good")
    assert restored(EVIL, "X" + shown_text + "Y") == "X" + EVIL + "Y"
    # an escape the user broke, or typed, stays as its visible text: nothing is lost, nothing is run
    broken = shown_text.replace("\\u001b[8m", "\\u01b[8m")
    assert restored(EVIL, broken) == EVIL.replace("\x1b[8m", "\\u01b[8m")
    typed = restored("plain", "plain \\u001b")
    assert typed == "plain \\u001b"
    assert restored("plain", "other") == "other"


async def test_the_prompt_editor_shows_controls_as_escapes_and_keeps_them() -> None:
    fake = FakeClient()
    sid = "s1"
    fake.prompts[sid] = EVIL
    async with scripted_app(fake) as (app, pilot):
        await pilot.press("ctrl+o")
        await wait_until(lambda: shown(app, TextEditModal), pilot=pilot, what="the prompt editor")
        area = app.screen.query_one("#editor-text", TextArea)
        assert no_controls(area.text) and area.text == printable(EVIL)
        assert all(no_controls(area.get_line(i).plain) for i in range(area.document.line_count))
        assert CONTROLS_NOTE in str(app.screen.query_one(".dialog-note").render())
        area.load_text(area.text.replace("evil", "good"))
        await pilot.press("ctrl+s")
        await wait_until(lambda: fake.prompts.get(sid) == EVIL.replace("evil", "good"), pilot=pilot,
                         what="the saved prompt, its controls kept")


async def test_edit_and_resend_shows_controls_as_escapes_and_sends_them_back(tmp_path: Path) -> None:
    async with v3_server(tmp_path / "srv", agent=EchoAgent()) as (_, addr), open_app(addr) as (app, pilot):
        await type_and_send(pilot, EVIL)
        await wait_until(lambda: len(chat(app).messages()) >= 2 and not chat(app).live, pilot=pilot,
                         what="the answer")
        await pilot.press("f5")
        await wait_until(lambda: shown(app, TextEditModal), pilot=pilot, what="the edit dialog")
        area = app.screen.query_one("#editor-text", TextArea)
        assert no_controls(area.text) and area.text == printable(EVIL)
        area.load_text(area.text.replace("end", "the end"))
        await pilot.press("ctrl+s")
        want = EVIL.replace("end", "the end")
        await wait_until(lambda: any(m.role == "user" and m.content == want for m in chat(app).messages()),
                         pilot=pilot, what="the edited message, its controls kept")
        async with Client(*addr) as c:     # what the server stored
            page = await c.history_page(session_id=chat(app).session_id)
            assert [m.content for m in page.messages if m.role == "user"][-1] == want


async def test_a_prompt_over_the_limit_stays_in_the_editor(tmp_path: Path) -> None:
    long = "You are a careful SRE. " * 1100          # 25,300 characters
    async with v3_server(tmp_path / "srv") as (_, addr), open_app(addr) as (app, pilot):
        await pilot.press("ctrl+o")
        await wait_until(lambda: shown(app, TextEditModal), pilot=pilot, what="the prompt editor")
        app.screen.query_one("#editor-text", TextArea).load_text(long)
        await pilot.press("ctrl+s")
        limit = f"the server takes at most {MAX_PROMPT_CHARS:,}"
        await wait_until(lambda: any(limit in n for n in notes(app)), pilot=pilot, what="the refusal")
        assert shown(app, TextEditModal) and app.screen.query_one("#editor-text", TextArea).text == long
        assert not any("INVALID_MESSAGE" in n or "expected" in n for n in notes(app))
        async with Client(*addr) as c:
            assert not (await c.session_prompt(session_id=chat(app).session_id)).system_prompt


async def test_a_prompt_the_server_refuses_opens_the_editor_again() -> None:
    fake = FakeClient()
    refused: list[Any] = []

    async def refuse(system_prompt: str | None = None, session_id: str | None = None) -> Any:
        if system_prompt is None:
            return await FakeClient.session_prompt(fake, None, session_id)
        refused.append(system_prompt)
        raise ClientError(ClientCode.CONNECTION_LOST, "the connection was lost")
    fake.session_prompt = refuse  # type: ignore[method-assign]
    async with scripted_app(fake) as (app, pilot):
        await pilot.press("ctrl+o")
        await wait_until(lambda: shown(app, TextEditModal), pilot=pilot, what="the prompt editor")
        app.screen.query_one("#editor-text", TextArea).load_text("Answer in French.")
        await pilot.press("ctrl+s")
        await wait_until(lambda: refused == ["Answer in French."] and shown(app, TextEditModal)
                         and app.screen.query_one("#editor-text", TextArea).text == "Answer in French.",
                         pilot=pilot, what="the editor again, with the text")
        assert any("the connection was lost" in n for n in notes(app))


async def test_a_prompt_is_saved_to_the_session_the_editor_was_opened_on() -> None:
    """Before, the prompt went to whichever session was current when Ctrl+S was pressed (the current one can
    change under the editor: another client deleting it moves the view to the user's newest session)."""
    fake = FakeClient()
    saved: list[tuple[str | None, str | None]] = []

    async def record(system_prompt: str | None = None, session_id: str | None = None) -> Any:
        if system_prompt is not None:
            saved.append((system_prompt, session_id))
        return await FakeClient.session_prompt(fake, system_prompt, session_id)
    fake.session_prompt = record  # type: ignore[method-assign]
    async with scripted_app(fake) as (app, pilot):
        opened_on = app.controller.session_id
        await pilot.press("ctrl+o")
        await wait_until(lambda: shown(app, TextEditModal), pilot=pilot, what="the prompt editor")
        state = app.controller.state                                  # the current session changes meanwhile
        state.session = dataclasses.replace(state.session, session_id="s_20260101_another000000")
        app.screen.query_one("#editor-text", TextArea).load_text("Answer in French.")
        await pilot.press("ctrl+s")
        await wait_until(lambda: bool(saved), pilot=pilot, what="the prompt saved")
        assert saved == [("Answer in French.", opened_on)]
